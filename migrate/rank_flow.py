"""Which names and calls hold a value that differs between processes, by data flow (part of the facts).

The sources are library knowledge (``library.TABLE`` rows of kind ``rank``: ``dist.get_rank()``,
``hvd.local_rank()``, ``runtime.is_main_process()``, ``torch.cuda.current_device()``, ``os.getpid()``),
the launcher's rank environment variables (``os.environ["LOCAL_RANK"]``), the ``--local_rank``
argument ``torch.distributed.launch`` passes (its argparse destination), and the process index
``torch.multiprocessing.spawn`` hands its function as the first argument. From there the value is
followed, never guessed from how anything is spelled: names assigned from it (``self.gpu_id =
int(os.environ["LOCAL_RANK"])``), parameters every caller passes it to, and the calls of the
script's own functions that return it (``def is_main(): return dist.get_rank() == 0``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, FrozenSet, List, Set, Tuple

import libcst as cst

from distify.library import known
from distify.rank import RANK_ENV, _rank_value_part, reads_rank
from distify.syntax import all_nodes, arg, dotted

if TYPE_CHECKING:
    from distify.facts import Facts

# argparse destinations a launcher fills with this process's rank (torch.distributed.launch passes
# --local_rank=N, or --local-rank=N since torch 2.0, to every process it starts)
LAUNCHER_ARGUMENTS = frozenset({"--local_rank", "--local-rank"})
PARSE_METHODS = frozenset({"parse_args", "parse_known_args"})
SPAWN = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn", "torch.multiprocessing.start_processes"})


def _argparse_seeds(facts: "Facts") -> Set[str]:
    """``args.local_rank`` when the script declares the launcher's ``--local_rank`` argument and binds
    ``args = parser.parse_args()`` (``args, _ = parser.parse_known_args()``)."""
    dests: Set[str] = set()
    for c in facts.calls:
        f = c.call.func
        if not (isinstance(f, cst.Attribute) and f.attr.value == "add_argument"):
            continue
        flags = [a.value.evaluated_value for a in c.call.args if a.keyword is None and isinstance(a.value, cst.SimpleString)]
        if not LAUNCHER_ARGUMENTS & set(flags):
            continue
        dest = arg(c.call, None, "dest")
        if dest is not None and isinstance(dest.value, cst.SimpleString):
            dests.add(dest.value.evaluated_value)
        else:
            dests.add("local_rank")
    if not dests:
        return set()
    # the parsed namespace: `args = parser.parse_args()`, also returned by a helper of the script
    # (`def get_args(): ...; return parser.parse_args()` then `args = get_args()`)
    parsed: Set[int] = {
        id(c.call) for c in facts.calls
        if isinstance(c.call.func, cst.Attribute) and c.call.func.attr.value in PARSE_METHODS
    }
    out: Set[str] = set()
    for _ in range(3):
        for fn in facts.all_functions():
            rets = [r.value for r in all_nodes(fn.body) if isinstance(r, cst.Return) and r.value is not None]
            if any(id(v) in parsed or dotted(v) in out for v in rets):
                parsed |= {id(c.call) for c in facts.callers(fn)}
        for a, _stmt, _scope, _cls in facts.assigns:
            if id(a.value) not in parsed:
                continue
            for t in a.targets:
                target = t.target
                if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
                    target = target.elements[0].value
                base = dotted(target)
                if base:
                    out.add(base)
    return {f"{base}.{d}" for base in out for d in dests}


def _spawn_seeds(facts: "Facts") -> Set[str]:
    """The first parameter of a function handed to ``torch.multiprocessing.spawn``: the process index."""
    out: Set[str] = set()
    for c in facts.calls:
        if c.qualname not in SPAWN:
            continue
        fn_arg = arg(c.call, 0, "fn")
        name = dotted(fn_arg.value) if fn_arg is not None else None
        fn = facts.functions.named(name)
        if fn is not None and fn.params.params:
            out.add(fn.params.params[0].name.value)
    return out


ENV_GETS = frozenset({"os.environ.get", "os.getenv"})


def _env_get(c) -> bool:
    """`os.environ.get("LOCAL_RANK", 0)` / `os.getenv("RANK")` (resolved through the imports): a
    read of a launcher's rank variable, whatever is done with it."""
    if c.qualname not in ENV_GETS or not c.call.args or c.call.args[0].keyword is not None:
        return False
    key = c.call.args[0].value
    return isinstance(key, cst.SimpleString) and key.evaluated_value in RANK_ENV


