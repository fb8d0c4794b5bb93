"""distify.loss_scale: how a training loss grows with the batch, read from what its parts are.

Each case is a small training script in a public idiom; the fact must say `sample` only where the
loss really sums over the batch's samples (the migration then scales it), `mean` where it averages,
and `mixed`/`unknown` otherwise, whatever the names are spelled."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from distify.anatomy import analyse
from distify.loss_scale import backward_kind

HEAD = """
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--beta", type=float, default=1.0)
args = parser.parse_args()
loader = DataLoader(TensorDataset(torch.rand(64, 16), torch.rand(64, 4)), batch_size=args.batch_size)
"""

LOOP = """
model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        out = model(x)
{body}
        optimizer.step()
"""


def kinds(src: str):
    a = analyse(cst.parse_module(src), text=src)
    out = []
    for site in a.calls:
        loss, k = backward_kind(a, site)
        if loss is not None:
            out.append((k.kind, k.has_sum))
    return out


def loop(body: str, before: str = "") -> str:
    return HEAD + textwrap.dedent(before) + LOOP.format(body=textwrap.indent(textwrap.dedent(body), " " * 8))


CASES = {
    # a criterion and a functional loss, by their reduction
    "criterion_mean": ("criterion = nn.MSELoss()\n", "loss = criterion(out, y)\nloss.backward()", ("mean", False)),
    "criterion_sum": ("criterion = nn.MSELoss(reduction='sum')\n", "loss = criterion(out, y)\nloss.backward()", ("sample", True)),
    "legacy_size_average": ("criterion = nn.MSELoss(size_average=False)\n", "criterion(out, y).backward()", ("sample", True)),
    "functional_sum": ("", "loss = F.mse_loss(out, y, reduction='sum')\nloss.backward()", ("sample", True)),
    "functional_none_sum": ("", "loss = F.mse_loss(out, y, reduction='none').sum()\nloss.backward()", ("sample", True)),
    "functional_none_mean": ("", "loss = F.mse_loss(out, y, reduction='none').mean()\nloss.backward()", ("mean", False)),
    # a sum divided by the batch's size is a mean; by a number it stays a sum
    "sum_over_size": ("", "loss = F.mse_loss(out, y, reduction='sum') / x.size(0)\nloss.backward()", ("mean", False)),
    "sum_over_len": ("", "loss = F.mse_loss(out, y, reduction='sum') / len(x)\nloss.backward()", ("mean", False)),
    "sum_over_shape": ("", "loss = F.mse_loss(out, y, reduction='sum') / x.shape[0]\nloss.backward()", ("mean", False)),
    "sum_over_batch_size": ("", "loss = F.mse_loss(out, y, reduction='sum') / args.batch_size\nloss.backward()", ("mean", False)),
    "sum_over_literal": ("", "loss = F.mse_loss(out, y, reduction='sum') / 2\nloss.backward()", ("sample", True)),
    "sum_over_hyper": ("", "loss = F.mse_loss(out, y, reduction='sum') / args.beta\nloss.backward()", ("unknown", True)),
    "sum_over_mask": ("", "mask = y > 0.5\nloss = (F.mse_loss(out, y, reduction='none') * mask).sum() / mask.sum()\nloss.backward()", ("mean", False)),
    "mean_times_size": ("", "loss = F.mse_loss(out, y) * x.size(0)\nloss.backward()", ("sample", True)),
    "weighted_sum": ("", "loss = args.beta * F.mse_loss(out, y, reduction='sum')\nloss.backward()", ("sample", True)),
    # a sum plus a mean: neither
    "mixed": ("", "loss = F.mse_loss(out, y) + out.pow(2).sum()\nloss.backward()", ("mixed", True)),
    # a penalty over the parameters does not grow with the batch
    "l2_penalty": ("", "loss = F.mse_loss(out, y) + 1e-4 * sum(p.pow(2).sum() for p in model.parameters())\nloss.backward()", ("mean", False)),
    # along a dim the layout decides: unknown
    "sum_dim_mean": ("", "loss = (out - y).pow(2).sum(dim=1).mean()\nloss.backward()", ("unknown", False)),
    # mixed precision: the scaler only multiplies
    "scaler_sum": ("scaler = torch.amp.GradScaler()\n", "loss = F.mse_loss(out, y, reduction='sum')\nscaler.scale(loss).backward()", ("sample", True)),
    "scaler_mean": ("scaler = torch.amp.GradScaler()\n", "loss = F.mse_loss(out, y)\nscaler.scale(loss).backward()", ("mean", False)),
    "autograd_backward": ("", "loss = F.mse_loss(out, y, reduction='sum')\ntorch.autograd.backward(loss)", ("sample", True)),
    # a world size multiplies by a constant
    "already_scaled": ("import torch.distributed as dist\n", "loss = F.mse_loss(out, y, reduction='sum')\n(loss * dist.get_world_size()).backward()", ("sample", True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kind(case):
    before, body, want = CASES[case]
    assert kinds(loop(body, before)) == [want]


VAE = HEAD + '''
class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(16, 8)
        self.mu = nn.Linear(8, 4)
        self.logvar = nn.Linear(8, 4)
        self.dec = nn.Linear(4, 16)

    def forward(self, x):
        h = F.relu(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        return torch.sigmoid(self.dec(mu)), mu, logvar


def loss_function(recon, x, mu, logvar):
    bce = F.binary_cross_entropy(recon, x, reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


model = VAE()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(2):
    for x, _ in loader:
        optimizer.zero_grad()
        recon, mu, logvar = model(x)
        loss = loss_function(recon, x, mu, logvar)
        loss.backward()
        optimizer.step()
'''


def test_vae_loss_is_a_sum():
    """pytorch/examples' VAE: BCE summed plus the KL term as torch.sum, in the script's function,
    of what the model's forward returns (followed slot by slot)."""
    assert kinds(VAE) == [("sample", True)]


