"""A model that is a container (``nn.ModuleList`` / ``nn.ModuleDict``): it has no forward of its own and
its modules own every parameter. The script calls the modules it holds.

FSDP (DST121) shards each module it holds (``fully_shard`` refuses the container itself); the audit
and a second run see the container as sharded through that loop. DDP (DST101) is refused: DDP
averages gradients only when its own forward runs, which such a model never does. Which model is a
container is the library table's answer for the constructor's qualified name, not its spelling."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import analyse
from distify.engine import migrate_source
from distify.lint import lint_source
from distify.parallel import sharded_root
from distify.rules.base import Options

SCRIPT = '''\
import torch
from torch import nn as tnn
from torch.utils.data import DataLoader, TensorDataset


def main():
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 2))
    loader = DataLoader(data, batch_size=8)
    model = tnn.{container}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = ((model[{last}](torch.relu(model[{first}](x))) - y) ** 2).mean()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
'''
LIST = SCRIPT.format(container="ModuleList([tnn.Linear(8, 16), tnn.Linear(16, 2)])", first=0, last=1)
DICT = SCRIPT.format(container='ModuleDict({"a": tnn.Linear(8, 16), "b": tnn.Linear(16, 2)})', first='"a"', last='"b"')
# the same shape, the model a module of the script's own whose forward exists: sharded as one unit
OWN = LIST.replace("tnn.ModuleList(", "Stack(").replace(
    "def main():", "class Stack(tnn.ModuleList):\n    def forward(self, x):\n        return x\n\n\ndef main():"
)


def _fsdp(source: str):
    return migrate_source(source.encode(), Options(backend="fsdp"))


def test_fsdp_shards_each_module_a_list_holds_and_not_the_list():
    result = _fsdp(LIST)
    out = result.output.decode()
    assert "    for layer in model:\n        fully_shard(layer)\n    optimizer = " in out
    assert "fully_shard(model)" not in out and not result.refused
    assert _fsdp(out).output.decode() == out  # a second run sees the loop as the model's shard
    assert [f.code for f in lint_source(result.output)] == []  # the audit: the optimizer's model is sharded


def test_fsdp_shards_the_values_of_a_dict():
    out = _fsdp(DICT).output.decode()
    assert "    for layer in model.values():\n        fully_shard(layer)\n" in out
    assert "fully_shard(model)" not in out
    assert _fsdp(out).output.decode() == out


def test_a_container_class_of_the_script_with_a_forward_is_sharded_as_one_unit():
    out = _fsdp(OWN).output.decode()
    assert "    fully_shard(model)\n" in out and "for layer in" not in out


def test_ddp_refuses_a_container_model_with_the_line():
    result = migrate_source(LIST.encode(), Options(backend="ddp"))
    assert result.refused and result.output == LIST.encode()
    [why] = [f for f in result.findings if f.code == "DST101" and f.kind == "warning"]
    assert why.line == 9 and "torch.nn.ModuleList" in why.message and "no forward of its own" in why.message
    # horovod averages through the optimizer, whatever calls the modules: migrated
    assert not migrate_source(LIST.encode(), Options(backend="horovod")).refused


def _root(source: str):
    a = analyse(cst.parse_module(source))
    [site] = [c for c in a.calls if c.qualname == "torch.distributed.fsdp.fully_shard"]
    return sharded_root(a, site)


SHARDS = '''\
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
model = {value}
for m in model{held}:
    fully_shard(m)
'''


def test_the_loop_over_a_container_shards_the_container_and_no_other_loop_does():
    assert _root(SHARDS.format(value="nn.ModuleList([nn.Linear(2, 2)])", held="")) == "model"
    assert _root(SHARDS.format(value="nn.ModuleList([nn.Linear(2, 2)])", held="").replace("model =", "k = 0; model =")) == "model"
    assert _root(SHARDS.format(value="nn.ModuleDict({'a': nn.Linear(2, 2)})", held=".values()")) == "model"
    # a plain list, or a module with parameters of its own (Sequential): each call shards its module only
    assert _root(SHARDS.format(value="[nn.Linear(2, 2)]", held="")) == "m"
    assert _root(SHARDS.format(value="nn.Sequential(nn.Linear(2, 2))", held="")) == "m"
    assert _root(SHARDS.format(value="nn.ModuleDict({'a': nn.Linear(2, 2)})", held=".keys()")) == "m"
