"""Issue 24's layout rule: no module of the engine (migrate/) or of the rules (rules/) over 800 lines,
so that a reader finds a fact family or a rule in a file of its own size. Control: the check run on a
folder holding one longer file reports it."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 800


def too_long(folder: Path, limit: int = LIMIT) -> list:
    return sorted((p.name, n) for p in folder.glob("*.py") if (n := len(p.read_text().splitlines())) > limit)


def test_no_engine_or_rule_module_is_over_800_lines():
    assert too_long(ROOT / "migrate") == [] and too_long(ROOT / "rules") == []


def test_control_a_long_module_is_reported(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n" * LIMIT)
    (tmp_path / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    assert too_long(tmp_path) == [("long.py", LIMIT + 1)]