def test_vae_mean_kl_is_mixed():
    """The same with the KL term averaged: a sum plus a mean, which no one factor fixes."""
    src = VAE.replace("kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())",
                      "kld = -0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())")
    assert kinds(src) == [("mixed", True)]


TRAINER = HEAD + '''
class Trainer:
    def __init__(self, model, loader):
        self.model = model
        self.loader = loader
        self.criterion = nn.L1Loss(reduction="sum")
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_epoch(self):
        for x, y in self.loader:
            self.optimizer.zero_grad()
            loss = self.criterion(self.model(x), y)
            loss.backward()
            self.optimizer.step()


Trainer(nn.Linear(16, 4), loader).train_epoch()
'''


def test_criterion_on_the_instance():
    """`self.criterion`, assigned in __init__, read in another method."""
    assert kinds(TRAINER) == [("sample", True)]
    assert kinds(TRAINER.replace('nn.L1Loss(reduction="sum")', "nn.L1Loss()")) == [("mean", False)]


GPT = HEAD + '''
class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 4)

    def forward(self, idx, targets=None):
        logits = self.head(idx)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits, targets.argmax(-1))
        return logits, loss


model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for epoch in range(2):
    for x, y in loader:
        for micro in range(4):
            logits, loss = model(x, y)
            loss = loss / 4
            loss.backward()
        optimizer.step()
'''


def test_loss_the_model_returns():
    """nanoGPT's model returns (logits, loss); the loss its forward computes is a mean. A return
    of None on another path does not make it unknown to the reader of the slot it fills."""
    assert kinds(GPT)[0][0] in ("mean", "unknown")
    assert kinds(GPT)[0][1] is False


def test_helper_with_criterion_parameter():
    """A helper handed the criterion and the batch: both followed to the call."""
    src = HEAD + '''
def train_step(net, crit, xb, yb, opt):
    opt.zero_grad()
    loss = crit(net(xb), yb)
    loss.backward()
    opt.step()


model = nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.SmoothL1Loss(reduction="sum")
for epoch in range(2):
    for x, y in loader:
        train_step(model, criterion, x, y, optimizer)
'''
    assert kinds(src) == [("sample", True)]


def test_renaming_changes_nothing():
    """Metamorphic: the script's own names, neutral or misleading, decide nothing."""
    renamed = (VAE.replace("loss_function", "mean_loss").replace("kld", "avg").replace("bce", "mean_term")
               .replace("recon", "average").replace("logvar", "lv"))
    assert kinds(renamed) == kinds(VAE) == [("sample", True)]
    commented = VAE.replace("        loss.backward()", "        # the mean loss, averaged\n        loss.backward()")
    assert kinds(commented) == kinds(VAE)


