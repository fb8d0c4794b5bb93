"""Which methods of a sharded model FSDP must gather around (distify.forward_methods): a method of
the script's own class is judged by what it does, a method of another library's class by the library
table; never by how the script names it."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from distify.anatomy import analyse
from distify.engine import migrate_source
from distify.forward_methods import runs_forward
from distify.rules.base import Options

CLASSES = '''\
import torch
import torch.nn as nn
from transformers import PreTrainedModel


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.enc = nn.Linear(8, 3)
        self.dec = nn.Linear(3, 8)
        self.meta = {"n": 3}

    def forward(self, x):
        return self.dec(self.enc(x))

    def save_weights(self, path):
        torch.save(self.state_dict(), path)
        torch.save(self.meta, path + ".json")

    def encode_batch(self, x):
        return self.enc(x)

    def scaled(self, z):
        return z * self.scale

    def head_norm(self):
        return self.dec.weight.norm()

    def reconstruct(self, x):
        return self(x)

    def via_forward(self, x):
        return self.forward(x)

    def twice(self, x):
        return self.encode_batch(x) * 2

    def shapes(self):
        return {k: v.shape for k, v in self.state_dict().items()}

    def count(self):
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def build(cls):
        return cls()


class Tuned(PreTrainedModel):
    def summary(self):
        return self.num_parameters()
'''


@pytest.fixture(scope="module")
def anatomy():
    return analyse(cst.parse_module(CLASSES))


@pytest.mark.parametrize("method,runs", [
    ("encode_batch", True), ("scaled", True), ("head_norm", True), ("reconstruct", True), ("via_forward", True),
    ("twice", True), ("save_weights", False), ("shapes", False), ("count", False), ("build", False),
    ("enc", False),  # a submodule of the class, not a method: calling it runs the submodule's own forward
])
def test_a_method_of_the_scripts_class_is_judged_by_its_body(anatomy, method, runs):
    a = anatomy
    assert runs_forward(a.classes, a.qualname, a.classes["Net"], method, foreign=False) is runs


def test_other_libraries_methods_by_the_library_table(anatomy):
    a = anatomy
    tuned = a.classes["Tuned"]
    # inherited from transformers' class: its housekeeping runs no forward, anything else may
    assert runs_forward(a.classes, a.qualname, tuned, "save_pretrained", foreign=True) is False
    assert runs_forward(a.classes, a.qualname, tuned, "generate", foreign=True) is True
    assert runs_forward(a.classes, a.qualname, None, "resize_token_embeddings", foreign=True) is False
    # the class's own method that only calls a housekeeping method of its library base
    assert runs_forward(a.classes, a.qualname, tuned, "summary", foreign=True) is False


HF_LOCAL = Path(__file__).resolve().parent.parent / "fixtures" / "corpus" / "hf_style_local.in.py"


def _registered(source: str) -> str:
    out = migrate_source(source.encode(), Options(backend="fsdp")).output.decode()
    return "".join(line for line in out.splitlines(keepends=True) if "register_fsdp_forward_method(" in line)


def test_a_save_method_of_the_scripts_class_is_not_registered_whatever_its_name():
    """hf_style_local's own save_pretrained writes state only: registered as a forward method it would
    be a collective (it all-gathers), which its rank-0 guard would deadlock. Renamed, the same."""
    source = HF_LOCAL.read_text()
    renamed = source.replace("save_pretrained", "persist")
    assert renamed != source
    assert _registered(source) == "" and _registered(renamed) == ""
    # the same method made to compute (it calls the model) is registered, under either name
    computing = renamed.replace("        os.makedirs(save_directory, exist_ok=True)\n",
                                "        self.classifier(torch.zeros(1, 16))\n        os.makedirs(save_directory, exist_ok=True)\n")
    assert computing != renamed
    assert _registered(computing) == 'register_fsdp_forward_method(model, "persist")\n'



BUILDERS = '''\
import torch
import torch.nn as nn


class Tiny(nn.Module):
    @classmethod
    def make(cls, n):
        model = cls()
        return model

    @classmethod
    def restore(cls, path):
        return torch.load(path)

    def clone(self):
        return Tiny()
'''


@pytest.mark.parametrize("expr,cls", [
    ("Tiny()", "Tiny"), ("Tiny.make(3).to('cpu')", "Tiny"),
    # every method that returns the module (facts.SELF_RETURNING, the one list of them)
    ("Tiny().apply(init_weights).eval()", "Tiny"), ("Tiny().share_memory()", "Tiny"),
    ("Tiny().to_empty(device='cpu').requires_grad_(False)", "Tiny"),
    ("Tiny.restore('w.pt')", None),  # a classmethod that returns what torch.load gives: not known
    ("Tiny.clone(x)", None),  # not a classmethod
    ("Tiny.missing()", None),
])
def test_the_class_a_model_is_built_from_also_through_a_classmethod(expr, cls):
    from distify.model_build import built_class

    a = analyse(cst.parse_module(BUILDERS))
    found = built_class(a.classes, a.qualname, cst.parse_expression(expr))
    assert (found.name.value if found is not None else None) == cls


def test_a_submodule_called_on_its_own_is_told_from_a_method(anatomy):
    """`model.enc(x)` runs a part the model keeps (DST102 and DST922 refuse it on the training path),
    a method does not count as one, nor an attribute the class never binds."""
    from distify.forward_methods import runs_submodule

    a = anatomy
    net = a.classes["Net"]
    assert runs_submodule(a.classes, net, "enc") is True
    assert runs_submodule(a.classes, net, "encode_batch") is False
    assert runs_submodule(a.classes, net, "no_such_part") is False
