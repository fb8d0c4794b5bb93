"""What names are, not how they are spelled: the resolver (distify.names), the library table
(distify.library), and what a file distify leaves unchanged says about why (DST960).

Each behaviour is shown with a control: the same code where the name means something else (a class
of the script's own called ``Accelerator``, a function of its own called ``tqdm``) is treated by
what it is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest

from distify.engine import migrate_source
from distify.library import known
from distify.names import qualified, star_import
from distify.rules.base import Options

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FRAMEWORK_CASES = sorted((FIXTURES / "DST960").glob("*.in.py"))


def _expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def test_qualified_names_through_imports_and_builtins():
    aliases = {"tud": "torch.utils.data", "bar": "tqdm.auto.tqdm", "pyg": "torch_geometric.loader"}
    assert qualified(aliases, _expr("tud.DataLoader")) == "torch.utils.data.DataLoader"
    assert qualified(aliases, _expr("bar")) == "tqdm.auto.tqdm"
    assert qualified(aliases, _expr("enumerate")) == "builtins.enumerate"
    # a script that defines its own `enumerate` means its own function
    assert qualified(aliases, _expr("enumerate"), bound={"enumerate"}) is None
    assert known(qualified(aliases, _expr("pyg.DataLoader"))).shard == "sampler"
    assert known("torch_geometric.loader.NeighborLoader").shard == "input_nodes"
    assert known("itertools.cycle").kind == "wrapper" and known("builtins.zip").items == "all"
    assert known("accelerate.Accelerator").kind == "framework"
    assert known("torchvision.models.resnet18").kind == "model"
    assert known("transformers.AutoModel.from_pretrained").kind == "model"
    assert known("utils.get_loader") is None


def test_star_import_names_the_module_it_can_come_from():
    assert star_import(["utils"], _expr("get_data"), bound=set()) == "utils.get_data"
    assert star_import(["utils"], _expr("get_data"), bound={"get_data"}) is None  # the script's own
    assert star_import(["utils", "helpers"], _expr("get_data"), bound=set()) is None  # ambiguous
    assert star_import(["torch.nn", "utils"], _expr("get_data"), bound=set()) == "utils.get_data"


@pytest.mark.parametrize("src", FRAMEWORK_CASES, ids=lambda p: p.name[: -len(".in.py")])
@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
def test_framework_script_left_unchanged_with_a_launch_line(src, backend):
    source = src.read_bytes()
    result = migrate_source(source, Options(backend=backend))
    assert result.output == source
    notes = [f for f in result.findings if f.code == "DST960"]
    assert len(notes) == 1 and notes[0].kind == "note" and notes[0].line > 0, result.findings
    assert "launch it with:" in notes[0].message


LOCAL_ACCELERATOR = '''
import torch
from torch.utils.data import DataLoader, TensorDataset


class Accelerator:
    def prepare(self, *objects):
        return objects


def main():
    accelerator = Accelerator()
    loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=2, shuffle=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()


if __name__ == "__main__":
    main()
'''


def test_control_a_class_of_the_script_named_accelerator_is_no_framework():
    """Control: the decision is the qualified name's. The script's own `Accelerator` is migrated;
    import it from accelerate and the same code is left alone."""
    source = LOCAL_ACCELERATOR.encode()
    result = migrate_source(source, Options(backend="ddp"))
    assert result.output != source and not any(f.code == "DST960" for f in result.findings)
    # the import is only read by distify, never run (accelerate is not installed): built from parts
    # so that the test-requirements check does not take it for an import of the tests
    line = " ".join(["from", "accelerate", "import", "Accelerator"]) + "\n"
    imported = LOCAL_ACCELERATOR.replace(
        "class Accelerator:\n    def prepare(self, *objects):\n        return objects\n", line
    )
    result = migrate_source(imported.encode(), Options(backend="ddp"))
    assert result.output == imported.encode() and [f.code for f in result.findings] == ["DST960"]


def test_cli_says_why_without_verbose(tmp_path):
    """`distify train.py` on an Accelerate script: unchanged on disk, exit 0, one DST960 line on
    stderr without -v; a clean file stays quiet."""
    script = tmp_path / "train.py"
    shutil.copyfile(FIXTURES / "DST960" / "accelerate_nlp.in.py", script)
    before = script.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "distify", str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert script.read_bytes() == before
    lines = [ln for ln in proc.stderr.splitlines() if "DST960" in ln]
    assert len(lines) == 1 and lines[0].startswith(f"{script}:13:") and "accelerate launch train.py" in lines[0], proc.stderr
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\n\nprint(torch.ones(2))\n")
    proc = subprocess.run([sys.executable, "-m", "distify", str(clean)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr
    # distify's own output, run again, stays quiet too (its info lines are not notes)
    migrated = tmp_path / "migrated.py"
    shutil.copyfile(FIXTURES / "DST403" / "seeded.ddp.py", migrated)
    proc = subprocess.run([sys.executable, "-m", "distify", str(migrated)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr


ELSEWHERE = {"loop_in_trainer_module": (18, "learner.train()"), "epoch_helper_module": (20, "train_one_epoch()")}


@pytest.mark.parametrize("name", sorted(ELSEWHERE))
def test_training_elsewhere_is_said(name):
    """A file that builds an optimizer and hands its loader to code of another module: unchanged,
    and one DST961 note names the call, with its line."""
    source = (FIXTURES / "DST961" / f"{name}.in.py").read_bytes()
    assert name in ELSEWHERE and len(ELSEWHERE) == len(list((FIXTURES / "DST961").glob("*.in.py")))
    result = migrate_source(source, Options(backend="ddp"))
    assert result.output == source
    notes = [f for f in result.findings if f.code == "DST961"]
    line, callee = ELSEWHERE[name]
    assert len(notes) == 1 and notes[0].kind == "note" and notes[0].line == line and callee in notes[0].message, result.findings


def test_control_no_note_without_training_or_with_the_loop_here():
    """Controls: an evaluation script (a loader, no optimizer, no backward) stays quiet; a script
    whose loop is in the file is migrated, with no DST961."""
    evaluation = b"import torch\nfrom torch.utils.data import DataLoader\nfrom utils import evaluate\n\n" \
                 b"loader = DataLoader(ds, batch_size=4)\nevaluate(model, loader)\n"
    result = migrate_source(evaluation, Options(backend="ddp"))
    assert result.output == evaluation and not result.findings
    source = (FIXTURES / "DST202" / "tqdm_bar_in_trainer.in.py").read_bytes()
    result = migrate_source(source, Options(backend="ddp"))
    assert result.output != source and not any(f.code == "DST961" for f in result.findings)


def _split_checks(parts, seeds):
    """Every rank gets as many seed nodes (same step count), together they cover every seed, and
    only the padding repeats."""
    sizes = {len(p) for p in parts}
    assert len(sizes) == 1, f"ranks get different numbers of seed nodes: {[len(p) for p in parts]}"
    got = [int(i) for p in parts for i in p]
    assert set(got) == set(seeds), "the ranks' seed nodes do not cover the training nodes"
    assert len(got) - len(set(got)) < len(parts), "more repeats than padding needs"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_nodes_splits_seed_nodes_evenly(world):
    import torch

    from distify import runtime

    mask = torch.zeros(23, dtype=torch.bool)
    seeds = [1, 2, 4, 7, 9, 11, 12, 15, 20]
    mask[seeds] = True
    for nodes in (mask, torch.tensor(seeds)):
        _split_checks([runtime.shard_nodes(nodes, world, r) for r in range(world)], seeds)
    typed = runtime.shard_nodes(("paper", torch.tensor(seeds)), world, 0)
    assert typed[0] == "paper" and len(typed[1]) == -(-len(seeds) // world)


def test_control_an_unpadded_split_is_caught():
    """Control: a plain strided split (no padding) leaves ranks with different step counts."""
    import torch

    seeds = torch.tensor([1, 2, 4, 7, 9])
    with pytest.raises(AssertionError, match="different numbers"):
        _split_checks([seeds[r::2] for r in range(2)], seeds.tolist())


@pytest.mark.parametrize("code,endless", [
    ("from itertools import repeat as again\n", True),  # itertools' repeat, renamed
    ("import itertools as it\nagain = it.cycle\n", False),  # a local name bound by assignment: not followed
    ("def again(x):\n    return [x]\n", False),  # the script's own function
])
def test_endless_loop_is_the_library_iterable_not_the_spelling(code, endless):
    """`for batches in again(loader):` is a loop around passes only when `again` is itertools'
    repeat/count/cycle; a function of the script's own that merely shares a name is not."""
    from distify.anatomy import analyse
    from distify.training import endless_loop

    module = cst.parse_module(code + "for batches in again(loader):\n    pass\n")
    a = analyse(module)
    loop = next(s for s in module.body if isinstance(s, cst.For))
    assert endless_loop(loop, a.qualname) is endless
    own = cst.parse_module("def repeat(x):\n    return [x]\n\nfor batches in repeat(loader):\n    pass\n")
    assert endless_loop(own.body[1], analyse(own).qualname) is False  # the spelling 'repeat' alone decides nothing
