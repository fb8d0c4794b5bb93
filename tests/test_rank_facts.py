"""The rank facts' shortcut (``distify.rank._mentions``, kept per node object) answers the same as
the walks it spares, whatever set of rank names or calls a later question brings."""

import libcst as cst

from distify.rank import rank_dependent, reads_rank


def test_same_expression_asked_again_with_more_rank_names():
    # the rank flow's fixed point asks one expression again as its set of rank names grows: the
    # cached mentions must not freeze the first answer
    expr = cst.parse_expression("cfg.gpu_id * 2 + offset")
    assert not reads_rank(expr, frozenset({"other"}))
    assert reads_rank(expr, frozenset({"cfg.gpu_id"}))
    assert not rank_dependent(expr, frozenset())
    assert rank_dependent(expr, frozenset({"offset"}))


def test_rank_calls_and_environment_strings_still_count():
    expr = cst.parse_expression("int(os.environ['LOCAL_RANK']) + f()")
    call = expr.right
    assert reads_rank(expr)  # the environment variable, with no rank name or call known
    assert not rank_dependent(expr)
    assert rank_dependent(expr, rank_calls=frozenset({id(call)}))


def test_a_comparison_with_minus_one_stays_rank_independent():
    expr = cst.parse_expression("local_rank != -1")
    assert not rank_dependent(expr, frozenset({"local_rank"}))
    assert rank_dependent(cst.parse_expression("local_rank == 0"), frozenset({"local_rank"}))
