"""What a loop over batches adds up: the sums a metric is made of.

A counter bound to a number literal before a loop and only added to inside it (``correct +=
(pred == y).sum().item()``) is one of two kinds, by what each batch adds:

- a *per-sample sum* (``sample``): one term per sample of the batch (``.sum()``, a count of the
  batch ``y.size(0)``, a batch mean times the batch size, a criterion built with
  ``reduction="sum"``). Over shards of the data, the whole set's sum is the sum over the ranks.
- a *per-batch mean* (``batch``): a loss that averages over its batch (a loss of
  ``distify.library.MEAN_LOSSES`` without ``reduction=``, or with ``"mean"``), read as a number.
  With every rank running as many batches as the others, the single process's sum of batch means
  at N times the batch is the mean over the ranks of their sums.

A counter may also start from a tensor of zeros (``correct = torch.zeros(())``: the calls of
``distify.library.ZERO_TENSORS`` and ``NUMBER_TENSORS``), for the training sums, and a dict
literal of such starts may hold several (``stats = {"loss": 0.0, "correct": 0}`` ...
``stats["correct"] += ...``: ``dict_sums``, entry by entry).

Anything else is neither, and a rule that reduces metrics leaves it alone. The evaluation plans
(``distify.rules.eval_plan``, DST203) and the training sums (DST206) ask these facts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Dict, List, Optional, Set, Tuple, Union

import libcst as cst

from distify.library import MEAN_LOSSES, NUMBER_TENSORS, TENSOR_MOVES, ZERO_TENSORS
from distify.records import assigned_name
from distify.syntax import _number, all_nodes, arg, dotted, header_names, names, sole_statement
from distify.values import Record

if TYPE_CHECKING:  # pragma: no cover
    from distify.anatomy import Anatomy
    from distify.records import BatchLoop, Loader

Scope = Union[cst.Module, cst.FunctionDef]

# method calls that only convert a value: `x.sum().item()` is as much a sum as `x.sum()`
CONVERSIONS = {"item", "cpu", "detach", "float", "double", "long", "int", "clone", "to", "numpy"}
COLLECTIVES = ("torch.distributed", "horovod", "distify")


class LoopSum(Record):
    """A sum a loop over batches adds up: per sample or of batch means (``kind``)."""

    __slots__ = ("name", "node", "kind", "__dict__")
    name: str
    node: cst.AugAssign  # the first addition in the loop
    kind: str  # sample | batch | unknown (training_sums)

    def __init__(self, name: str, node: cst.AugAssign, kind: str) -> None:
        self._set(name, node, kind)

    @property
    def holder(self) -> str:
        """The variable that holds the sum (an ``EntrySum``'s is its dict)."""
        return self.name


def loop_locals(loop: cst.For) -> Set[str]:
    """Names the loop binds afresh in each batch (its target and every plain assignment)."""
    local = {n.value for n, how in names(loop.target, "store") if how == "store"}
    for n, how in names(loop.body):
        if how == "store":
            local.add(n.value)
    return local


def sample_sum(a: "Anatomy", e: cst.BaseExpression, local: Set[str]) -> bool:
    """True for expressions that add up one term per sample of the batch."""
    if isinstance(e, cst.Call):
        func = e.func
        if isinstance(func, cst.Attribute) and func.attr.value in CONVERSIONS:
            return sample_sum(a, func.value, local)
        if isinstance(func, cst.Name) and func.value in ("float", "int") and len(e.args) == 1:
            return sample_sum(a, e.args[0].value, local)
        if isinstance(func, cst.Attribute) and func.attr.value in ("sum", "count_nonzero"):
            return True
        if a.qualname(func) in ("torch.sum", "torch.count_nonzero", "numpy.sum", "numpy.count_nonzero"):
            return True
        if sum_reduction(e) or _sum_criterion(a, func):
            return True
        return count(e, local)
    if isinstance(e, cst.Subscript):
        return count(e, local)
    if isinstance(e, cst.BinaryOperation):
        if isinstance(e.operator, (cst.Add, cst.Subtract)):
            return sample_sum(a, e.left, local) and sample_sum(a, e.right, local)
        if isinstance(e.operator, cst.Multiply):
            # a batch mean times the batch size is a batch sum
            return any(sample_sum(a, s, local) or count(s, local) for s in (e.left, e.right))
    return False


def _converted(a: "Anatomy", e: cst.BaseExpression) -> cst.BaseExpression:
    """`e` without the calls that only convert it (`loss.item()`, `float(loss)`: `loss`)."""
    while isinstance(e, cst.Call):
        func = e.func
        if isinstance(func, cst.Attribute) and func.attr.value in CONVERSIONS and not e.args:
            e = func.value
        elif isinstance(func, cst.Name) and func.value == "float" and len(e.args) == 1 and a.qualname(func) in (None, "builtins.float"):
            e = e.args[0].value
        else:
            break
    return e


def bound_sample_sum(a: "Anatomy", e: cst.BaseExpression, loop: cst.For, local: Set[str]) -> bool:
    """`loss.item()` where the loop bound `loss` once to a per-sample sum (a criterion built with
    ``reduction="sum"``)."""
    e = _converted(a, e)
    if not isinstance(e, cst.Name):
        return False
    values = _loop_assigned(loop, e.value)
    return len(values) == 1 and values[0] is not None and sample_sum(a, values[0], local)


def batch_mean(a: "Anatomy", e: cst.BaseExpression, loop: cst.For, scope: Scope) -> bool:
    """True for a number that is a loss averaged over this batch: `loss.item()` where the loop bound
    `loss = criterion(out, y)` once, `criterion` a mean loss of the library (or a call of one)."""
    e = _converted(a, e)
    if isinstance(e, cst.Call):
        return _mean_loss(a, e, scope)
    if not isinstance(e, cst.Name):
        return False
    values = _loop_assigned(loop, e.value)
    return len(values) == 1 and isinstance(values[0], cst.Call) and _mean_loss(a, values[0], scope)


def _mean_loss(a: "Anatomy", call: cst.Call, scope: Scope, depth: int = 0) -> bool:
    """A call of a mean loss: `F.cross_entropy(out, y)`, or `criterion(out, y)` of a name bound to
    `nn.CrossEntropyLoss()` without another reduction (followed through parameters to the callers),
    or a call of the script's own function every return of which is one (`compute_loss(model,
    batch)` ending in ``return loss``)."""
    q = a.qualname(call.func)
    if q in MEAN_LOSSES:
        return _reduction_mean(call)
    fn = a.facts.callee(call, scope)
    if fn is not None:
        return fn is not scope and depth < 3 and _returns_mean_loss(a, fn, depth + 1)
    return isinstance(call.func, cst.Name) and _mean_loss_name(a, call.func.value, scope, 0)


def _returns_mean_loss(a: "Anatomy", fn: cst.FunctionDef, depth: int) -> bool:
    """Every ``return`` of `fn` hands back a mean loss: a call of one, or a name the function binds
    once, to one (``loss = F.cross_entropy(out, y)``; ``return loss`` or ``return loss.item()``)."""
    returns = [n for n in all_nodes(fn.body, skip_nested=True) if isinstance(n, cst.Return)]
    if not returns:
        return False
    for r in returns:
        e = _converted(a, r.value) if r.value is not None else None
        if isinstance(e, cst.Name):
            values = _loop_assigned(fn, e.value)
            e = values[0] if len(values) == 1 else None
        if not (isinstance(e, cst.Call) and _mean_loss(a, e, fn, depth)):
            return False
    return True


def _mean_loss_name(a: "Anatomy", name: str, scope: Scope, depth: int) -> bool:
    """`name`, read in `scope`, holds a mean loss on every path distify can see."""
    if depth > 4:
        return False
    binds = a.bindings(scope).get(name, [])
    if isinstance(scope, cst.FunctionDef) and name in a.facts.params(scope):
        if binds:
            return False  # rebound inside the function
        sites = a.callers(scope)
        for site in sites:
            value = a.bound_value(site.call, scope, name)
            if value is None:
                return False
            if isinstance(value, cst.Call):
                if not _mean_loss_built(a, value):
                    return False
            elif not (isinstance(value, cst.Name) and _mean_loss_name(a, value.value, site.scope, depth + 1)):
                return False
        return bool(sites)
    for where in (scope, a.module):
        binds = a.bindings(where).get(name, [])
        if binds:
            built = [c for c in a.calls if c.scope is where and assigned_name(c.stmt, c.call) == name]
            return len(binds) == 1 and len(built) == 1 and binds[0].stmt is built[0].stmt and _mean_loss_built(a, built[0].call)
    return False


def _mean_loss_built(a: "Anatomy", call: cst.Call) -> bool:
    """`nn.CrossEntropyLoss()`: a loss module that averages over the batch."""
    return a.qualname(call.func) in MEAN_LOSSES and _reduction_mean(call)


def _reduction_mean(call: cst.Call) -> bool:
    for x in call.args:
        if x.star:
            return False
        if x.keyword is not None and x.keyword.value in ("reduction", "size_average", "reduce"):
            return x.keyword.value == "reduction" and isinstance(x.value, cst.SimpleString) and x.value.evaluated_value == "mean"
    return True


def _loop_assigned(loop: Union[cst.For, cst.FunctionDef], name: str) -> List[cst.BaseExpression]:
    """The values a plain `name = value` in the loop's (or function's) body binds (another kind of
    binding: None)."""
    out: List[cst.BaseExpression] = []
    for node in all_nodes(loop.body, skip_nested=True):
        if isinstance(node, cst.Assign) and any(dotted(t.target) == name for t in node.targets):
            out.append(node.value)
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)) and dotted(node.target) == name:
            out.append(None)  # type: ignore[arg-type]
    return out


