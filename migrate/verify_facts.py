"""Facts about the project under ``distify verify``, read from its sources before anything runs.

A check that a run did not exercise is "not exercised", and one that cannot apply to this script is
"not applicable"; telling them apart needs what the script *could* do, not only what one run did.

- Save sites come from the anatomy the migration uses (``Anatomy.save_sites``: ``torch.save`` and
  ``save_pretrained``/``push_to_hub`` calls, resolved through the imports), so a save under a condition
  the run never met is reported as a save that never ran, by line, instead of passing unseen.
- Draw sites: calls that draw from Python's ``random`` or ``numpy.random`` (a function of the module,
  resolved through the imports, or a method of a generator object bound to ``default_rng(...)``,
  ``RandomState(...)``, ``random.Random(...)``; the library table ``distify.library`` says which
  names are which). The probe sees at run time *whether* such a generator drew while batches were
  made or during a training step; these sites name *where*, also for generator methods it cannot
  intercept.

Facts are per module: the script and every module of the project the runs imported (paths relative
to the sandbox root, as the probe reports them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Set, Tuple

from distify.library import RANDOM_GENERATORS, random_draw


@dataclass(frozen=True)
class Site:
    first: int  # the lines the call spans
    last: int
    source: str  # its first line, stripped
    path: str = ""  # the module, relative to the sandbox root ("" in a single-file ScriptFacts)
    lib: str = ""  # draws: the module whose generator it draws from (a key of library.RANDOM_MODULES)
    via: str = ""  # draws from a generator object: the constructor that built it (library.RANDOM_GENERATORS)

    def covers(self, line: int) -> bool:
        return self.first <= line <= self.last


@dataclass(frozen=True)
class ScriptFacts:
    saves: Tuple[Site, ...] = field(default_factory=tuple)
    readable: bool = True  # False: the source did not parse (the runs will say why)
    draws: Tuple[Site, ...] = field(default_factory=tuple)


def script_facts(text: str, path: str = "") -> ScriptFacts:
    import libcst as cst

    from distify.anatomy import analyse
    from distify.records import positions
    from distify.syntax import dotted

    try:
        module = cst.parse_module(text)
    except Exception:  # noqa: BLE001 - libcst's parser errors: the runs report the script's own error
        return ScriptFacts(readable=False)
    anatomy = analyse(module)
    spans = positions(anatomy.wrapper)
    lines = text.splitlines()

    def site(node, lib: str = "", via: str = "") -> Site:
        span = spans.get(node)
        if span is None:
            return None
        first = span.start.line
        return Site(first, span.end.line, lines[first - 1].strip() if 0 < first <= len(lines) else "", path, lib, via)

    saves = [s for s in (site(c.call) for c in anatomy.save_sites()) if s is not None]
    # the targets bound to a generator object (`rng = np.random.default_rng(0)`, `self.rng = random.Random()`)
    generators: Dict[str, str] = {}  # target -> the constructor
    for c in anatomy.calls:
        if c.qualname not in RANDOM_GENERATORS:
            continue
        for small in getattr(c.stmt, "body", ()):
            value = getattr(small, "value", None)
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else \
                [small.target] if isinstance(small, cst.AnnAssign) else []
            if value is c.call or (isinstance(value, cst.IfExp) and c.call in (value.body, value.orelse)):
                for t in targets:
                    if dotted(t):
                        generators[dotted(t)] = c.qualname
    draws = []
    for c in anatomy.calls:
        lib, via = random_draw(c.qualname), ""
        func = c.call.func
        if lib is None and isinstance(func, cst.Attribute):
            receiver = func.value
            if isinstance(receiver, cst.Call):  # np.random.default_rng(0).normal(...)
                via = anatomy.qualname(receiver.func) or ""
            elif dotted(receiver) in generators:
                via = generators[dotted(receiver)]
            lib = RANDOM_GENERATORS.get(via)
        if lib is not None:
            s = site(c.call, lib, via)
            if s is not None:
                draws.append(s)
    order = lambda s: s.first  # noqa: E731
    return ScriptFacts(tuple(sorted(set(saves), key=order)), True, tuple(sorted(set(draws), key=order)))


def project_facts(texts: Iterable[Tuple[str, str]]) -> ScriptFacts:
    """The facts of several modules, each (path relative to the sandbox root, source text), merged."""
    saves: List[Site] = []
    draws: List[Site] = []
    seen: Set[str] = set()
    readable = True
    for path, text in texts:
        if path in seen:
            continue
        seen.add(path)
        facts = script_facts(text, path)
        saves += facts.saves
        draws += facts.draws
        readable = readable and facts.readable
    return ScriptFacts(tuple(saves), readable, tuple(draws))
