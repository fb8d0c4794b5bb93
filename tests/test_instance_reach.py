"""The model a class wraps, reached outside the class through an instance (distify.instance_reach).

``trainer = Trainer(...)`` whose ``__init__`` builds and wraps ``self.model``: ``trainer.model`` in
``main()`` is the wrapper. These check the shapes the fact follows (the construction's name, a global
read by a function, a function's parameter the instance is handed to, an alias of the attribute, an
attribute of another class's instance), that a name not always holding an instance (rebound, or a
wrap outside ``__init__``) is reached with ``runtime.unwrap`` (right either way), that the decision
is by what the names are (renamed, the same migration), and the audit (DST957) on the old output.
Each has its control: the same script with the construction of another class, or before the fix's
fact (``attribute_reach`` returning nothing), leaves the state of the wrapper saved.
"""
from __future__ import annotations

import textwrap

import pytest

import distify.instance_reach as instance_reach
import distify.rules.base as rules_base
from distify.engine import migrate_source
from distify.rules.base import Options


def _out(src: str, backend: str = "ddp") -> str:
    return migrate_source(textwrap.dedent(src).encode(), Options(backend=backend)).output.decode()


HEAD = """
import copy
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, loader):
        self.loader = loader
        self.model = nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def fit(self):
        for x, y in self.loader:
            self.opt.zero_grad()
            nn.functional.mse_loss(self.model(x), y).backward()
            self.opt.step()


class Other:
    def __init__(self):
        self.model = nn.Linear(4, 1)


def data():
    return DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
"""


def test_the_construction_name_in_main():
    out = _out(HEAD + """
def main():
    trainer = Trainer(data())
    trainer.fit()
    torch.save(trainer.model.state_dict(), "m.pt")
    ema = copy.deepcopy(trainer.model)
    trainer.model.load_state_dict(torch.load("m.pt"))

main()
""")
    assert "torch.save(trainer.model.module.state_dict()" in out, out
    assert "copy.deepcopy(trainer.model.module)" in out, out
    assert "trainer.model.module.load_state_dict(" in out, out


def test_a_global_a_parameter_an_alias_and_another_instance():
    out = _out(HEAD + """
class Saver:
    def __init__(self, t):
        self.t = t

    def save(self):
        torch.save(self.t.model.state_dict(), "s.pt")


def save(t):
    torch.save(t.model.state_dict(), "p.pt")


def save_global():
    torch.save(trainer.model.state_dict(), "g.pt")


trainer = Trainer(data())
trainer.fit()
save(trainer)
save_global()
net = trainer.model
torch.save(net.state_dict(), "a.pt")
Saver(trainer).save()
""")
    assert "runtime.unwrap(t.model).state_dict()" in out, out
    assert "runtime.unwrap(trainer.model).state_dict()" in out, out  # the function reading the global
    assert "runtime.unwrap(net).state_dict()" in out, out
    assert "runtime.unwrap(self.t.model).state_dict()" in out, out


def test_an_instance_of_another_class_is_left_alone():
    """Control of the first: `Other` wraps nothing, its `.model` is a plain module."""
    out = _out(HEAD + """
def main():
    trainer = Trainer(data())
    trainer.fit()
    other = Other()
    torch.save(other.model.state_dict(), "o.pt")

main()
""")
    assert "torch.save(other.model.state_dict()" in out, out


def test_rebound_instance_and_wrap_outside_init_reach_through_unwrap():
    """`trainer` rebound to an `Other` on some path, or a class that wraps its model in a later
    method: `trainer.model` may be the plain module, so the state is read through runtime.unwrap."""
    rebound = _out(HEAD + """
def main(flag):
    trainer = Trainer(data())
    trainer.fit()
    if flag:
        trainer = Other()
    torch.save(trainer.model.state_dict(), "m.pt")

main(False)
""")
    assert "torch.save(runtime.unwrap(trainer.model).state_dict()" in rebound, rebound
    later = _out(HEAD.replace("        self.model = nn.Linear(4, 1)\n        self.opt", "        self.opt")
                 .replace("    def fit(self):\n", "    def fit(self):\n        self.model = nn.Linear(4, 1)\n"
                          "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n") + """
def main():
    trainer = Trainer(data())
    trainer.fit()
    torch.save(trainer.model.state_dict(), "m.pt")

main()
""")
    assert "runtime.DDP(nn.Linear(4, 1))" in later and "    def fit(self):\n        self.model = runtime.DDP" in later, later
    assert "torch.save(runtime.unwrap(trainer.model).state_dict()" in later, later


def test_by_what_the_names_are():
    """Renamed class, instance, attribute and method instance: the same migration, renamed."""
    src = HEAD + """
def main():
    trainer = Trainer(data())
    trainer.fit()
    torch.save(trainer.model.state_dict(), "m.pt")

main()
"""
    renamed = (src.replace("Trainer", "EvalLoaderCfg").replace("trainer", "val_loader").replace("self.model", "me.tokenizer")
               .replace("def __init__(self, loader):", "def __init__(me, loader):").replace("self.loader = loader", "me.loader = loader")
               .replace("self.opt = torch.optim.SGD(me.tokenizer", "me.opt = torch.optim.SGD(me.tokenizer")
               .replace("val_loader.model", "val_loader.tokenizer"))
    renamed = renamed.replace("def fit(self):\n        for x, y in self.loader:\n            self.opt.zero_grad()\n"
                              "            nn.functional.mse_loss(me.tokenizer(x), y).backward()\n            self.opt.step()",
                              "def fit(me):\n        for x, y in me.loader:\n            me.opt.zero_grad()\n"
                              "            nn.functional.mse_loss(me.tokenizer(x), y).backward()\n            me.opt.step()")
    assert "me.tokenizer" in renamed and "self.model" not in renamed.split("class Other")[0], renamed
    out = _out(renamed)
    assert "torch.save(val_loader.tokenizer.module.state_dict()" in out, out
    assert "me.tokenizer = runtime.DDP(" in out, out


