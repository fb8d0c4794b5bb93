"""Which values depend on the process's rank: reads of the launcher's rank variables, rank calls of
torch.distributed, Horovod and distify's runtime, and the branches they select (part of the fact
layer, see facts.py).
"""

from __future__ import annotations

from typing import FrozenSet, List, Optional, Tuple

import libcst as cst

from distify.walk import walk
from distify.syntax import all_nodes, by_node, contains_node, dotted


# ------------------------------------------------------------------------------ rank conditions

def rank_dependent(
    test: cst.BaseExpression, rank_names: FrozenSet[str] = frozenset(), rank_calls: FrozenSet[int] = frozenset()
) -> bool:
    """True when a condition reads the rank (or asks "am I the main process?"): the one notion of a
    rank condition every rule and check uses (through ``Facts.rank_condition``, which knows the
    names the script binds to a rank, ``self.gpu_id = int(os.environ["LOCAL_RANK"])``, and the calls
    whose value is one, ``dist.get_rank()``: see ``distify.rank_flow``).

    Comparisons of a rank with -1 alone (``local_rank != -1``) are skipped: they tell a
    distributed launch from a plain one and are equal on every rank."""
    words, calls, env = _mentions(test)
    if not env and words.isdisjoint(rank_names) and calls.isdisjoint(rank_calls):
        return False  # nothing in it could be a hit: no walk
    hits: List[str] = []

    def rank_value(node: cst.BaseExpression) -> bool:
        while isinstance(node, cst.Call) and dotted(node.func) in VALUE_CALLS and node.args and id(node) not in rank_calls:
            node = node.args[0].value  # int(os.environ.get("RANK", -1))
        return id(node) in rank_calls or dotted(node) in rank_names or _env_read(node)

    class V(cst.CSTVisitor):
        def visit_Comparison(self, node: cst.Comparison) -> Optional[bool]:
            if rank_value(node.left) and all(
                isinstance(t.operator, (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)) and _is_minus_one(t.comparator)
                for t in node.comparisons
            ):
                return False  # `rank != -1`: do not look inside
            return True

        def visit_Subscript(self, node: cst.Subscript) -> None:
            if _env_read(node):
                hits.append("environ")  # os.environ["RANK"] read inline (not `"RANK" in os.environ`)

        def visit_Name(self, node: cst.Name) -> None:
            if node.value in rank_names:
                hits.append(node.value)

        def visit_Call(self, node: cst.Call) -> None:
            if id(node) in rank_calls:
                hits.append(dotted(node.func) or "")

        def visit_Attribute(self, node: cst.Attribute) -> Optional[bool]:
            if rank_names and dotted(node) in rank_names:
                hits.append(dotted(node))
                return False
            return True

    walk(test, V())
    return bool(hits)


# environment variables that hold a rank (torchrun, horovodrun, Open MPI, SLURM)
RANK_ENV = frozenset({
    "RANK", "LOCAL_RANK", "HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID", "PMI_RANK",
})


def reads_rank(expr: cst.CSTNode, rank_names: FrozenSet[str] = frozenset(), rank_calls: FrozenSet[int] = frozenset()) -> bool:
    """The expression's value differs between ranks: it reads a rank (a rank call or name, a name
    bound to one, or a rank environment variable such as ``os.environ["LOCAL_RANK"]``). A
    comparison with -1 (``int(os.environ.get("RANK", -1)) != -1``: launched distributed or not) is
    the same on every rank."""
    words, calls, env = _mentions(expr)
    if not env and words.isdisjoint(rank_names) and calls.isdisjoint(rank_calls):
        return False  # nothing in it could be a hit: no walk
    if rank_dependent(expr, rank_names, rank_calls):
        return True
    hits: List[str] = []

    class V(cst.CSTVisitor):
        def visit_Comparison(self, node: cst.Comparison) -> bool:
            return not all(
                isinstance(t.operator, (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)) and _is_minus_one(t.comparator)
                for t in node.comparisons
            )

        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            try:
                value = node.evaluated_value
            except Exception:  # noqa: BLE001 - an odd literal is no rank variable
                return
            if isinstance(value, str) and value in RANK_ENV:
                hits.append(value)

    walk(expr, V())
    return bool(hits)


