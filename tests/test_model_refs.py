"""The model reaches its initialiser, its load or its freeze under another name
(distify.model_refs): the wrap and the shard still follow the change. Each shape has its control: the
same statements aimed at another module, which nobody wraps, leave the wrap where it was."""
from __future__ import annotations

import pytest

from distify.engine import migrate_source
from distify.rules.base import Options

TEMPLATE = '''\
import torch
import torch.nn as nn


def init(m):
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, 0.0, 0.3)


def init_all(model):
    model.apply(init)


def init_each(models):
    for i, m in enumerate(models):
        m.apply(init)


def init_many(*models):
    for m in models:
        m.apply(init)


net = nn.Linear(4, 2)
aux = nn.Linear(4, 2)
{shape}
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for x in torch.randn(8, 4).split(2):
    optimizer.zero_grad()
    net(x).sum().backward()
    optimizer.step()
'''

SHAPES = {
    "alias": "g = {t}\ng.apply(init)",
    "alias_of_a_move": "g = {t}.to('cpu')\ninit_all(g)",
    "tuple_assignment": "a, b = aux, {t}\nb.load_state_dict(aux.state_dict())",
    "list_display": "for m in [aux, {t}]:\n    m.apply(init)",
    "named_container": "nets = ({t},)\nfor m in nets:\n    init_all(m)",
    "dict_values": "nets = {{'a': {t}}}\nfor m in nets.values():\n    m.apply(init)",
    "dict_items": "nets = {{'a': {t}}}\nfor k, m in nets.items():\n    m.apply(init)",
    "container_argument": "init_each([aux, {t}])",
    "keyword_argument": "init_all(model={t})",
    "submodule_alias": "w = {t}.weight\ntorch.nn.init.zeros_(w)",
    # library containers hold the modules themselves (distify.library rows of kind container)
    "module_list": "nets = nn.ModuleList([aux, {t}])\nfor m in nets:\n    m.apply(init)",
    "module_list_apply": "nn.ModuleList([aux, {t}]).apply(init)",
    "module_list_name_apply": "nets = nn.ModuleList([aux, {t}])\nnets.apply(init)",
    "module_dict": "nets = nn.ModuleDict({{'a': {t}}})\nfor m in nets.values():\n    m.apply(init)",
    # *args: a tuple of the arguments; a container spread into the call
    "star_param": "init_many(aux, {t})",
    "star_call": "nets = [aux, {t}]\ninit_many(*nets)",
    "star_into_named": "nets = [{t}]\ninit_all(*nets)",
    # items added to a container by name
    "append": "nets = []\nnets.append({t})\nfor m in nets:\n    m.apply(init)",
    "augadd": "nets = []\nnets += [{t}]\nfor m in nets:\n    m.apply(init)",
    "item": "nets = {{}}\nnets['g'] = {t}\nfor m in nets.values():\n    m.apply(init)",
}
WRAP = {"ddp": "runtime.DDP(", "fsdp": "fully_shard(net)"}


def _lines(shape: str, target: str, backend: str, shapes=SHAPES, template=TEMPLATE, wrap=WRAP):
    body = shapes[shape].format(t=target)
    out = migrate_source(template.format(shape=body).encode(), Options(backend=backend)).output.decode()
    lines = out.splitlines()
    wraps = [i for i, line in enumerate(lines) if wrap[backend] in line]
    assert len(wraps) == 1, out
    return lines, wraps[0], lines.index(body.splitlines()[-1])


@pytest.mark.parametrize("backend", sorted(WRAP))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_wrap_follows_a_change_made_under_another_name(shape, backend):
    lines, wrap, change = _lines(shape, "net", backend)
    assert wrap > change, "\n".join(lines)
    # control: the same statements change `aux`, which is not the trained model -> wrapped where built
    lines, wrap, change = _lines(shape, "aux", backend)
    assert wrap < change and "net = " in lines[wrap - (backend == "fsdp")], "\n".join(lines)


CLASS_TEMPLATE = '''\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def init(m):
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, 0.0, 0.3)


class Trainer:
    def __init__(self):
        self.gen = nn.Linear(4, 2)
        self.aux = nn.Linear(4, 2)
{shape}
        self.optimizer = torch.optim.SGD(self.gen.parameters(), lr=0.1)
        self.loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)

    def init_weights(me):
        for net in me.nets:
            net.apply(init)

    def fit(self):
        for epoch in range(2):
            for (x,) in self.loader:
                self.optimizer.zero_grad()
                self.gen(x).sum().backward()
                self.optimizer.step()


if __name__ == "__main__":
    Trainer().fit()
'''

# containers on the instance, read in another method whose instance parameter has another name (what
# counts is that it is the method's first parameter; the anatomy itself still knows models as `self.`)
CLASS_SHAPES = {
    "direct": "        self.{t}.apply(init)",
    "same_method": "        self.nets = [self.aux, self.{t}]\n        for net in self.nets:\n            net.apply(init)",
    "other_method": "        self.nets = [self.aux, self.{t}]\n        self.init_weights()",
    "module_list_other_method": "        self.nets = nn.ModuleList([self.aux, self.{t}])\n        self.init_weights()",
}
CLASS_WRAP = {"ddp": "runtime.DDP(", "fsdp": "fully_shard(self.gen)"}


@pytest.mark.parametrize("backend", sorted(CLASS_WRAP))
@pytest.mark.parametrize("shape", sorted(CLASS_SHAPES))
def test_the_wrap_follows_a_change_through_the_instance(shape, backend):
    def lines_of(target):
        return _lines(shape, target, backend, CLASS_SHAPES, CLASS_TEMPLATE, CLASS_WRAP)

    lines, wrap, change = lines_of("gen")
    assert wrap > change, "\n".join(lines)
    # control: the same statements change `aux`, which is not trained -> wrapped where built
    lines, wrap, change = lines_of("aux")
    assert wrap < change, "\n".join(lines)