def _sum_criterion(a: "Anatomy", func: cst.BaseExpression) -> bool:
    """`criterion(out, y)` where `criterion = nn.CrossEntropyLoss(reduction="sum")`."""
    name = dotted(func)
    if name is None:
        return False
    for c in a.calls:
        if sum_reduction(c.call) and assigned_name(c.stmt, c.call) == name:
            return True
    return False


def sum_reduction(call: cst.Call) -> bool:
    for x in call.args:
        if x.keyword is not None and x.keyword.value == "reduction" and isinstance(x.value, cst.SimpleString):
            return x.value.evaluated_value == "sum"
    return False


def root(e: cst.CSTNode) -> Optional[str]:
    """The name an expression hangs off: `preds` for `preds.append`, `self` for `self.x[i]`."""
    while True:
        if isinstance(e, cst.Name):
            return e.value
        if isinstance(e, cst.Attribute):
            e = e.value
        elif isinstance(e, cst.Subscript):
            e = e.value
        elif isinstance(e, cst.Call):
            e = e.func
        else:
            return None


def count(e: cst.BaseExpression, local: Set[str]) -> bool:
    """`len(y)`, `y.size(0)`, `y.size()[0]`, `y.shape[0]`, `y.numel()` of a per-batch value."""
    def zero(node) -> bool:
        return isinstance(node, cst.Integer) and node.value == "0"

    if isinstance(e, cst.Call):
        func = e.func
        if isinstance(func, cst.Name) and func.value == "len" and len(e.args) == 1:
            return root(e.args[0].value) in local
        if isinstance(func, cst.Attribute):
            if func.attr.value == "size" and len(e.args) == 1 and zero(e.args[0].value):
                return root(func.value) in local
            if func.attr.value in ("numel", "nelement") and not e.args:
                return root(func.value) in local
    if isinstance(e, cst.Subscript) and len(e.slice) == 1:
        index = e.slice[0].slice
        if not (isinstance(index, cst.Index) and zero(index.value)):
            return False
        v = e.value
        if isinstance(v, cst.Attribute) and v.attr.value == "shape":
            return root(v.value) in local
        if isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and v.func.attr.value == "size" and not v.args:
            return root(v.func.value) in local
    return False


