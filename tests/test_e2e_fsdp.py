"""Executed FSDP2 (`--backend fsdp`): a migrated script under torchrun (2 ranks x batch B) ends with
the same FULL weights as the original run with plain python at batch 2B; each rank holds about half
of the parameters and of the optimizer state; run with plain python (a one-process group) it trains
exactly like the original at batch B.

The weights are read by FSDP_SPY (tests/e2e_support.py), not from the script's checkpoint: it
records the parameters every optimizer receives and, at exit, gathers each DTensor's full value on
every rank (p.full_tensor()) and counts the local shard sizes (p.to_local(), and the optimizer's
state tensors). So the check holds whatever the script saves, and an optimizer built before
fully_shard (holding the replaced, never-updated tensors) shows up as wrong weights and no shards.

Scenario conventions as in test_e2e_ddp.py (shuffle off, deterministic data, SGD, mean loss).
Launches are few (one torchrun per scenario, shared by the equivalence and the memory checks):
the CI budget is ~10-15 s per torchrun on 2 cores.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    FSDP_SPY,
    SCENARIOS,
    epoch_lines,
    migrate,
    run_python,
    run_torchrun,
    sitecustomize_env,
)

pytestmark = pytest.mark.e2e

B = 8  # per-rank batch size
NPROC = 2
EPOCHS = 2
FSDP_ATOL = 1e-5  # 2 ranks x B vs one process x 2B: only the float32 summation order differs
PLAIN_ATOL = 1e-6  # the migrated script without a launcher vs the original at the same batch

# name -> extra arguments (every scenario takes --batch-size, --epochs, --checkpoint)
SCENARIO_ARGS = {
    "module_level": (),
    "examples_style": ("--save-model",),
    "trainer_class": ("--checkpoint-dir", "ckpts"),
    "transformer_lm": (),
}


class Runs:
    """Each (script, launcher, batch) runs once per module; results are the spy's dumps."""

    def __init__(self, factory):
        self.factory = factory
        self._cache = {}

    def _memo(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def migrated_source(self, name: str) -> Path:
        def make():
            target = self.factory.mktemp(f"{name}-fsdp-src") / f"{name}.py"
            migrate(SCENARIOS / f"{name}.in.py", target, backend="fsdp")
            return target

        return self._memo(("src", name), make)

    def run(self, name: str, script: Path, batch: int, launcher: str, tag: str) -> dict:
        def make():
            import torch

            workdir = self.factory.mktemp(f"{name}-{tag}")
            spy = workdir.parent / f"{workdir.name}.spy"
            dumps = workdir.parent / f"{workdir.name}.dumps"
            dumps.mkdir()
            env = sitecustomize_env(spy, FSDP_SPY, {"DISTIFY_E2E_FSDP_DIR": dumps})
            args = ["--batch-size", batch, "--epochs", EPOCHS, "--checkpoint", "final.pt", *SCENARIO_ARGS[name]]
            if launcher == "torchrun":
                result = run_torchrun(script, args, nproc=NPROC, env=env, cwd=workdir)
            else:
                result = run_python(script, args, env=env, cwd=workdir)
            found = {p.stem: torch.load(p) for p in sorted(dumps.glob("rank*.pt"))}
            assert found, f"{tag}: the spy dumped nothing\n" + result.describe()
            saved = workdir / "final.pt"
            checkpoint = torch.load(saved, map_location="cpu") if saved.is_file() else None
            return {"output": result.output, "dumps": found, "checkpoint": checkpoint}

        return self._memo((name, str(script), batch, launcher), make)

    def original(self, name: str, batch: int) -> dict:
        return self.run(name, SCENARIOS / f"{name}.in.py", batch, "python", f"orig-b{batch}")

    def sharded(self, name: str) -> dict:
        return self.run(name, self.migrated_source(name), B, "torchrun", "fsdp")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory)


def max_diff(a, b) -> float:
    assert len(a) == len(b), f"{len(a)} vs {len(b)} parameters"
    worst = 0.0
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.shape == y.shape, f"parameter {i}: shape {tuple(x.shape)} vs {tuple(y.shape)}"
        worst = max(worst, (x.double() - y.double()).abs().max().item())
    return worst


def assert_sharded_equivalent(original: dict, sharded: dict, label: str) -> None:
    """Every rank's full parameters equal the original's (< FSDP_ATOL), and they are DTensors."""
    reference = original["dumps"]["ranksingle"]["params"]
    ranks = sharded["dumps"]
    assert sorted(ranks) == [f"rank{r}" for r in range(NPROC)], f"{label}: dumps from {sorted(ranks)}"
    for rank, dump in ranks.items():
        counts = dump["counts"]
        assert counts["params_sharded"] == counts["params"] > 0, (
            f"{label} {rank}: {counts['params_sharded']} of {counts['params']} optimizer parameters are "
            "DTensors: the optimizer does not hold the sharded parameters"
        )
        diff = max_diff(reference, dump["params"])
        assert diff < FSDP_ATOL, f"{label} {rank}: full weights differ from the original at batch {NPROC * B}: {diff:.3e}"


@pytest.mark.parametrize("name", list(SCENARIO_ARGS))
def test_fsdp_two_ranks_match_big_batch(runs, name):
    sharded = runs.sharded(name)
    assert_sharded_equivalent(runs.original(name, NPROC * B), sharded, name)
    lines = epoch_lines(sharded["output"])
    assert len(lines) == EPOCHS, f"{name}: epoch lines printed {len(lines)} times (rank 0 only):\n" + "\n".join(lines)