def rank_flow(facts: "Facts") -> Tuple[FrozenSet[str], FrozenSet[int]]:
    """(dotted names bound to a rank, ids of the calls whose value is one): see the module's doc."""
    calls: Set[int] = {id(c.call) for c in facts.calls if (known(c.qualname) or _NO_ROW).kind == "rank" or _env_get(c)}
    found: Set[str] = _argparse_seeds(facts) | _spawn_seeds(facts)
    pending: List[Tuple[str, cst.BaseExpression, object]] = []
    for a, _stmt, scope, _cls in facts.assigns:
        name = dotted(a.targets[0].target) if len(a.targets) == 1 else None
        if name:
            pending.append((name, a.value, scope))
    functions = [fn for fn in facts.all_functions() if facts.callers(fn)]
    returns = {fn: [r.value for r in all_nodes(fn.body) if type(r) is cst.Return and r.value is not None]
               for fn in functions}
    changed = True
    while changed:
        changed = False
        names, ids = frozenset(found), frozenset(calls)
        for name, value, scope in pending:
            if name in found:
                continue
            part = _rank_value_part(value, ids)
            # an object built from a rank (a sampler, a wrapped model) is no rank
            if part is not None and reads_rank(part, names, ids):
                found.update(facts.spellings(scope, name))  # an attribute of the instance: every method's spelling
                changed = True
        for fn in functions:
            # a parameter every caller passes a rank to: `Trainer(model, data, rank)` / `gpu_id`
            for p in facts.params(fn):
                if p in found:
                    continue
                values = [facts.bound_value(c.call, fn, p) for c in facts.callers(fn)]
                if all(v is not None and reads_rank(v, names, ids) for v in values):
                    found.add(p)
                    changed = True
            # a function that returns a rank (or a flag made from one): its calls are rank values
            sites = [id(c.call) for c in facts.callers(fn)]
            if sites and not set(sites) <= calls and any(_returns_rank(v, names, ids) for v in returns[fn]):
                calls |= set(sites)
                changed = True
    return frozenset(found), frozenset(calls)


TEXT_CALLS = frozenset({"str", "repr", "format", "os.path.join", "os.path.expanduser", "pathlib.Path", "int", "float"})


def _text(value: cst.BaseExpression) -> bool:
    """A value that names something (a string, a path, a number made from its parts), not an object
    built from them (``torch.device(...)``, a wrapped model): only those name a per-process file."""
    if isinstance(value, (cst.FormattedString, cst.ConcatenatedString, cst.SimpleString, cst.Name, cst.Attribute,
                          cst.BinaryOperation, cst.Integer)):
        return True
    if isinstance(value, cst.Call):
        f = value.func
        return dotted(f) in TEXT_CALLS or (isinstance(f, cst.Attribute) and f.attr.value == "format"
                                           and isinstance(f.value, cst.SimpleString))
    return False


def process_calls(facts: "Facts") -> FrozenSet[int]:
    """Ids of the calls whose value is this process's, rank numbers or not (``os.getpid()``)."""
    return facts.rank_calls | {id(c.call) for c in facts.calls if (known(c.qualname) or _NO_ROW).kind == "process"}


def made_from_rank(facts: "Facts") -> FrozenSet[str]:
    """Dotted names bound to a text or number made from a rank or another per-process value
    (``path = f"ckpt_{rank}.pt"``, ``log = os.path.join(d, str(os.getpid()))``): what makes a file
    name or a log line per process. An object built from one (a device, a model moved there) is not."""
    calls = facts.process_calls
    found: Set[str] = set(facts.rank_names)
    pending = []
    for a, _stmt, scope, _cls in facts.assigns:
        name = dotted(a.targets[0].target) if len(a.targets) == 1 else None
        if name and name not in found and _text(a.value):
            if reads_rank(a.value, frozenset(found), calls):
                found.update(facts.spellings(scope, name))
            else:
                pending.append((name, scope, {dotted(n) for n in all_nodes(a.value) if isinstance(n, (cst.Name, cst.Attribute))}))
    changed = True
    while changed:
        changed = False
        for name, scope, read in pending:
            if name not in found and read & found:
                found.update(facts.spellings(scope, name))
                changed = True
    return frozenset(found)


def _returns_rank(value: cst.BaseExpression, names: FrozenSet[str], ids: FrozenSet[int]) -> bool:
    part = _rank_value_part(value, ids)  # a device or sampler built from a rank is no rank
    return part is not None and reads_rank(part, names, ids)


class _NoRow:
    kind = ""


_NO_ROW = _NoRow()