def counter_start(a: "Anatomy", e: Optional[cst.BaseExpression]) -> bool:
    """A value a sum starts from: a number literal, or a tensor the library makes of zeros or of
    one number literal (``torch.zeros(())``, ``torch.tensor(0.0, device=device)``,
    ``torch.zeros(1).to(device)``; ``distify.library.ZERO_TENSORS``, ``NUMBER_TENSORS``)."""
    if e is None:
        return False
    if _number(e):
        return True
    while isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value in TENSOR_MOVES:
        e = e.func.value
    if not isinstance(e, cst.Call):
        return False
    q = a.qualname(e.func)
    if q in ZERO_TENSORS:
        return True
    first = arg(e, 0, "data") if q in NUMBER_TENSORS else None
    return first is not None and _number(first.value)


def _bound_value(stmt: cst.CSTNode, name: str) -> Optional[cst.BaseExpression]:
    """The value of a plain ``name = value`` (or ``name: T = value``) the statement is."""
    small = sole_statement(stmt)
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and dotted(small.targets[0].target) == name:
        return small.value
    if isinstance(small, cst.AnnAssign) and dotted(small.target) == name:
        return small.value
    return None


def _same_block(a: "Anatomy", init: cst.CSTNode, loop: cst.For, name: str, what: str) -> Optional[str]:
    """Why `init` is not right before `loop` for a counter (None when it is): in the same block,
    with no loop between that would keep adding up across its rounds."""
    outer = a.stmt_parent.get(init, ())
    around = a.stmt_parent.get(loop, ())
    if around[: len(outer)] != outer:
        return f"metric `{name}` is set in another block than the {what}"
    if any(isinstance(p, (cst.For, cst.While)) for p in around[len(outer):]):
        return f"metric `{name}` is set outside a loop around the {what}, so it adds up across its rounds"
    return None


