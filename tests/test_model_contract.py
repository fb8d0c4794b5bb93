"""DDP's contract read from the model's own code (distify.model_contract), each check with its control:
the same script with the shape taken away migrates without the remedy (or is no longer refused)."""
from __future__ import annotations

from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.rules.base import Options

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _migrate(source: str, backend: str = "ddp"):
    result = migrate_source(source.encode(), Options(backend=backend))
    return result.output.decode(), [f for f in result.findings if f.code in ("DST101", "DST104")]


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def _wraps(out: str) -> list:
    return [line for line in out.splitlines() if "runtime.DDP(" in line]


@pytest.mark.parametrize(
    "case,old,new",
    [
        # the pooler called in forward: every parameter gets a gradient
        ("DST101/unused_head.in.py", "hidden = self.embed(input_ids).mean(dim=1)",
         "hidden = self.pooler(self.embed(input_ids).mean(dim=1))"),
        # the label embedding tested for itself (a submodule that may be None), not for the input
        ("DST101/dropped_label.in.py", "if y is not None:", "if self.label_emb is not None:"),
        # nothing frozen in the loop
        ("DST101/freeze_in_loop.in.py", "        model.whiten.bias.requires_grad = False\n", "        pass\n"),
    ],
)
def test_find_unused_parameters_only_where_forward_can_skip_a_parameter(case, old, new):
    source = _fixture(case)
    out, findings = _migrate(source)
    assert [w for w in _wraps(out) if "find_unused_parameters=True" in w]
    assert any("find_unused_parameters=True" in f.message for f in findings)
    control = source.replace(old, new)
    assert control != source
    out, _ = _migrate(control)
    assert _wraps(out) and not [w for w in _wraps(out) if "find_unused_parameters" in w]


@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
def test_reentrant_checkpoint_gets_use_reentrant_false(backend):
    source = _fixture("DST104/reentrant_checkpoint.in.py")
    out, _ = _migrate(source, backend)
    assert "checkpoint(blk, x, use_reentrant=False)" in out
    explicit = source.replace("checkpoint(blk, x)", "checkpoint(blk, x, use_reentrant=True)")
    assert "checkpoint(blk, x, use_reentrant=False)" in _migrate(explicit, backend)[0]
    control = source.replace("checkpoint(blk, x)", "checkpoint(blk, x, use_reentrant=False)")
    out, findings = _migrate(control, backend)
    assert out.count("checkpoint(blk, x, use_reentrant=False)") == 1 and "use_reentrant=False, use" not in out and not [f for f in findings if f.code == "DST104"]


@pytest.mark.parametrize(
    "case,old,new",
    [
        ("DST104/dtype_flip.in.py", "        convert_models_to_fp32(model)\n        optimizer.step()\n        model.half()\n",
         "        optimizer.step()\n"),
        ("DST905/layer_optimizers.in.py", "        self.opt.step()\n", ""),
    ],
)
@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
def test_refused_shapes_and_their_controls(case, old, new, backend):
    source = _fixture(case)
    out, _ = _migrate(source, backend)
    assert out == source, "the file must come out unchanged (refused)"
    control = source.replace(old, new)
    assert control != source
    assert _migrate(control, backend)[0] != control, "without the shape the file is migrated"


def test_a_library_model_says_what_was_assumed():
    source = _fixture("DST101/unused_head.in.py").replace("model = Encoder().to(device)",
                                                           "model = nn.Transformer(d_model=16, nhead=2).to(device)")
    _, findings = _migrate(source)
    assert any(f.code == "DST104" and "assumed" in f.message for f in findings)


def test_a_module_without_parameters_left_unused_needs_nothing():
    source = _fixture("DST101/unused_head.in.py").replace(
        "        self.pooler = nn.Linear(dim, dim)\n", "        self.pooler = nn.Linear(dim, dim)\n        self.act = nn.Tanh()\n"
    ).replace("return self.classifier(hidden)", "return self.classifier(self.pooler(hidden))")
    assert "self.act = nn.Tanh()" in source and "self.pooler(hidden)" in source
    assert not [w for w in _wraps(_migrate(source)[0]) if "find_unused_parameters" in w]
    # control: a module with parameters left unused the same way
    control = source.replace("self.act = nn.Tanh()", "self.act = nn.Linear(16, 16)")
    assert [w for w in _wraps(_migrate(control)[0]) if "find_unused_parameters=True" in w]


