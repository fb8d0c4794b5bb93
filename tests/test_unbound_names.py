"""Every name an edit reads is bound where it reads it (DST962), and DST111 spells the accumulation
count as the scope of the wrap knows it.

The check compares the output's unbound reads (CPython's symbol tables) with the input's; a control
places an edit in the wrong method and must see the file refused, the same edit in the right method
written.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from distify.engine import migrate_source
from distify.options import Options
from distify.scopes import new_unbound_reads, unbound_reads

ROOT = Path(__file__).resolve().parent.parent
ARGS = ROOT / "fixtures" / "DST111" / "accumulation_count_from_args.in.py"
NAMES = ROOT / "fixtures" / "DST962" / "names_the_input_leaves_unbound.in.py"


def test_unbound_reads_follow_pythons_scopes():
    src = (
        "import os\n"
        "from e2e_support import *\n"  # a module of the project: its star import may bind anything
        "class Trainer:\n"
        "    steps = 4\n"
        "    def fit(self, lr):\n"
        "        def inner():\n"
        "            return lr + width\n"  # lr: the enclosing function's; width: nobody's
        "        return [steps for _ in range(2)], print(os.sep, __file__), inner\n"  # steps: the class's, not visible
        "def setup():\n"
        "    global SEED\n"
        "    SEED = 1\n"
        "def main():\n"
        "    return SEED, helper_from_star\n"
    )
    assert unbound_reads(src) == {
        ("width", ("Trainer", "fit", "inner")),
        ("steps", ("Trainer", "fit", "listcomp")),
        ("helper_from_star", ("main",)),
    }


def test_a_read_the_input_already_makes_is_not_distifys():
    src = NAMES.read_text()
    assert {n for n, _ in unbound_reads(src)} >= {"make_model", "LR"}  # the fixture exercises the subtraction
    for backend in ("ddp", "horovod", "fsdp"):
        result = migrate_source(src.encode(), Options(backend=backend))
        assert result.changed and not result.refused
        assert not [f for f in result.findings if f.code == "DST962"]


TRAINER = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, loader, lr):
        warmup = 3
        self.model = nn.Linear(4, 1)
        self.loader, self.warmup = loader, warmup
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)

    def fit(self, epochs):
        seen = 0
        for epoch in range(epochs):
            for x, y in self.loader:
                self.optimizer.zero_grad()
                nn.functional.mse_loss(self.model(x), y).backward()
                self.optimizer.step()


data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
Trainer(DataLoader(data, batch_size=8), 0.1).fit(2)
'''


class _EditAfter:
    """A stand-in rule that inserts `print(warmup)` after the first statement of one method: in
    __init__ the name is bound, in fit it is not (the edit is in the wrong method)."""

    code, name, backends, summary = "DST999", "test-edit", frozenset({"ddp", "horovod", "fsdp"}), "test"

    def __init__(self, method: str) -> None:
        self.method = method

    def apply(self, ctx) -> None:
        fn = next(f for f in ctx.anatomy.all_functions() if f.name.value == self.method)
        ctx.edits.insert_after(fn.body.body[0], ctx.stmts("print(warmup)"))


@pytest.mark.parametrize("method,refused", [("fit", True), ("__init__", False)])
def test_an_edit_in_the_wrong_method_is_refused(monkeypatch, method, refused):
    import distify.rules as rules

    real = rules.selected
    monkeypatch.setattr(rules, "selected", lambda *a, **k: (*real(*a, **k), _EditAfter(method)))
    result = migrate_source(TRAINER.encode(), Options(backend="ddp"))
    found = [f for f in result.findings if f.code == "DST962"]
    assert result.refused is refused
    if refused:
        assert result.output == TRAINER.encode()  # nothing written
        (f,) = found
        assert "`warmup` in Trainer.fit()" in f.message and "print(warmup)" in f.message
        assert f.line == 15  # the user's line where the edit goes: in fit, after `seen = 0`
    else:
        assert result.changed and not found and b"        print(warmup)\n" in result.output


def test_horovod_reads_the_accumulation_count_as_main_spells_it():
    out = migrate_source(ARGS.read_bytes(), Options(backend="horovod")).output.decode()
    assert "backward_passes_per_step=args.accumulation_steps)" in out
    assert not new_unbound_reads(ARGS.read_text(), out)


def test_control_the_count_copied_as_the_training_function_spells_it_is_refused(monkeypatch):
    """The cause of the bug, put back: DST111 writes the count as the step's scope reads it. The
    output would raise NameError in main(); DST962 refuses the file with the name and the line."""
    import distify.rules.dst111_distributed_optimizer as dst111

    monkeypatch.setattr(dst111, "spell_in", lambda a, expr, where, target: expr)
    monkeypatch.setattr(dst111, "readable_after", lambda a, expr, stmt: True)
    result = migrate_source(ARGS.read_bytes(), Options(backend="horovod"))
    assert result.refused and result.output == ARGS.read_bytes()
    (f,) = [f for f in result.findings if f.code == "DST962"]
    assert "`accumulation_steps` in main()" in f.message and "backward_passes_per_step=accumulation_steps" in f.message


def test_a_count_only_the_training_function_knows_is_averaged_before_the_step():
    src = ROOT / "fixtures" / "DST111" / "accumulation_count_local.in.py"
    result = migrate_source(src.read_bytes(), Options(backend="horovod"))
    out = result.output.decode()
    assert "hvd.DistributedOptimizer(" not in out and "backward_passes_per_step=" not in out
    tree = cst.parse_module(out)
    assert out.index("hvd.grouped_allreduce_(") < out.index("optimizer.step()")
    assert not new_unbound_reads(src.read_text(), tree.code)


@pytest.mark.e2e
@pytest.mark.horovod
def test_the_horovod_output_runs_where_the_copied_count_raised_nameerror(tmp_path, monkeypatch):
    """The issue's failure, executed: the Horovod output of the accumulation script runs as a plain
    one-process `python` (hvd.init() alone); the control writes the count as the training function
    spells it (the earlier output, DST962 switched off) and dies with NameError in main()."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from e2e_support import run_python

    good = tmp_path / "good.py"
    good.write_bytes(migrate_source(ARGS.read_bytes(), Options(backend="horovod")).output)
    ran = run_python(good, ["--epochs", "1"], check=False, timeout=120)
    assert ran.returncode == 0, ran.describe()

    import distify.rules.dst111_distributed_optimizer as dst111
    import distify.rules.dst962_unbound_name as dst960

    monkeypatch.setattr(dst111, "spell_in", lambda a, expr, where, target: expr)
    monkeypatch.setattr(dst111, "readable_after", lambda a, expr, stmt: True)
    monkeypatch.setattr(dst960.UnboundName, "check_output", lambda self, before, after: [])
    bad = tmp_path / "bad.py"
    bad.write_bytes(migrate_source(ARGS.read_bytes(), Options(backend="horovod")).output)
    ran = run_python(bad, ["--epochs", "1"], check=False, timeout=120)
    assert ran.returncode != 0 and "NameError: name 'accumulation_steps' is not defined" in ran.stderr, ran.describe()