def initialised(a: "Anatomy", name: str, loop: cst.For, scope: Scope, what: str, tensors: bool = False) -> Optional[str]:
    """Why `name` is no counter of this loop alone (None when it is): it must start from a number
    literal (or, with `tensors`, a tensor of one: ``counter_start``) right before the loop, in the
    same block, and not keep adding up in another loop."""
    at = a.order(loop)
    init = a.reaching_binding(scope, name, loop)
    if init is None or init.kind != "assign" or not (
            init.literal or (tensors and counter_start(a, _bound_value(init.stmt, name)))):
        return f"metric `{name}` does not start from a number literal right before the {what}"
    why = _same_block(a, init.stmt, loop, name, what)
    if why is not None:
        return why
    around = a.stmt_parent.get(loop, ())
    for b in a.bindings(scope).get(name, []):
        if a.order(b.stmt) <= at or loop in a.stmt_parent.get(b.stmt, ()):
            continue
        if b.kind != "aug":
            break  # set afresh: later sums start over
        if any(p not in around for p in a.loops_around(b.stmt)):
            line = a.position(b.stmt)[0]
            return f"metric `{name}` keeps adding up in another loop (line {line})"
    return None


def first_read_after(a: "Anatomy", name: str, loop: cst.For, scope: Scope) -> Optional[cst.CSTNode]:
    """The first statement after the loop in its scope that reads `name` (None when it is set
    afresh, or never read, first)."""
    at = a.order(loop)
    for stmt in a.facts.statements(scope):
        if a.order(stmt) <= at or loop in a.stmt_parent.get(stmt, ()):
            continue
        for n, how in header_names(stmt):
            if n.value == name:
                return stmt if how != "store" else None
    return None


def reduces(a: "Anatomy", stmt: cst.CSTNode) -> bool:
    """The statement calls a collective already (a sum distify or the script reduced)."""
    return any(
        (c.qualname or "").startswith(COLLECTIVES) for c in a.calls if c.stmt is stmt
    )


UNKNOWN = "unknown"  # added to with `+=`, but neither a per-sample sum nor a batch mean distify can tell


def training_sums(a: "Anatomy", loop: cst.For, scope: Scope) -> List[LoopSum]:
    """The counters a training loop adds to and its scope reads after it, each with its kind
    (``UNKNOWN`` for one added to with terms distify cannot classify: a loss computed by hand).
    A counter the loop also sets, reads or adds anything else to is none (its value is per rank
    by design, such as a running loss printed and reset every k batches)."""
    local = loop_locals(loop)
    found: dict = {}
    bad: Set[str] = set()
    lines = _lines(loop)
    for node in all_nodes(loop.body, skip_nested=True):
        if not isinstance(node, cst.AugAssign) or not isinstance(node.target, cst.Name):
            continue
        name = node.target.value
        if name in local:
            continue
        if isinstance(node.operator, cst.AddAssign) and isinstance(node.value, (cst.Integer, cst.Float)):
            continue  # a count of batches (`steps += 1`): every rank runs as many
        kind = _term_kind(a, node, loop, scope, local, lines)
        prior = found.get(name)
        if kind is None:
            bad.add(name)
        elif prior is None:
            found[name] = LoopSum(name, node, kind)
        elif prior.kind != kind:
            found[name] = LoopSum(name, prior.node, UNKNOWN)  # a sum of terms of different kinds
    for n, how in names(loop.body):
        if n.value in found and how != "aug":
            bad.add(n.value)
    out = []
    for s in found.values():
        if s.name in bad or initialised(a, s.name, loop, scope, "training loop", tensors=True) is not None:
            continue
        read = first_read_after(a, s.name, loop, scope)
        if read is not None and not reduces(a, read):
            out.append(s)
    return out