SCALED = HEAD + '''
class Trainer:
    def __init__(self, model):
        self.model = model
        self.crit = nn.MSELoss(reduction="sum")
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.scaler = torch.amp.GradScaler(enabled=False)

    def fit(self):
        for x, y in loader:
            self.opt.zero_grad()
            loss = self.crit(self.model(x), y)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()


Trainer(nn.Linear(16, 4)).fit()
'''


def test_scaled_backward_whatever_the_instance_is_called():
    """``self.scaler.scale(loss).backward()`` runs from `loss` (a GradScaler only multiplies), also
    where the step's method names its instance otherwise than the __init__ that built the scaler
    (the metamorphic sweep's renaming; the fact once compared the two spellings). Control: a
    `scale` of an object that is no GradScaler is not seen through."""
    assert kinds(SCALED) == [("sample", True)]
    fit = SCALED.index("    def fit(self):")
    renamed = SCALED[:fit] + SCALED[fit:].replace("self", "trainer")
    assert renamed != SCALED and kinds(renamed) == [("sample", True)]
    control = SCALED.replace("torch.amp.GradScaler(enabled=False)", "Scaler()").replace("class Trainer:", "class Scaler:\n    def scale(self, t):\n        return t\n\n\nclass Trainer:")
    assert kinds(control) == [("unknown", False)]


def pairs(src: str):
    a = analyse(cst.parse_module(src), text=src)
    out = []
    for site in a.calls:
        loss, k = backward_kind(a, site)
        if loss is not None:
            out.append(None if k.pairs is None else cst.Module([]).code_for_node(k.pairs))
    return out


SIMCLR = HEAD + '''
def nt_xent(z1, z2, temperature=0.5):
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.T / temperature
    sim.fill_diagonal_(-1e9)
    n = z1.size(0)
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, targets)


encoder = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-3)
for epoch in range(2):
    for x, _ in loader:
        view1, view2 = x + 0.1 * torch.randn_like(x), x.flip(1)
        loss = nt_xent(encoder(view1), encoder(view2))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def test_contrastive_loss_pairs_the_batch():
    """SimCLR's NT-Xent: a similarity matrix of the batch with itself, found in the loss function,
    whatever it is called; the kind of the loss itself is still a mean."""
    assert pairs(SIMCLR) == ["z @ z.T"]
    assert kinds(SIMCLR) == [("mean", False)]
    renamed = SIMCLR.replace("nt_xent", "mse").replace("sim", "dist").replace("z @ z.T", "z @ z.T")
    assert pairs(renamed) == ["z @ z.T"]


def test_clip_loss_pairs_the_batch():
    src = loop("""\
        image, text = model(x), model(x.flip(1))
        logits = torch.matmul(image, text.t()) * 10.0
        labels = torch.arange(x.size(0))
        loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
        loss.backward()""")
    assert pairs(src) == ["torch.matmul(image, text.t())"]


def test_row_wise_similarity_pairs_nothing():
    """Controls: BYOL's cosine similarity of each sample with its own view, a plain classifier, a
    penalty with a matrix product of parameters: nothing pairs one sample with another."""
    byol = loop("loss = 2 - 2 * F.cosine_similarity(out, y.detach(), dim=-1).mean()\nloss.backward()")
    plain = loop("loss = F.mse_loss(out, y)\nloss.backward()")
    weights = loop("w = model[0].weight\nloss = F.mse_loss(out, y) + (w @ w.T).pow(2).sum()\nloss.backward()")
    assert pairs(byol) == pairs(plain) == pairs(weights) == [None]


def test_method_helper_gets_its_arguments():
    """A method's arguments bind its parameters after the instance (`self.energy(out)` hands `out`
    to `out_`, not to the instance), and the model's forward reads the batch it is called with."""
    src = TRAINER.replace(
        "loss = self.criterion(self.model(x), y)", "loss = self.energy(self.model(x))"
    ).replace("    def train_epoch(self):", "    def energy(self, out_):\n        return out_.pow(2).sum()\n\n    def train_epoch(self):")
    assert kinds(src) == [("sample", True)]
    assert kinds(src.replace("out_.pow(2).sum()", "out_.pow(2).mean()")) == [("mean", False)]
    vae_kl_only = VAE.replace("return bce + kld", "return kld")
    assert kinds(vae_kl_only) == [("sample", True)]