@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
def test_unfreezing_in_the_loop_is_refused_under_every_backend(backend):
    source = _fixture("DST104/unfreeze_in_loop.in.py")
    out, findings = _migrate(source, backend)
    assert out == source and any(f.code == "DST104" and "not migrated" in f.message for f in findings)
    control = source.replace("        model.backbone.requires_grad_(True)\n", "        pass\n")
    assert control != source and _migrate(control, backend)[0] != control


def test_fsdp_refuses_a_forward_that_can_skip_parameters():
    """fully_shard has no find_unused_parameters: a parameter skipped on one rank and used on another
    makes the ranks' reduce-scatters differ in size (tests/test_e2e_fsdp_skip.py runs it). Control: the
    member tested for itself (a submodule that may be None) is no skip, and the file is migrated."""
    source = _fixture("DST101/dropped_label.in.py")
    out, findings = _migrate(source, "fsdp")
    assert out == source and any(f.code == "DST104" and "file not migrated" in f.message for f in findings)
    assert _migrate(source, "ddp")[0] != source, "DDP keeps its remedy: find_unused_parameters=True"
    control = source.replace("if y is not None:", "if self.label_emb is not None:")
    assert control != source and "fully_shard(model)" in _migrate(control, "fsdp")[0]


def test_fsdp_shards_a_model_whose_unused_member_is_skipped_on_every_rank():
    """A member never reached from forward gets no gradient on any rank alike: FSDP2 trains it (run in
    tests/test_e2e_fsdp_skip.py). Control: reached under a condition instead, it is refused."""
    source = _fixture("DST101/unused_head.in.py")
    assert "fully_shard(model)" in _migrate(source, "fsdp")[0]
    control = source.replace("return self.classifier(hidden)",
                             "return self.classifier(self.pooler(hidden) if input_ids.sum() > 0 else hidden)")
    assert control != source and _migrate(control, "fsdp")[0] == control


# a second backward through a forward whose graph an earlier backward kept (distify.retained_graph) ----

_RETAINED = "a second time (the backward at line"


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
@pytest.mark.parametrize(
    "old,new,refused",
    [
        # as written: D's loss reaches netG's forward through `fake` and keeps the graph; G's loss runs
        # through the same forward again
        ("", "", True),
        # control: D reads a detached copy, so only G's backward runs through netG's forward
        ("bce(netD(fake), torch.zeros", "bce(netD(fake.detach()), torch.zeros", False),
        # control: G's loss from a fresh forward of netG
        ("lossG = bce(netD(fake),", "lossG = bce(netD(netG(torch.randn(64, 4, device=device))),", False),
        # control: the first backward keeps nothing, so nothing runs through a kept graph (a second
        # backward through a freed graph is torch's own error, loud)
        ("lossD.backward(retain_graph=True)", "lossD.backward()", False),
    ],
)
def test_second_backward_through_a_kept_forward_is_refused(old, new, refused, backend):
    source = _fixture("DST111/gan_no_detach.in.py").replace(old, new) if old else _fixture("DST111/gan_no_detach.in.py")
    result = migrate_source(source.encode(), Options(backend=backend))
    said = [f for f in result.findings if f.code == "DST104" and _RETAINED in f.message]
    assert bool(said) == refused and result.refused == refused, [f.message for f in result.findings]
    if refused:
        assert said[0].line == 23 and "forward of netG at line 14" in said[0].message


RNN = """\
import torch
import torch.nn as nn

rnn = nn.RNN(4, 8)
head = nn.Linear(8, 1)
model = nn.ModuleDict({"rnn": rnn, "head": head})
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 5, 4), torch.randn(32, 1)), batch_size=4)
hidden = torch.zeros(1, 5, 8)
for x, y in loader:
    out, hidden = model["rnn"](x, hidden)
    loss = ((model["head"](out[-1]) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward(retain_graph=True)
    optimizer.step()
"""


