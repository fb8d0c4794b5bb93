"""The instance of a method is a fact of the scope (distify.instance, Facts.instance), not the
spelling `self`: a method's first positional parameter whatever it is called, seen by the functions
nested in it; no plain function's, staticmethod's or module-level `self`. The metamorphic tests
(tests/test_metamorphic.py) rename every method's instance; these hold the reverse and the corners."""
from __future__ import annotations

import textwrap

import libcst as cst
import pytest

import distify.facts as facts_module
from distify.anatomy import analyse
from distify.engine import migrate_source
from distify.instance import receiver
from distify.rules.base import Options

SHAPES = textwrap.dedent(
    """
    class Trainer:
        def fit(this, loader):
            def step(batch):
                return this.model(batch)
            def shadow(this):
                return this
            return step, shadow

        @staticmethod
        def helper(self, loader):
            return self.loader

        @classmethod
        def build(klass, cfg):
            return klass(cfg)

        def rebound(self, other):
            self = other
            return self.model

    def train(self, loader):
        return self.loader

    self = object()
    """
)


def _functions(module: cst.Module):
    found = {}

    class V(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            found[node.name.value] = node

    module.visit(V())
    return found


@pytest.fixture(scope="module")
def shapes():
    module = cst.parse_module(SHAPES)
    return module, analyse(module), _functions(module)


def test_a_methods_instance_is_its_first_parameter_whatever_it_is_called(shapes):
    module, a, fn = shapes
    name, cls = a.facts.instance(fn["fit"])
    assert name == "this" and cls.name.value == "Trainer"
    assert a.facts.instance_attr(fn["fit"], "this.train_loader") == "train_loader"
    assert a.facts.instance(fn["step"]) == a.facts.instance(fn["fit"])  # a closure sees it


def test_no_instance_where_self_is_only_a_spelling(shapes):
    module, a, fn = shapes
    assert a.facts.instance(fn["train"]) is None  # a plain function's parameter
    assert a.facts.instance(fn["helper"]) is None  # a staticmethod's
    assert a.facts.instance(module) is None  # a module-level variable
    assert a.facts.instance(fn["shadow"]) is None  # a nested function's own parameter of that name
    assert a.facts.instance(fn["rebound"]) is None  # rebound: no longer the instance
    assert a.facts.instance_attr(fn["train"], "self.loader") is None


def test_a_classmethod_holds_the_class_not_an_instance(shapes):
    _module, a, fn = shapes
    assert a.facts.instance(fn["build"]) is None
    assert receiver(fn["build"], "class") == "klass"


def test_keys_are_shared_across_spellings_and_respelled_for_each_method():
    module = cst.parse_module(textwrap.dedent(
        """
        class T:
            def a(this):
                this.loader = make()
            def b(me):
                return me.loader
        def f(this):
            return this.loader
        """
    ))
    a, fn = analyse(module), _functions(module)
    assert a.facts.key(fn["a"], "this.loader") == a.facts.key(fn["b"], "me.loader")
    assert a.facts.key(fn["f"], "this.loader") != a.facts.key(fn["a"], "this.loader")  # f's `this` is a parameter
    assert a.facts.respell("this.loader", fn["a"], fn["b"]) == "me.loader"
    assert a.facts.respell("this.loader", fn["a"], fn["f"]) is None  # f holds no instance of T
    assert a.facts.respell("loader", fn["a"], fn["b"]) == "loader"


# A namespace spelled `self` at module level holds the training loader: the loop over it is the
# training loop like any other name's (it was taken for an instance attribute and not followed)
NAMESPACE = textwrap.dedent(
    """
    import argparse

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    NAME = argparse.Namespace()
    NAME.loader = DataLoader(TensorDataset(torch.rand(64, 4), torch.rand(64, 1)), batch_size=8, shuffle=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in NAME.loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    """
)


def _migrated(source: str) -> str:
    return migrate_source(source.encode(), Options(backend="ddp")).output.decode()


def test_a_module_level_self_is_a_plain_name():
    plain = _migrated(NAMESPACE.replace("NAME", "ns"))
    spelled = _migrated(NAMESPACE.replace("NAME", "self"))
    assert "DistributedSampler" in plain and "set_epoch(epoch)" in plain
    assert spelled == plain.replace("ns.", "self.").replace("ns =", "self =")


def test_control_the_instance_by_its_spelling_fails(monkeypatch):
    """Control: take `self` for the instance wherever it is spelled (and nothing else for one). The
    module-level namespace is then an instance attribute no method sees: its loop is not followed
    and the loader stays unsharded, so the test above fails."""
    real = facts_module.Facts.instance

    def by_spelling(self, scope):
        found = real(self, scope)
        if found is not None:
            return found if found[0] == "self" else None
        return ("self", None)

    monkeypatch.setattr(facts_module.Facts, "instance", by_spelling)
    with pytest.raises(AssertionError):
        test_a_module_level_self_is_a_plain_name()
