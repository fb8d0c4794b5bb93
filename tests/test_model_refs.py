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
}
WRAP = {"ddp": "runtime.DDP(", "fsdp": "fully_shard(net)"}


def _lines(shape: str, target: str, backend: str):
    body = SHAPES[shape].format(t=target)
    out = migrate_source(TEMPLATE.format(shape=body).encode(), Options(backend=backend)).output.decode()
    lines = out.splitlines()
    wraps = [i for i, line in enumerate(lines) if WRAP[backend] in line]
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