def test_a_hidden_state_carried_into_the_next_step_with_its_graph_is_refused():
    """Truncated backpropagation without the detach: each step's backward runs through the previous
    steps' forwards again (found over two iterations of the loop); control: `hidden.detach()`."""
    net = RNN.replace('model = nn.ModuleDict({"rnn": rnn, "head": head})\n', "").replace(
        'model["rnn"]', "rnn").replace('model["head"]', "head").replace("model.parameters()", "rnn.parameters()")
    src = net.replace("rnn = nn.RNN(4, 8)\n", "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                      "        self.rnn = nn.RNN(4, 8)\n\n    def forward(self, x, h):\n        return self.rnn(x, h)\n\n\nrnn = Net()\n")
    result = migrate_source(src.encode(), Options(backend="ddp"))
    assert result.refused and any(_RETAINED in f.message for f in result.findings), [f.message for f in result.findings]
    fixed = src.replace("out, hidden = rnn(x, hidden)", "out, hidden = rnn(x, hidden.detach())")
    assert fixed != src
    ok = migrate_source(fixed.encode(), Options(backend="ddp"))
    assert not ok.refused and not any(_RETAINED in f.message for f in ok.findings), [f.message for f in ok.findings]


DCGAN_FORWARD = """\
import torch
import torch.nn as nn


class Generator(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(nn.Linear(4, 8), nn.Tanh())

    def forward(self, x):
        if x.is_cuda and self.ngpu > 1:
            out = nn.parallel.data_parallel(self.main, x, range(self.ngpu))
        else:
            out = self.main(x)
        return out


netG = Generator(1)
opt = torch.optim.Adam(netG.parameters())
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)
for epoch in range(2):
    for (x,) in loader:
        opt.zero_grad()
        netG(x).sum().backward()
        opt.step()
"""


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
def test_a_member_reached_on_both_branches_is_no_skip(backend):
    """DCGAN's forward reaches `self.main` in the `if` and in the `else`: every step gives it a
    gradient, so FSDP shards the model and DDP needs no find_unused_parameters. Control: reached in
    the `if` branch alone, it is a skip (FSDP refuses, DDP gets the remedy)."""
    out, findings = _migrate(DCGAN_FORWARD, backend)
    assert out != DCGAN_FORWARD and "find_unused_parameters" not in out, [f.message for f in findings]
    control = DCGAN_FORWARD.replace("out = self.main(x)", "out = x")
    assert control != DCGAN_FORWARD
    skipped, _ = _migrate(control, backend)
    if backend == "fsdp":
        assert skipped == control
    else:
        assert "find_unused_parameters=True" in skipped


EARLY_RETURN_FORWARD = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Detector(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(6, 8)
        self.cls = nn.Linear(8, 3)
        self.post = nn.Linear(3, 3)

    def forward(self, x, labels=None):
        feats = torch.relu(self.backbone(x))
        if labels is None:
            return self.post(self.cls(feats))
        return nn.functional.cross_entropy(self.cls(feats), labels)


model = Detector()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 6), torch.randint(0, 3, (32,))), batch_size=8)
for epoch in range(2):
    for x, y in loader:
        opt.zero_grad()
        model(x, y).backward()
        opt.step()
'''


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
def test_a_member_reached_before_and_after_an_early_return_is_no_skip(backend):
    """torchvision's detection idiom: `if targets is None: return ...` then the training path.
    `self.cls` is reached on both paths: no skip (a first version read it as reached only when the
    test holds: DDP got find_unused_parameters, FSDP refused). `self.post`, reached only in the
    early return, is a skip. Control: with `self.post` reached after the return too, nothing is."""
    out, findings = _migrate(EARLY_RETURN_FORWARD, backend)
    said = " ".join(f.message for f in findings)
    assert "Detector.post is reached only when `labels is None`" in said and "Detector.cls" not in said, said
    control = EARLY_RETURN_FORWARD.replace("return nn.functional.cross_entropy(self.cls(feats), labels)",
                                           "return nn.functional.cross_entropy(self.post(self.cls(feats)), labels)")
    assert control != EARLY_RETURN_FORWARD
    out, findings = _migrate(control, backend)
    assert out != control and "find_unused_parameters" not in out, [f.message for f in findings]
