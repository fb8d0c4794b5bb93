"""distify.obtained: where the script obtains an optimizer a function of it builds and hands back,
and the one model it steps. Each shape that must name no model (the optimizer keeps its refusal) is
checked against the same script with only that difference taken out (the control: it names one)."""
from __future__ import annotations

import libcst as cst
import pytest

from distify.anatomy import analyse

BASE = '''\
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.body(x))

    def configure_optimizers(self, extra, lr):
        decay = [p for n, p in self.named_parameters() if n.endswith("weight")]
        rest = [p for n, p in self.named_parameters() if not n.endswith("weight")]
        groups = [{"params": decay, "weight_decay": extra}, {"params": rest, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr)


def build_optimizer(net, others, lr):
    return torch.optim.AdamW(net.parameters(), lr=lr)


model = Net()
optimizer = model.configure_optimizers(0.1, 1e-3)
'''


def _obtained(source: str):
    a = analyse(cst.parse_module(source))
    found = [(o.obtained.target, o.obtained.models) for o in a.optimizers if o.obtained is not None]
    return found, a


def test_the_method_on_the_model_names_it() -> None:
    found, a = _obtained(BASE)
    assert found == [("optimizer", ["model"])]
    assert [m.name for m in a.models] == ["model"] and a.models[0].optimizer is a.optimizers[0]


def test_the_builder_names_the_argument_for_its_parameter() -> None:
    src = BASE.replace("optimizer = model.configure_optimizers(0.1, 1e-3)", "opt = build_optimizer(model, [], 1e-3)")
    assert _obtained(src)[0] == [("opt", ["model"])]


@pytest.mark.parametrize("old,new,why", [
    ('{"params": rest, "weight_decay": 0.0}', '{"params": extra, "weight_decay": 0.0}',
     "a group made of a parameter the caller hands in"),
    ("        return torch.optim.AdamW(groups, lr=lr)",
     "        groups.append({\"params\": extra})\n        return torch.optim.AdamW(groups, lr=lr)",
     "a group list changed in place"),
    ("        return torch.optim.AdamW(groups, lr=lr)",
     "        opt = torch.optim.AdamW(groups, lr=lr)\n        return opt, None",
     "handed back with something else"),
    ("optimizer = model.configure_optimizers(0.1, 1e-3)",
     "optimizer = model.configure_optimizers(0.1, 1e-3)\nother = model.configure_optimizers(0.2, 1e-3)",
     "called twice"),
    ("model = Net()\n", "model = Net()\nmodel = nn.Linear(8, 1)\n", "the receiver bound to another module"),
    ('decay = [p for n, p in self.named_parameters() if n.endswith("weight")]',
     'decay = [p for n, p in self.named_parameters() if n.endswith("weight")] + list(self.probe.parameters())'
     '\n        decay += list(extra.parameters())',
     "a name augmented"),
])
def test_a_method_whose_parameters_are_not_all_the_instances_names_no_model(old, new, why) -> None:
    assert old in BASE
    assert _obtained(BASE.replace(old, new))[0] == [], why


@pytest.mark.parametrize("body,why", [
    ("    net = net.body\n    return torch.optim.AdamW(net.parameters(), lr=lr)", "the parameter rebound"),
    ("    return torch.optim.AdamW([p for net in others for p in net.parameters()], lr=lr)",
     "a comprehension's variable over modules"),
    ("    return torch.optim.AdamW(list(net.parameters()) + list(others[0].parameters()), lr=lr)", "two models"),
])
def test_a_builder_whose_parameters_are_not_one_models_names_no_model(body, why) -> None:
    plain = "    return torch.optim.AdamW(net.parameters(), lr=lr)"
    src = BASE.replace("optimizer = model.configure_optimizers(0.1, 1e-3)", "opt = build_optimizer(model, [model], 1e-3)")
    assert _obtained(src)[0] == [("opt", ["model"])]  # control
    assert _obtained(src.replace(plain, body))[0] == [], why