def _lines(loop: cst.For) -> Dict[int, cst.SimpleStatementLine]:
    """The line of each small statement of the loop's body (by id)."""
    return {id(small): line for line in all_nodes(loop.body, skip_nested=True)
            if isinstance(line, cst.SimpleStatementLine) for small in line.body}


def _term_kind(a: "Anatomy", node: cst.AugAssign, loop: cst.For, scope: Scope, local: Set[str],
               lines: Dict[int, cst.SimpleStatementLine]) -> Optional[str]:
    """What one ``+=`` of the loop adds: ``sample``, ``batch`` or ``UNKNOWN``; None for another
    operator (the counter is then no sum)."""
    if not isinstance(node.operator, cst.AddAssign):
        return None
    if sample_sum(a, node.value, local) or bound_sample_sum(a, node.value, loop, local):
        return "sample"
    if batch_mean(a, node.value, loop, scope):
        return "batch"
    return _loss_kind(a, node.value, scope, lines.get(id(node)))


def _loss_kind(a: "Anatomy", e: cst.BaseExpression, scope: Scope, line: Optional[cst.CSTNode]) -> str:
    """`loss.item()` of a training loss (``distify.loss_scale``): a sum over the batch's samples is
    a per-sample sum, a mean over them a batch mean; ``UNKNOWN`` otherwise."""
    from distify.loss_scale import MEAN, SAMPLE, LossScale  # here: most loops' terms are told apart above

    if line is None:
        return UNKNOWN
    reader = a.facts.memo(("loss_scale",), lambda: LossScale(a))
    kind = reader.kind(_converted(a, e), scope, line).kind
    return "sample" if kind == SAMPLE else "batch" if kind == MEAN else UNKNOWN


def list_sums(a: "Anatomy", loop: cst.For, scope: Scope) -> List[LoopSum]:
    """The lists a loop appends one value per batch to and its scope reads after it
    (``losses = []`` right before the loop, ``losses.append(loss.item())`` in it, ``sum(losses) /
    len(losses)`` after it), each with the kind of what it appends: the list is this rank's, entry
    by entry. A list the loop also reads, rebinds or changes in another way is none."""
    local = loop_locals(loop)
    found: dict = {}
    bad: Set[str] = set()
    appends: Set[int] = set()
    for node in all_nodes(loop.body, skip_nested=True):
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "append"):
            continue
        if not isinstance(node.func.value, cst.Name) or len(node.args) != 1 or node.args[0].keyword or node.args[0].star:
            continue
        name = node.func.value.value
        if name in local:
            continue
        appends.add(id(node.func.value))
        value = node.args[0].value
        kind = "sample" if sample_sum(a, value, local) else "batch" if batch_mean(a, value, loop, scope) else None
        prior = found.get(name)
        if kind is None or (prior is not None and prior.kind != kind):
            bad.add(name)
        elif prior is None:
            found[name] = LoopSum(name, node, kind)
    for n in all_nodes(loop.body, skip_nested=False):
        if isinstance(n, cst.Name) and n.value in found and id(n) not in appends:
            bad.add(n.value)  # read, rebound or changed otherwise in the loop
    out = []
    for s in found.values():
        if s.name in bad or not _starts_empty(a, s.name, loop, scope):
            continue
        read = first_read_after(a, s.name, loop, scope)
        if read is not None and not reduces(a, read):
            out.append(s)
    return out


class EntrySum(Record):
    """A sum a loop adds up in an entry of a dict (``stats["correct"] += ...``): ``name`` is the
    entry as the script writes it, ``holder`` the dict's name."""

    __slots__ = ("name", "node", "kind", "holder", "__dict__")
    name: str
    node: cst.AugAssign
    kind: str  # sample | batch | unknown
    holder: str

    def __init__(self, name: str, node: cst.AugAssign, kind: str, holder: str) -> None:
        self._set(name, node, kind, holder)


def _key(e: cst.BaseExpression) -> Optional[tuple]:
    """The constant key of a subscript or dict element (a string or an integer literal)."""
    if isinstance(e, cst.SimpleString):
        return ("str", e.evaluated_value)
    if isinstance(e, cst.Integer):
        return ("int", int(e.value.replace("_", ""), 0))
    return None