@by_node
def _mentions(expr: cst.CSTNode) -> Tuple[FrozenSet[str], FrozenSet[int], bool]:
    """Everything the walks of ``rank_dependent`` and ``reads_rank`` could count as a hit in `expr`,
    pruning aside: the names and dotted attributes it holds, the ids of its calls, and whether one of
    its strings is a rank environment variable. Kept per node object, so that the rank flow's fixed
    point, which asks the same expressions again with a growing set of names, walks each once."""
    words, calls, env = set(), set(), False
    for n in all_nodes(expr):
        if isinstance(n, cst.Name):
            words.add(n.value)
        elif isinstance(n, cst.Attribute):
            d = dotted(n)
            if d is not None:
                words.add(d)
        elif isinstance(n, cst.Call):
            calls.add(id(n))
        elif isinstance(n, cst.SimpleString) and not env:
            try:
                value = n.evaluated_value
            except Exception:  # noqa: BLE001 - an odd literal is no rank variable
                continue
            env = isinstance(value, str) and value in RANK_ENV
    return frozenset(words), frozenset(calls), env


def _env_read(node: cst.CSTNode) -> bool:
    """`<mapping>["RANK"]`: a read of a rank environment variable by its key (the launcher's
    variables, RANK_ENV: library knowledge). A membership test (`"RANK" in os.environ`: launched or
    not, the same on every rank) is no read; `.get` / `getenv` calls are rank calls of the flow."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return False
    key = node.slice[0].slice.value
    return isinstance(key, cst.SimpleString) and key.evaluated_value in RANK_ENV


# calls whose value is a number or flag made from their arguments: `int(os.environ["RANK"])`
VALUE_CALLS = frozenset({"int", "str", "float", "bool", "min", "max", "abs", "round", "os.environ.get", "os.getenv"})


def _rank_value_part(expr: cst.BaseExpression, rank_calls: FrozenSet[int] = frozenset()) -> Optional[cst.BaseExpression]:
    """`expr` when its value can be a rank or a flag derived from one (names, arithmetic,
    comparisons, rank calls, `int(...)` of those), None when it is an object built by a call
    that merely takes a rank argument (`DistributedSampler(ds, rank=r)`, `DDP(m, [local_rank])`)."""
    for n in all_nodes(expr):
        if isinstance(n, cst.Call):
            d = dotted(n.func) or ""
            if d in VALUE_CALLS or id(n) in rank_calls or d.endswith(("environ.get", "getenv")):
                continue
            if n.args:
                return None
    return expr


def _is_minus_one(expr: cst.BaseExpression) -> bool:
    return (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
        and expr.expression.value == "1"
    )


def branch_of(node: cst.If, target: cst.CSTNode) -> Optional[str]:
    """Which branch of `node` holds `target`: "body", "orelse" (else or elif) or None (the test)."""
    if contains_node(node.body, target):
        return "body"
    if node.orelse is not None and contains_node(node.orelse, target):
        return "orelse"
    return None


def follows_barrier(container: cst.CSTNode, stmt: cst.CSTNode) -> bool:
    """True when the statement just before `stmt` in its block (found under `container`) is a
    barrier call (``dist.barrier()``, ``runtime.barrier()``): distify's own output, a second run."""
    found = []

    class V(cst.CSTVisitor):
        def _check(self, body) -> None:
            for i, s in enumerate(body):
                if s is stmt and i > 0:
                    prev = body[i - 1]
                    if isinstance(prev, cst.SimpleStatementLine) and len(prev.body) == 1:
                        e = prev.body[0]
                        if (
                            isinstance(e, cst.Expr)
                            and isinstance(e.value, cst.Call)
                            and isinstance(e.value.func, cst.Attribute)
                            and e.value.func.attr.value == "barrier"
                        ):
                            found.append(prev)

        def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
            self._check(node.body)

        def visit_Module(self, node: cst.Module) -> None:
            self._check(node.body)

    walk(container, V())
    return bool(found)
