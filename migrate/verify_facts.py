"""Facts about the script under ``distify verify``, read from its source before anything runs.

A check that a run did not exercise is "not exercised", and one that cannot apply to this script is
"not applicable"; telling them apart needs what the script *could* do, not only what one run did.
The save sites come from the anatomy the migration uses (``Anatomy.save_sites``: ``torch.save`` and
``save_pretrained``/``push_to_hub`` calls, resolved through the imports), so a save under a condition
the run never met is reported as a save that never ran, by line, instead of passing unseen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple


@dataclass(frozen=True)
class Site:
    first: int  # the lines the call spans
    last: int
    source: str  # its first line, stripped

    def covers(self, line: int) -> bool:
        return self.first <= line <= self.last


@dataclass(frozen=True)
class ScriptFacts:
    saves: Tuple[Site, ...] = field(default_factory=tuple)
    readable: bool = True  # False: the source did not parse (the runs will say why)


def script_facts(text: str) -> ScriptFacts:
    import libcst as cst

    from distify.anatomy import analyse, positions

    try:
        module = cst.parse_module(text)
    except Exception:  # noqa: BLE001 - libcst's parser errors: the runs report the script's own error
        return ScriptFacts(readable=False)
    anatomy = analyse(module)
    spans = positions(anatomy.wrapper)
    lines = text.splitlines()
    saves: List[Site] = []
    for site in anatomy.save_sites():
        span = spans.get(site.call)
        if span is None:
            continue
        first = span.start.line
        saves.append(Site(first, span.end.line, lines[first - 1].strip() if 0 < first <= len(lines) else ""))
    return ScriptFacts(tuple(sorted(set(saves), key=lambda s: s.first)))
