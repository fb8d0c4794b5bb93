"""The fact "does the training input depend on the rank?" (distify.rank_input) and its audit, DST963
(issue 22, item 4). Each shape is a fixture in fixtures/DST963; each test has its control: the same
script with a per-rank input (a loader, a per-rank seed, a per-rank generator) is not reported."""
from __future__ import annotations

from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.rules.base import Options

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "DST963"
SAME = "every rank trains on the same data; N processes do the work of one"


def _dst963(source: str, backend: str = "ddp") -> list:
    # the fixture's model is an nn.ModuleList, which DST101 refuses to wrap in DDP (no forward of its
    # own: DDP would average nothing); without DST101 the rest of the migration and the audit run
    ignore = ("DST101",) if backend == "ddp" else ()
    result = migrate_source(source.encode(), Options(backend=backend, ignore=ignore))
    return [f for f in result.findings if f.code == "DST963"]


@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
def test_full_batch_training_on_one_graph_is_reported(backend):
    source = (FIXTURES / "full_batch_graph.in.py").read_text()
    found = _dst963(source, backend)
    assert len(found) == 1 and SAME in found[0].message and found[0].line == 32
    # control: the training nodes come from a loader (sharded by DST201): the input differs by rank
    control = source.replace(
        "    for epoch in range(100):\n",
        "    nodes = torch.utils.data.DataLoader(torch.arange(30), batch_size=10, shuffle=True)\n"
        "    for epoch in range(100):\n      for train_mask in nodes:\n",
    ).replace("\n        ", "\n          ")
    assert control != source and _dst963(control, backend) == []


def _dst963_without_dst204(source: str) -> list:
    result = migrate_source(source.encode(), Options(backend="ddp", ignore=("DST204",)))
    return [f for f in result.findings if f.code == "DST963"]


def test_generated_batches_get_a_stream_per_rank_and_are_reported_without_one():
    source = (FIXTURES / "generated_batches.in.py").read_text()
    result = migrate_source(source.encode(), Options(backend="ddp"))
    assert "torch.manual_seed(torch.initial_seed() + dist.get_rank())" in result.output.decode()
    assert not [f for f in result.findings if f.code == "DST963"]
    # control: without DST204's per-rank seed the audit says every rank trains on the same data
    found = _dst963_without_dst204(source)
    assert len(found) == 1 and "torch.randn()" in found[0].message and SAME in found[0].message
    # never seeded: torch 2.13 (and random, numpy) seed each process from the OS, so the ranks differ
    unseeded = source.replace("    torch.manual_seed(0)\n", "")
    assert unseeded != source and _dst963_without_dst204(unseeded) == []
    # and a per-rank seed or generator of the script's own is a per-rank stream too
    seeded = source.replace("    fc = nn.Linear(4, 1)\n", "    fc = nn.Linear(4, 1)\n"
                            "    torch.manual_seed(1000 + int(os.environ.get('RANK', 0)))\n").replace(
        "import torch\n", "import os\n\nimport torch\n", 1)
    assert seeded != source and _dst963_without_dst204(seeded) == []
    own = source.replace("torch.randn(batch_size, 4)", "torch.randn(batch_size, 4, generator=GEN)").replace(
        "TRUE_W =", "GEN = torch.Generator()\nTRUE_W =")
    assert own != source and _dst963_without_dst204(own) == []


def test_lbfgs_over_one_tensor_is_reported():
    source = (FIXTURES / "lbfgs_one_tensor.in.py").read_text()
    assert len(_dst963(source)) == 1
    # control: the sequences come from a loader
    control = source.replace(
        "for step in range(5):\n",
        "pairs = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=2)\n"
        "for inputs, targets in pairs:\n",
    )
    assert control != source and _dst963(control) == []


def test_batch_indices_drawn_alike_are_not_dst963s():
    source = (FIXTURES / "generated_batches.in.py").read_text().replace(
        "    x = torch.randn(batch_size, 4)\n", "    x = DATA[torch.randint(0, 1000, (batch_size,))]\n").replace(
        "TRUE_W =", "DATA = torch.linspace(-1, 1, 4000).view(1000, 4)\nTRUE_W =")
    result = migrate_source(source.encode(), Options(backend="ddp"))
    codes = [f.code for f in result.findings]
    assert "DST204" in codes and "DST963" not in codes  # DST204 re-seeds per rank; DST959 audits it
