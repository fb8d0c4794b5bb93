"""An optimizer built in a function nothing in the script can call does not exist in a run: it
neither needs a model distify can name nor stops the migration (facts.never_runs,
fixtures/DST905/unused_configure_optimizers). Any reference to the function keeps it: a call, the
bound method handed on, its name in a string, a decorator."""
from __future__ import annotations

from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.facts import Facts
from distify.options import Options

CASE = Path(__file__).resolve().parent.parent / "fixtures" / "DST905" / "unused_configure_optimizers.in.py"


def _codes(result):
    return {f.code for f in result.findings if f.kind == "warning"}


@pytest.mark.parametrize("backend", ["ddp", "fsdp", "horovod"])
def test_an_optimizer_in_a_method_never_called_is_ignored(backend, monkeypatch):
    result = migrate_source(CASE.read_bytes(), Options(backend=backend))
    assert result.changed and not _codes(result) & {"DST905", "DST954"}, result.findings
    assert "configure_optimizers" not in _written(result)
    # control: with the fact switched off the method's optimizer is counted again: refused (DDP,
    # FSDP: its model cannot be named), or wrapped inside the method too (Horovod)
    monkeypatch.setattr(Facts, "never_runs", lambda self, fn: False)
    again = migrate_source(CASE.read_bytes(), Options(backend=backend))
    if backend == "horovod":
        assert "        optimizer = hvd.DistributedOptimizer(optimizer" in again.output.decode()
    else:
        assert not again.changed and _codes(again) & {"DST905", "DST954"}, backend


def _written(result) -> str:
    """The lines the migration added, joined."""
    before = set(CASE.read_text().splitlines())
    return "\n".join(ln for ln in result.output.decode().splitlines() if ln not in before)


@pytest.mark.parametrize("reference", [
    "",                                                                  # control: no reference
    "hooks = [model.configure_optimizers]\n",                            # the bound method handed on
    'build = getattr(model, "configure_optimizers")\n',                  # its name in a string
    "spare = model.configure_optimizers(0.1, 3e-4, (0.9, 0.95))\n",      # called
])
def test_a_method_referenced_anywhere_may_run(reference):
    import libcst as cst

    from distify.anatomy import analyse

    a = analyse(cst.parse_module(CASE.read_text().replace("model = TinyLM()\n", "model = TinyLM()\n" + reference)))
    method = next(fn for fn in a.facts.methods if fn.name.value == "configure_optimizers")
    assert a.facts.never_runs(method) is (reference == "")
    assert not a.facts.never_runs(next(fn for fn in a.facts.methods if fn.name.value == "forward"))


def test_a_module_function_nothing_calls_is_an_entry_point():
    """`def main(): ...` that the file never calls is run by a console_scripts entry point or
    fire.Fire(): its optimizer counts, and the script is migrated (main's first version of the fact
    took such a script for one with no training loop)."""
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\n\n"
        "def main():\n"
        "    model = torch.nn.Linear(2, 2)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    loader = DataLoader(list(range(8)), batch_size=2, shuffle=True)\n"
        "    for epoch in range(2):\n"
        "        for x in loader:\n"
        "            opt.zero_grad()\n"
        "            model(torch.ones(2, 2)).sum().backward()\n"
        "            opt.step()\n"
    )
    result = migrate_source(source.encode(), Options(backend="ddp"))
    assert result.changed and b"runtime.DDP(" in result.output
