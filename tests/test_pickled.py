"""What a checkpoint pickles whole, followed by data flow (distify.pickled): a module put in a dict that
is built first and saved by name, written into it by item assignment or update(), or handed to the
script's own saving helper, is saved as the module DDP wraps; FSDP refuses it; Horovod refuses a
DistributedOptimizer pickled whole. Each shape has its control: the same container saved without
the model in it (or the model read back out of it) is left alone or refused, never edited."""
from __future__ import annotations

import pytest

from distify.engine import migrate_source
from distify.rules.base import Options

TEMPLATE = '''\
import torch
import torch.nn as nn


def write(state, path):
    torch.save(state, path)


def save_all(net, opt, path):
    ckpt = {{"net": net, "opt": opt.state_dict()}}
    torch.save(ckpt, path)


net = nn.Linear(4, 2)
aux = nn.Linear(4, 2)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for epoch in range(2):
    for x in torch.randn(8, 4).split(2):
        optimizer.zero_grad()
        net(x).sum().backward()
        optimizer.step()
{shape}
'''

# shape -> (the saving statements, indented for the epoch loop, spelling the model {m}; the text
# DDP's migration saves for it)
SHAPES = {
    "by_name": ('    state = {{"epoch": epoch, "model": {m}}}\n    torch.save(state, "c.pt")', '"model": net.module'),
    "item": ('    state = {{"epoch": epoch}}\n    state["model"] = {m}\n    torch.save(state, "c.pt")', 'state["model"] = net.module'),
    "update": ('    state = {{}}\n    state.update(model={m})\n    torch.save(state, "c.pt")', "update(model=net.module)"),
    "dict_call": ('    state = dict(epoch=epoch, nets=[{m}])\n    torch.save(state, "c.pt")', "nets=[net.module]"),
    "nested": ('    models = {{"net": {m}}}\n    state = {{"models": models}}\n    torch.save(state, "c.pt")', '"net": net.module'),
    "helper_dict": ('    write({{"model": {m}}}, "c.pt")', '"model": net.module'),
    "helper_by_name": ('    state = {{"model": {m}}}\n    write(state, "c.pt")', '"model": net.module'),
    "helper_builds": ('    save_all({m}, optimizer, "c.pt")', '"net": runtime.unwrap(net)'),
}


def _migrate(src: str, backend: str):
    return migrate_source(src.encode(), Options(backend=backend))


def _script(shape: str, m: str) -> str:
    return TEMPLATE.format(shape=SHAPES[shape][0].format(m=m))


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_ddp_saves_the_module(shape):
    result = _migrate(_script(shape, "net"), "ddp")
    out = result.output.decode()
    assert SHAPES[shape][1] in out, out
    assert not result.refused


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_control_a_module_nobody_wraps(shape):
    """Control: the same container holding a module nobody wraps is saved as written."""
    src = _script(shape, "aux")
    out = _migrate(src, "ddp").output.decode()
    assert "aux.module" not in out and "unwrap(aux)" not in out
    assert SHAPES[shape][0].format(m="aux").splitlines()[0].strip() in out
    assert not _migrate(src, "fsdp").refused


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_fsdp_refuses(shape):
    result = _migrate(_script(shape, "net"), "fsdp")
    assert result.refused and any(f.code == "DST925" for f in result.findings), [f.message for f in result.findings]


def test_read_back_is_refused_under_ddp():
    """A dict of models that the loop also calls through: unwrapping its value would bypass DDP's
    averaging, keeping the wrapper pickles a process group; refused with the line of the read."""
    code = '    nets = {"model": net}\n    y = nets["model"](torch.randn(1, 4))\n    torch.save(nets, "c.pt")'
    result = _migrate(TEMPLATE.format(shape=code), "ddp")
    assert result.refused
    assert any(f.code == "DST102" and "read back" in f.message for f in result.findings)


def test_saved_state_dicts_are_not_touched():
    """Control: a dict of state dicts (the usual checkpoint) needs nothing of this fact."""
    code = '    state = {"model": net.state_dict(), "opt": optimizer.state_dict()}\n    torch.save(state, "c.pt")'
    for backend in ("ddp", "fsdp", "horovod"):
        result = _migrate(TEMPLATE.format(shape=code), backend)
        assert not result.refused, backend


@pytest.mark.parametrize("code", [
    '    state = {"epoch": epoch, "opt": optimizer}\n    torch.save(state, "c.pt")',
    '    state = {"epoch": epoch}\n    state["opt"] = optimizer\n    torch.save(state, "c.pt")',
    '    write({"opt": optimizer}, "c.pt")',
    '    torch.save(optimizer, "c.pt")',
])
def test_horovod_refuses_a_pickled_distributed_optimizer(code):
    result = _migrate(TEMPLATE.format(shape=code), "horovod")
    assert result.refused and any(f.code == "DST111" and "PicklingError" in f.message for f in result.findings)
    ddp = _migrate(TEMPLATE.format(shape=code), "ddp")  # a plain optimizer pickles: DDP migrates it
    assert not ddp.refused
    fsdp = _migrate(TEMPLATE.format(shape=code), "fsdp")  # its parameters would be one rank's shards
    assert fsdp.refused and any(f.code == "DST925" for f in fsdp.findings)