def _entry_key(target: cst.Subscript) -> Optional[tuple]:
    if len(target.slice) != 1 or not isinstance(target.slice[0].slice, cst.Index):
        return None
    return _key(target.slice[0].slice.value)


def dict_sums(a: "Anatomy", loop: cst.For, scope: Scope) -> Tuple[List[EntrySum], List[Tuple[str, cst.CSTNode, str]]]:
    """The entries of a dict of counters the loop adds up and its scope reads after it
    (``stats = {"loss": 0.0, "correct": 0}`` right before the loop, ``stats["correct"] +=
    (pred == y).sum().item()`` in it), each with its kind; and (dict, node, why) for each dict the
    loop adds per-sample sums or batch means to, read after the loop, that is no such dict of
    counters (it is also read, passed on or changed otherwise in the loop, does not start from a
    dict literal of numbers right before it, or keeps adding up after it): its figures stay this
    rank's, and a rule says so rather than reduce them."""
    local = loop_locals(loop)
    lines = _lines(loop)
    found: Dict[str, Dict[tuple, EntrySum]] = {}
    odd: Dict[str, str] = {}
    targets: Set[int] = set()
    for node in all_nodes(loop.body, skip_nested=True):
        if not isinstance(node, cst.AugAssign) or not isinstance(node.target, cst.Subscript):
            continue
        holder = node.target.value
        if not isinstance(holder, cst.Name) or holder.value in local:
            continue
        name = holder.value
        targets.add(id(holder))
        key = _entry_key(node.target)
        entries = found.setdefault(name, {})
        if key is None:
            odd.setdefault(name, f"`{name}` is added to at a key distify cannot tell (line {a.position(node)[0]})")
            continue
        if isinstance(node.operator, cst.AddAssign) and isinstance(node.value, (cst.Integer, cst.Float)):
            kind = "steps"  # a count of batches (`stats["steps"] += 1`): every rank runs as many
        else:
            kind = _term_kind(a, node, loop, scope, local, lines)
        if kind is None:
            odd.setdefault(name, f"`{name}` is changed by another operation than a sum (line {a.position(node)[0]})")
            continue
        prior = entries.get(key)
        if prior is None:
            entry = f"{name}[{cst.Module([]).code_for_node(node.target.slice[0].slice.value)}]"
            entries[key] = EntrySum(entry, node, kind, name)
        elif prior.kind != kind:
            entries[key] = EntrySum(prior.name, prior.node, UNKNOWN, name)  # terms of different kinds
    for entries in found.values():
        for key in [k for k, e in entries.items() if e.kind == "steps"]:
            del entries[key]  # alike on every rank: left as it is
    for n, how in names(loop.body):
        if n.value in found and id(n) not in targets:
            odd.setdefault(n.value, f"`{n.value}` is also used otherwise in the loop (line {a.position(n)[0]})")
    out: List[EntrySum] = []
    warned: List[Tuple[str, cst.CSTNode, str]] = []
    for name, entries in found.items():
        if not entries:
            continue  # only counts of batches
        read = first_read_after(a, name, loop, scope)
        if read is None or reduces(a, read):
            continue
        first = next(iter(entries.values())).node
        why = odd.get(name) or _dict_counter(a, name, entries, loop, scope)
        if why is not None:
            warned.append((name, first, why))
        else:
            out.extend(entries.values())
    return out, warned


def _dict_counter(a: "Anatomy", name: str, entries: Dict[tuple, EntrySum], loop: cst.For, scope: Scope) -> Optional[str]:
    """Why `name` is no dict of counters of this loop (None when it is): bound to a dict literal
    of constant keys right before the loop, each entry the loop adds to started from a number (or a
    tensor of one), and no entry of it added to after the loop before it is bound afresh."""
    b = a.reaching_binding(scope, name, loop)
    value = _bound_value(b.stmt, name) if b is not None and b.kind == "assign" else None
    if not isinstance(value, cst.Dict):
        return f"`{name}` does not start from a dict literal right before the loop"
    starts: Dict[tuple, cst.BaseExpression] = {}
    for el in value.elements:
        key = _key(el.key) if isinstance(el, cst.DictElement) else None
        if key is None:
            return f"`{name}` starts from a dict distify cannot read key by key"
        starts[key] = el.value
    for key, entry in entries.items():
        if not counter_start(a, starts.get(key)):
            return f"`{entry.name}` does not start from a number in the dict right before the loop"
    why = _same_block(a, b.stmt, loop, name, "loop over batches")
    if why is not None:
        return why
    at = a.order(loop)
    for stmt in a.facts.statements(scope):
        if a.order(stmt) <= at or loop in a.stmt_parent.get(stmt, ()) or not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and any(n.value == name and how == "store" for n, how in names(small)):
                return None  # bound afresh: later sums start over
            if (isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Subscript)
                    and dotted(small.target.value) == name and _entry_key(small.target) in entries):
                return f"`{name}` keeps adding up after the loop (line {a.position(stmt)[0]})"
    return None


