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
    expr = cst.parse_expression("int(os.environ.get('LOCAL_RANK')) + f()")
    call = expr.right
    assert reads_rank(expr)  # the environment variable, with no rank name or call known
    assert not rank_dependent(expr)  # the .get is a rank call only once the flow says so (rank_flow)
    assert rank_dependent(cst.parse_expression("int(os.environ['LOCAL_RANK']) + f()"))  # read by its key
    assert rank_dependent(expr, rank_calls=frozenset({id(call)}))


def test_a_comparison_with_minus_one_stays_rank_independent():
    expr = cst.parse_expression("local_rank != -1")
    assert not rank_dependent(expr, frozenset({"local_rank"}))
    assert rank_dependent(cst.parse_expression("local_rank == 0"), frozenset({"local_rank"}))


INLINE_TESTS = '''import os
from os import environ as env, getenv
rank = int(os.environ.get("RANK", 0))
if int(os.environ.get("RANK", 0)) == 0:
    pass
if os.environ["RANK"] == "0":
    pass
if int(env["LOCAL_RANK"]) == 0:
    pass
if getenv("HOROVOD_RANK") == "0":
    pass
if rank == 0:
    pass
if "LOCAL_RANK" in os.environ:
    pass
if int(os.environ.get("RANK", -1)) != -1:
    pass
if os.environ.get("MASTER_ADDR") == "x":
    pass
'''


def test_a_rank_read_inline_in_a_condition_is_a_rank_condition():
    """`if int(os.environ.get("RANK", 0)) == 0:` differs by rank as much as the same test through a
    name bound to it (`rank = ...; if rank == 0:`), which was the only form recognised: loads and
    stops under the inline form were taken for code every rank runs. The `.get`/`getenv` reads are
    found through the imports (`from os import getenv`); a membership test (launched or not) and a
    comparison with -1 stay the same on every rank. Control: with the inline reads not counted,
    the first four tests read as rank-independent."""
    from distify.anatomy import analyse

    m = cst.parse_module(INLINE_TESTS)
    a = analyse(m)
    got = [a.facts.rank_condition(s.test) for s in m.body if isinstance(s, cst.If)]
    assert got == [True, True, True, True, True, False, False, False]
