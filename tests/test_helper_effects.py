"""A script migrated alone calls its project's helpers as they are: a helper that writes a file or
prints does so on every rank. The audit says so (DST955 / DST956) with the script's line and the
helper's file:line, through the program model (distify.helper_effects), never by a name."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.options import Options

SCRIPT = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from helpers import keep, show, quiet, nested_keep

def main():
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4, shuffle=True)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        keep({"m": model.state_dict()}, "ck.pt")
        show(epoch)
        quiet(epoch)
        nested_keep(model)

main()
"""

HELPERS = """\
import torch

def keep(state, path):
    torch.save(state, path)

def show(epoch):
    print("epoch", epoch)

def quiet(epoch):
    return epoch + 1

def nested_keep(model):
    with_log(model.state_dict())

def with_log(state):
    with open("log.txt", "a") as fh:
        fh.write("saved")
"""


def _warnings(tmp_path: Path, script: str = SCRIPT, helpers: str = HELPERS, backend: str = "ddp"):
    (tmp_path / "helpers.py").write_text(textwrap.dedent(helpers))
    path = tmp_path / "train.py"
    path.write_text(script)
    # the rules that guard the call of a helper that only writes or prints are left out: what is
    # tested here is what the audit says of a call left unguarded (tests/test_helper_guard.py)
    result = migrate_source(script.encode(), Options(backend=backend, ignore=("DST301", "DST302")), path=str(path))
    assert result.output != result.source  # migrated
    return [(f.line, f.code, f.message) for f in result.findings if f.code in ("DST955", "DST956")]


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_helper_writes_and_prints_every_rank_are_said(tmp_path, backend):
    found = _warnings(tmp_path, backend=backend)
    assert (15, "DST955", "keep() in helpers.py:3 writes a file (save()) on every rank; guard the call with "
            "`if runtime.is_main_process():` or let distify migrate helpers.py") in found
    assert (16, "DST956", "show() in helpers.py:6 prints (print()) on every rank; guard the call with "
            "`if runtime.is_main_process():` or let distify migrate helpers.py") in found
    # through a second project function: the write is named where it is made
    assert (18, "DST955", "nested_keep() in helpers.py:12 writes a file (open(..., 'a') through with_log() at "
            "helpers.py:15) on every rank; guard the call with `if runtime.is_main_process():` or let distify "
            "migrate helpers.py") in found
    assert not [f for f in found if f[0] == 17]  # quiet() writes and prints nothing
    assert len(found) == 3


def test_a_guarded_call_or_a_guarded_helper_is_not_reported(tmp_path):
    guarded = SCRIPT.replace("import torch\n", "import torch\nimport torch.distributed as dist\n", 1).replace(
        "        keep({", "        if dist.get_rank() == 0:\n            keep({").replace(
        "        show(epoch)", "        if dist.get_rank() == 0:\n            show(epoch)")
    found = _warnings(tmp_path, script=guarded)
    assert [f[1] for f in found] == ["DST955"] and "nested_keep()" in found[0][2]
    helpers = HELPERS.replace("    with open(", "    if torch.distributed.get_rank() == 0:\n        with open(").replace(
        '        fh.write("saved")', '            fh.write("saved")')
    assert _warnings(tmp_path / "", script=guarded, helpers=helpers) == []


def test_a_rank_handed_to_the_write_makes_it_the_ranks_own_file(tmp_path):
    script = SCRIPT.replace('keep({"m": model.state_dict()}, "ck.pt")',
                            'keep({"m": model.state_dict()}, f"ck{torch.distributed.get_rank()}.pt")')
    found = _warnings(tmp_path, script=script)
    assert not [f for f in found if "keep() in" in f[2] and "nested" not in f[2]]


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_a_loader_handed_to_a_project_method_that_trains_is_sharded(tmp_path, backend):
    """SimCLR's layout: the script builds the loader and hands it to `simclr.train(train_loader)`, a
    method of a project class that owns the epoch loop (`simclr = SimCLR(...)` binds the instance).
    The loader gets its sampler where it is built, the method's epoch loop tells it the epoch, and
    nothing is left for the audit to say about it (the goldens hold the whole diff)."""
    import shutil
    import subprocess
    import sys

    home = tmp_path / "proj"
    shutil.copytree(Path(__file__).resolve().parent.parent / "fixtures" / "corpus" / "projects" / "simclr_trainer_fit", home)
    done = subprocess.run([sys.executable, "-m", "distify", "train.py", "--backend", backend, "--no-cache"],
                          cwd=home, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "sampler=train_sampler" in (home / "train.py").read_text()
    assert "train_loader.sampler.set_epoch(epoch_counter)" in (home / "simclr.py").read_text()
    assert not [l for l in done.stderr.splitlines() if l.split(": ")[1:2] and l.split(": ")[1].startswith(("DST951", "DST955", "DST956"))], done.stderr


def test_a_loader_handed_only_to_builtins_and_the_scripts_own_functions_builds_no_program_model(tmp_path):
    """A call no import binds (``len(loader)``, the script's own ``evaluate(model, loader)``) cannot
    reach a function of another module, so asking where the loaders go reads no module of the
    project; a call into an imported helper still does (control)."""
    import libcst as cst

    from distify.anatomy import analyse
    from distify.helper_effects import loaders_handed_to_training
    from distify.program import program_of

    def handed(text):
        path = tmp_path / "train.py"
        path.write_text(text)
        a = analyse(cst.parse_module(text))
        return loaders_handed_to_training(a, str(path), Options()), program_of(a)

    script = textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def evaluate(model, loader):
            return sum(model(x).sum().item() for x, in loader)

        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
        for epoch in range(2):
            for x, in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
            print(len(loader), evaluate(model, loader))
        """)
    assert handed(script) == ([], None)
    (tmp_path / "helpers.py").write_text("def fit(model, loader):\n    pass\n")
    found, model = handed(script.replace("print(len(loader), evaluate(model, loader))",
                                         "helpers.fit(model, loader)").replace("import torch\n", "import torch\nimport helpers\n", 1))
    assert found == [] and model is not None  # asked: the program model read helpers.py