@pytest.mark.parametrize("backend, fixed", [
    ("ddp", "torch.save(trainer.model.module.state_dict()"),
    ("fsdp", "get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))"),
])
def test_control_without_the_fact(backend, fixed, monkeypatch):
    """The fact is what fixes it: with `attribute_reach` answering nothing, the migration saves
    `trainer.model.state_dict()` of the wrapper / the shards as before, and the audit (DST957,
    which asks the same fact) flags it in that output."""
    src = HEAD + """
def main():
    trainer = Trainer(data())
    trainer.fit()
    torch.save(trainer.model.state_dict(), "m.pt")

main()
"""
    assert fixed in _out(src, backend)
    monkeypatch.setattr(rules_base, "attribute_reach", lambda a, cls, attr: [])
    broken = migrate_source(textwrap.dedent(src).encode(), Options(backend=backend))
    text = broken.output.decode()
    assert fixed not in text and "torch.save(trainer.model.state_dict()" in text, text
    assert any(f.code == "DST957" and "trainer.model" in f.message for f in broken.findings), broken.findings


def test_horovod_needs_nothing():
    out = _out(HEAD + """
def main():
    trainer = Trainer(data())
    trainer.fit()
    torch.save(trainer.model.state_dict(), "m.pt")

main()
""", backend="horovod")
    assert "torch.save(trainer.model.state_dict()" in out and "unwrap" not in out and ".module" not in out, out


def test_holders_of_a_class():
    import libcst as cst
    from distify.anatomy import analyse

    a = analyse(cst.parse_module(textwrap.dedent(HEAD + """
def save(t):
    pass

def main():
    trainer = Trainer(data())
    save(trainer)
    other = Other()
""")))
    cls = a.classes.named("Trainer")
    got = {(getattr(s, "name", None) and s.name.value, n, sure) for s, n, _since, sure in instance_reach.holders(a, cls, "model")}
    assert got == {("main", "trainer", True), ("save", "t", False)}, got


HANDED = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, net, loader):
        self.model = net.to("cpu")
        self.loader = loader
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def fit(self):
        for x, y in self.loader:
            self.opt.zero_grad()
            nn.functional.mse_loss(self.model(x), y).backward()
            self.opt.step()


def main():
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
    model = nn.Linear(4, 1)
    torch.save(model.state_dict(), "before.pt")
    trainer = Trainer(model, loader)
    trainer.fit()
    torch.save(model.state_dict(), "after.pt")

main()
"""


def test_a_module_handed_to_the_class_is_sharded_in_place(monkeypatch):
    """fully_shard(self.model) in __init__ shards the object main() handed in: `model` there holds
    the shards after the construction (gathered for the save), not before it (a plain save). DDP's
    wrapper is a new object: main()'s `model` stays the plain module. Control: without the fact
    (handed_in answering nothing) the save after the construction writes the shards, and the audit
    says so."""
    out = _out(HANDED, "fsdp")
    assert 'torch.save(model.state_dict(), "before.pt")' in out, out
    assert "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))" in out, out
    assert 'torch.save(model.state_dict(), "after.pt")' not in out, out
    ddp = _out(HANDED, "ddp")
    assert 'torch.save(model.state_dict(), "after.pt")' in ddp and "unwrap(model)" not in ddp, ddp
    monkeypatch.setattr(rules_base, "handed_in", lambda a, init, value, cls: [])
    broken = migrate_source(textwrap.dedent(HANDED).encode(), Options(backend="fsdp"))
    assert 'torch.save(model.state_dict(), "after.pt")' in broken.output.decode()
    assert any(f.code == "DST957" for f in broken.findings), broken.findings


def test_what_a_method_returns(monkeypatch):
    """`served = trainer.trained_model()` (and `m = self.trained_model()` inside the class) where the
    method returns the wrapped attribute: the wrapper, reached through runtime.unwrap. Control: the
    method's result not followed (`_got_from_methods` answering nothing) saves the wrapper's state."""
    src = HEAD.replace("    def fit(self):\n", "    def trained_model(me):\n        return me.model\n\n"
                       "    def export(self):\n        m = self.trained_model()\n        torch.save(m.state_dict(), \"e.pt\")\n\n"
                       "    def fit(self):\n") + """
def main():
    trainer = Trainer(data())
    trainer.fit()
    served = trainer.trained_model()
    torch.save(served.state_dict(), "s.pt")
    other = Other()
    plain = other.model
    torch.save(plain.state_dict(), "o.pt")

main()
"""
    out = _out(src)
    assert "torch.save(runtime.unwrap(served).state_dict()" in out, out
    assert "torch.save(runtime.unwrap(m).state_dict()" in out, out
    assert "torch.save(plain.state_dict()" in out, out
    monkeypatch.setattr(instance_reach, "_got_from_methods", lambda a, cls, attr, found: [])
    broken = _out(src)
    assert "torch.save(served.state_dict()" in broken and "torch.save(m.state_dict()" in broken, broken
