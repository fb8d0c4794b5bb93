"""Rebinding facts (a name's value lasts from one binding to the next) and where added imports go
(bound before every use distify adds). Executed versions: tests/test_e2e_real_scripts.py."""
from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from distify.anatomy import analyse
from distify.engine import migrate_source
from distify.rules.base import Options


def _stmt(module: cst.Module, text: str) -> cst.CSTNode:
    for stmt in analyse(module).stmt_parent:
        if module.code_for_node(stmt).strip().startswith(text):
            return stmt
    raise AssertionError(text)


@pytest.mark.parametrize(
    "source,expected",
    [
        ("model = Net()\nmodel = Other()\nuse(model)\n", "no"),
        ("model = Net()\nmodel = model.to(device).train()\nuse(model)\n", "yes"),
        ("model = Net()\nif reload:\n    model = Other()\nuse(model)\n", "maybe"),
        ("model = Net()\nfor epoch in range(3):\n    use(model)\n    model = Other()\n", "maybe"),
        ("model = Net()\nfor model in models:\n    use(model)\n", "no"),
        ("model = Net()\nuse(model)\nmodel = Other()\n", "yes"),
    ],
)
def test_holds(source, expected):
    module = cst.parse_module(source)
    a = analyse(module)
    since = _stmt(module, "model = Net()")
    use = _stmt(module, "use(model)")
    assert a.holds(module, "model", since, use) == expected


QUICKSTART = textwrap.dedent(
    '''\
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    import json

    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model = nn.Linear(8, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(2):
        for xb, yb in loader:
            with torch.autocast(device_type=device, enabled=False):
                loss = nn.functional.cross_entropy(model(xb.to(device)), yb.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    torch.save(model.state_dict(), "model.pt")
    model = nn.Linear(8, 3).to(device)
    model.load_state_dict(torch.load("model.pt"))
    print(model.weight.sum())
    '''
)


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
@pytest.mark.parametrize("standalone", [False, True])
def test_added_imports_come_before_their_first_use(backend, standalone):
    out = migrate_source(QUICKSTART.encode(), Options(backend=backend, standalone=standalone)).output.decode()
    lines = out.splitlines()
    setup = "dist.init_process_group" if backend == "ddp" else "hvd.init()"
    first_use = next(i for i, line in enumerate(lines) if setup in line)
    own = "import torch.distributed as dist" if backend == "ddp" else "import horovod.torch as hvd"
    assert lines.index(own) < first_use, out
    runtime = "class runtime:" if standalone else "from distify import runtime"
    runtime_use = next(i for i, line in enumerate(lines) if "runtime." in line and not line.startswith("#"))
    assert lines.index(runtime) < runtime_use, out
    assert lines.index("import json") > first_use  # the script's own late import stays where it was


def test_reloaded_model_is_not_unwrapped_and_device_stays_a_string():
    out = migrate_source(QUICKSTART.encode(), Options(backend="ddp")).output.decode()
    assert "torch.save(model.module.state_dict()" in out
    assert "model.load_state_dict(torch.load(" in out  # the fresh model is no DDP
    assert "print(model.weight.sum())" in out
    assert 'device = runtime.device().type' in out


# --- a conditional Horovod step distify cannot read is said, not left silent ----------------------

_HVD_STEP = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

ACCUM = 2
x = torch.randn(64, 4)
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (xb, yb) in enumerate(loader):
    loss = nn.functional.mse_loss(model(xb), yb) / ACCUM
    loss.backward()
    if CONDITION:
        optimizer.step()
        optimizer.zero_grad()
'''


@pytest.mark.parametrize("condition, warned", [
    ("(step + 1) % ACCUM == 0 and step > 0", True),  # not the idiom distify reads: say so
    ("torch.isfinite(loss)", True),  # a skipped step would make Horovod raise all the same
    ("(step + 1) % ACCUM == 0", False),  # control: read, backward_passes_per_step=ACCUM
    ("step + 1 == len(loader) or (step + 1) % ACCUM == 0", False),
])
def test_an_unread_horovod_step_condition_is_warned(condition, warned):
    from distify.engine import migrate_source
    from distify.rules.base import Options

    result = migrate_source(_HVD_STEP.replace("CONDITION", condition).encode(), Options(backend="horovod"))
    unsure = [f for f in result.findings if f.code == "DST111" and f.kind == "warning"]
    assert bool(unsure) == warned, result.findings
    assert ("backward_passes_per_step=ACCUM" in result.output.decode()) == (not warned)