def _starts_empty(a: "Anatomy", name: str, loop: cst.For, scope: Scope) -> bool:
    """`name` is bound to an empty list literal in the loop's own block, with no loop between."""
    b = a.reaching_binding(scope, name, loop)
    if b is None or b.kind != "assign" or not isinstance(b.stmt, cst.SimpleStatementLine) or len(b.stmt.body) != 1:
        return False
    small = b.stmt.body[0]
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.List)):
        return False
    if small.value.elements or dotted(small.targets[0].target) != name:
        return False
    outer, around = a.stmt_parent.get(b.stmt, ()), a.stmt_parent.get(loop, ())
    return around[: len(outer)] == outer and not any(isinstance(p, (cst.For, cst.While)) for p in around[len(outer):])


def fed_only_by(a: "Anatomy", bl: "BatchLoop", sharded: Collection["Loader"]) -> bool:
    """Every batch the loop reads comes from one of the `sharded` loaders: each loader whose batches
    reach it is one, it takes no key of a loader family that stays whole (`for b in
    loaders[phase]` over "train" and "val"), and each call of its function passes one of them."""
    feeding = [ld for ld in a.loaders if any(x is bl for x in ld.batch_loops)]
    if not feeding or any(ld not in sharded for ld in feeding):
        return False
    if bl.keys is not None and set(bl.keys) != set(bl.train_keys or ()):
        return False
    return _passed_by_every_call(a, bl, feeding)


def _passed_by_every_call(a: "Anatomy", bl: "BatchLoop", feeding: List["Loader"]) -> bool:
    """The loop's loader, when it is a parameter of its function, is one of `feeding` at each call."""
    if isinstance(bl.scope, cst.FunctionDef) and bl.ref in a.facts.params(bl.scope):
        known = {(id(s), r) for ld in feeding for s, r in ld.refs}
        sites = a.callers(bl.scope, any_receiver=True)
        for site in sites:
            value = a.bound_value(site.call, bl.scope, bl.ref)
            if any(value is ld.call.call for ld in feeding):
                continue  # `train(DataLoader(ds, ...), model)`: the loader built in place
            ref = dotted(value) if value is not None else None
            if ref is None or (id(site.scope), ref) not in known:
                return False
        return bool(sites)
    return True


def sharded_key(a: "Anatomy", bl: "BatchLoop", sharded: Collection["Loader"]) -> Optional[tuple]:
    """(key variable, key) for the loop of the fine-tuning recipe, ``for phase in ["train", "val"]:
    ... for x, y in loaders[phase]:``, over a loader family of `sharded` whose one sharded key is the
    one that trains while every other key stays whole: its sums are this rank's shard's on a pass
    over that key only, and whole on the others. The variable iterates constant strings, so every
    rank takes the same pass at once. None for any other loop."""
    from distify.training import keyed_loop  # here: most files have no keyed loop

    feeding = [ld for ld in a.loaders if any(x is bl for x in ld.batch_loops)]
    if len(feeding) != 1 or feeding[0] not in sharded or feeding[0].family is None or bl.keys is None:
        return None
    ld = feeding[0]
    if len(ld.train_keys) != 1 or list(bl.train_keys or ()) != ld.train_keys:
        return None
    keyed = keyed_loop(bl.loop, [p for p in a.stmt_parent.get(bl.loop, ()) if isinstance(p, cst.For)], a.qualname)
    if keyed is None or keyed[0] != bl.ref or not _passed_by_every_call(a, bl, feeding):
        return None
    return keyed[2], ld.train_keys[0]