@pytest.mark.parametrize("name", list(SCENARIO_ARGS))
def test_the_checkpoint_is_the_originals(runs, name):
    """The file the sharded script saves holds what the original's own save holds at batch 2B: the
    same keys in the same order (no prefix), plain tensors of the same shapes, the same values — so
    it loads into the single-GPU model unchanged."""
    reference = runs.original(name, NPROC * B)["checkpoint"]
    saved = runs.sharded(name)["checkpoint"]
    assert reference is not None and saved is not None, f"{name}: no final.pt written"
    assert list(saved) == list(reference), f"{name}: keys {list(saved)[:4]}... vs the original's {list(reference)[:4]}..."
    for key, value in reference.items():
        got = saved[key]
        assert type(got) is type(value) and got.shape == value.shape, f"{name}: {key} is {type(got).__name__} {tuple(got.shape)}"
        assert (got.double() - value.double()).abs().max().item() < FSDP_ATOL, f"{name}: {key} differs"


def test_each_rank_holds_half_of_the_parameters_and_optimizer_state(runs):
    """The transformer LM's blocks and root are sharded: each of 2 ranks holds about half of the
    parameters and of the optimizer's momentum; together they hold all of it once."""
    dumps = runs.sharded("transformer_lm")["dumps"]
    counts = [d["counts"] for d in dumps.values()]
    full = counts[0]["params_full"]
    assert full > 10_000 and counts[0]["optim_full"] == full  # SGD momentum: one buffer per parameter
    for c in counts:
        for what in ("params", "optim"):
            share = c[f"{what}_local"] / c[f"{what}_full"]
            assert 0.45 <= share <= 0.55, f"{what}: a rank holds {share:.0%} of {c[f'{what}_full']} elements"
    assert sum(c["params_local"] for c in counts) == full
    assert sum(c["optim_local"] for c in counts) == full


def test_plain_python_trains_like_the_original(runs):
    """Without a launcher the migrated script makes a one-process group, shards over it and trains
    exactly as the original at the same batch."""
    name = "transformer_lm"
    plain = runs.run(name, runs.migrated_source(name), B, "python", "fsdp-plain")
    reference = runs.original(name, B)["dumps"]["ranksingle"]["params"]
    dump = plain["dumps"]["ranksingle"]
    assert dump["counts"]["params_sharded"] == dump["counts"]["params"]
    assert max_diff(reference, dump["params"]) < PLAIN_ATOL
    assert len(epoch_lines(plain["output"])) == EPOCHS


def test_the_lm_is_sharded_block_by_block(runs):
    text = runs.migrated_source("transformer_lm").read_text()
    assert "for block in model.transformer.h:\n        fully_shard(block)\n    fully_shard(model)\n" in text
    shard, optimizer = text.index("fully_shard(model)"), text.index("optimizer = torch.optim.SGD")
    assert shard < optimizer


# A VAE-like model whose decode (a method other than forward) is called after training on every rank.
DECODE_AFTER_TRAINING = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class TinyVAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(12, 4)
        self.dec = nn.Linear(4, 12)

    def encode(self, x):
        return torch.tanh(self.enc(x))

    def decode(self, z):
        return torch.sigmoid(self.dec(z))

    def forward(self, x):
        return self.decode(self.encode(x))


torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = TinyVAE().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
data = torch.rand(64, 12, generator=torch.Generator().manual_seed(1))
loader = DataLoader(TensorDataset(data), batch_size=8, shuffle=False)
for epoch in range(2):
    for (x,) in loader:
        x = x.to(device)
        optimizer.zero_grad()
        F.mse_loss(model(x), x).backward()
        optimizer.step()
with torch.no_grad():
    decoded = model.decode(torch.linspace(-1, 1, 20).view(5, 4).to(device))
torch.save(model.state_dict(), "final.pt")
'''
# appended by the test to the migrated script: each rank's decode output, to compare
DUMP_DECODED = 'torch.save(decoded, f"decoded_rank{dist.get_rank()}.pt")\n'


def test_a_registered_method_gathers_the_shards_on_every_rank(tmp_path):
    """DST121 registers `decode` (called after training) with register_fsdp_forward_method: under
    torchrun both ranks decode with the gathered weights, and get what the saved full model's decode
    gives. The control, the same migrated script without the register line, crashes: FSDP2 gathers
    parameters only around forward, so decode meets DTensor shards."""
    import torch

    src = tmp_path / "vae.in.py"
    src.write_text(DECODE_AFTER_TRAINING)
    script = tmp_path / "run" / "vae.py"
    migrate(src, script, backend="fsdp")
    text = script.read_text()
    register = 'register_fsdp_forward_method(model, "decode")\n'
    assert "fully_shard(model)\n" + register in text, text
    script.write_text(text + DUMP_DECODED)
    run_torchrun(script, nproc=NPROC, cwd=script.parent)

    namespace: dict = {}
    exec(compile(DECODE_AFTER_TRAINING.split("torch.manual_seed(0)")[0], "vae", "exec"), namespace)
    plain = namespace["TinyVAE"]()
    plain.load_state_dict(torch.load(script.parent / "final.pt"))
    with torch.no_grad():
        expected = plain.decode(torch.linspace(-1, 1, 20).view(5, 4))
    for rank in range(NPROC):
        got = torch.load(script.parent / f"decoded_rank{rank}.pt")
        assert type(got) is torch.Tensor and torch.allclose(got, expected, atol=1e-6), f"rank {rank}: {got}"

    control = tmp_path / "control" / "vae.py"
    control.parent.mkdir()
    control.write_text(text.replace(register, "") + DUMP_DECODED)
    result = run_torchrun(control, nproc=NPROC, cwd=control.parent, check=False)
    assert result.returncode != 0 and "mixed torch.Tensor and DTensor" in result.output, result.describe()
