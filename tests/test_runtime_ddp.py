"""``runtime.DDP``: torch's DistributedDataParallel when the job has peers, a pass-through with the
same interface in a world of one.

Both the package runtime (``from distify import runtime``) and the inline class a ``--standalone``
run writes are checked, in real processes: plain ``python`` (a group of one) and ``torchrun`` with
two gloo processes. Each run trains a copy of the model the DDP way (gradient accumulation under
``no_sync()``, a registered comm hook) next to the same model trained plainly, and reports what it
got; the assertions are on weights, types and state_dict keys.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from distify import standalone
from e2e_support import run_python, run_torchrun

_SETUP = {
    "package": "from distify import runtime\n",
    "inline": "import os\n" + standalone.source(["init_kwargs", "device_ids", "DDP", "unwrap"], "ddp"),
}

_BODY = textwrap.dedent(
    """
    import copy, contextlib, json
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    dist.init_process_group(**runtime.init_kwargs())
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    plain = copy.deepcopy(net)
    model = runtime.DDP(net, device_ids=runtime.device_ids())
    model.register_comm_hook(dist.group.WORLD, allreduce_hook)
    report = {
        "world": dist.get_world_size(),
        "torch_ddp": isinstance(model, torch.nn.parallel.DistributedDataParallel),
        "isinstance": isinstance(model, runtime.DDP),
        "has_reducer": hasattr(model, "reducer"),
        "module": model.module is net,
        "keys": sorted(model.state_dict()),
        "unwrap": runtime.unwrap(model) is net,
    }
    # every rank sees the same batches: averaged gradients equal the local ones exactly
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(6, 4, generator=gen), torch.randn(6, 2, generator=gen)) for _ in range(4)]
    for m in (model, plain):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for step in range(len(batches) // 2):
            (x1, y1), (x2, y2) = batches[2 * step], batches[2 * step + 1]
            with m.no_sync() if m is model else contextlib.nullcontext():
                torch.nn.functional.mse_loss(m(x1), y1).backward()  # accumulate, no all-reduce
            torch.nn.functional.mse_loss(m(x2), y2).backward()
            opt.step()
            opt.zero_grad()
    report["same_weights"] = all(torch.equal(a, b) for a, b in zip(net.parameters(), plain.parameters()))
    with model.join():
        pass
    if report["world"] == 1:
        report["deepcopy"] = type(copy.deepcopy(model)).__name__
    if dist.get_rank() == 0:
        print("REPORT " + json.dumps(report), flush=True)
    """
)


def _script(tmp_path, flavour):
    path = tmp_path / f"ddp_{flavour}.py"
    path.write_text("import torch\nimport torch.distributed as dist\n" + _SETUP[flavour] + _BODY)
    return path


def _report(result) -> dict:
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("REPORT ")]
    assert len(lines) == 1, result.stdout + result.stderr
    return json.loads(lines[0][len("REPORT "):])


KEYS = ["module.0.bias", "module.0.weight", "module.2.bias", "module.2.weight"]


@pytest.mark.parametrize("flavour", sorted(_SETUP))
def test_one_process_gets_the_pass_through(tmp_path, flavour):
    report = _report(run_python(_script(tmp_path, flavour), cwd=tmp_path))
    assert report["world"] == 1
    # not torch's wrapper (no reducer copying gradients each step), yet recognised as DDP
    assert report["torch_ddp"] is False and report["has_reducer"] is False
    assert report["isinstance"] and report["module"] and report["unwrap"]
    # the same checkpoint keys as DDP writes, so checkpoints do not depend on the world size
    assert report["keys"] == KEYS
    # no_sync/register_comm_hook/join accepted; training is the plain model's, bit for bit
    assert report["same_weights"]
    assert report["deepcopy"] == "DDP"


@pytest.mark.parametrize("flavour", sorted(_SETUP))
def test_two_processes_get_torch_ddp(tmp_path, flavour):
    report = _report(run_torchrun(_script(tmp_path, flavour), nproc=2, cwd=tmp_path))
    assert report["world"] == 2
    assert report["torch_ddp"] is True and report["has_reducer"] is True
    assert report["isinstance"] and report["module"] and report["unwrap"]
    assert report["keys"] == KEYS
    # identical data on both ranks: the averaged gradient is the local one, exactly
    assert report["same_weights"]
