"""Executed corpus: every runnable script in fixtures/corpus, migrated with the real CLI and launched.

A corpus script opts in with `# distify-e2e: runnable` on its first or second line (argparse
`--batch-size`, `--epochs`, `--checkpoint`, deterministic synthetic data, CPU run in a few seconds);
`# distify-e2e: runnable, equivalent` additionally promises shuffle-free, deterministic training with
a mean-reduced loss, so 2 ranks x batch B must end where the original ends with batch 2B.

For each runnable script and backend (ddp under `torchrun --standalone --nproc-per-node 2`, horovod
under `horovodrun --gloo -np 2` when Horovod is importable):

* rank consistency: a test-only sitecustomize records every parameter handed to a torch optimizer and
  dumps them per rank at exit; all ranks must hold identical parameters;
* equivalence (scripts marked `equivalent`): the checkpoint equals the original's at batch 2B.

Horovod runs a representative subset by default (see HOROVOD_DEFAULT); DISTIFY_E2E_CORPUS_FULL=1
runs all of them.

Scripts that distify leaves unchanged (it refuses them with a DST9xx warning) are skipped: there is
nothing distributed to run.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    DEPRECATION_SPY,
    REPO_ROOT,
    assert_same_weights,
    deprecations_by_author,
    load_state,
    migrate,
    original_weights,
    checked,
    run_horovodrun,
    run_torchrun,
    PARAM_SPY,
    sitecustomize_env,
)

pytestmark = pytest.mark.e2e

CORPUS = REPO_ROOT / "fixtures" / "corpus"
B = 16
NPROC = 2
EPOCHS = 2
ATOL = 1e-5
_MARK = re.compile(r"#\s*distify-e2e:\s*(.*)")


def _tags(path: Path) -> set:
    with path.open() as fh:
        head = [fh.readline() for _ in range(2)]
    for line in head:
        match = _MARK.match(line.strip())
        if match:
            return {t.strip() for t in match.group(1).split(",") if t.strip()}
    return set()


def _runnable():
    for path in sorted(CORPUS.glob("*.in.py")):
        tags = _tags(path)
        if "runnable" in tags:
            yield path.name[: -len(".in.py")], "equivalent" in tags


RUNNABLE = dict(_runnable())

# Horovod launches are slow (~2x torchrun); by default only the scripts that exercise Horovod-specific
# rewrites run under horovodrun (AMP synchronize, accumulation, two optimizers, resume broadcast,
# param groups, stateful optimizers, DataParallel removed with its .module uses, GANs averaged before
# each step). DISTIFY_E2E_CORPUS_FULL=1 runs every runnable script.
HOROVOD_DEFAULT = {
    "amp_cuda_scaler",
    "amp_torch_amp",
    "cosine_val_loop",
    "dataparallel_inline_module",
    "dataparallel_unwrap_for_save",
    "dcgan_toy",
    "encoder_decoder_two_optims",
    "gan_fixed_noise",
    "grad_accumulation",
    "grad_clip_norm",
    "local_rank_hyphen_resume",
    "param_groups_backbone",
    "vae_data_utils_alias",
}
HOROVOD_NAMES = sorted(RUNNABLE if os.environ.get("DISTIFY_E2E_CORPUS_FULL") == "1" else HOROVOD_DEFAULT & set(RUNNABLE))


def train_args(batch):
    return ["--batch-size", batch, "--epochs", EPOCHS, "--checkpoint", "final.pt"]


def _spy_env(root: Path):
    """The parameter spy and the deprecation spy (e2e_support.DEPRECATION_SPY) in one sitecustomize."""
    dumps, warnings = root / "dumps", root / "warnings"
    dumps.mkdir(parents=True, exist_ok=True)
    warnings.mkdir(parents=True, exist_ok=True)
    env = sitecustomize_env(root / "spy", PARAM_SPY + "\n\n" + DEPRECATION_SPY,
                            {"DISTIFY_E2E_PARAM_DIR": str(dumps), "DISTIFY_E2E_WARN_DIR": str(warnings)})
    return env, dumps, warnings


def _launch(launcher, script, workdir: Path, original: Path = None):
    """Run `script` on NPROC ranks in a fresh `workdir/run`; returns (run dir, per-rank params, result).
    Fails if a line distify wrote into `script` (compared with `original`, by default the corpus
    script of the same name) or the runtime provoked a deprecation warning in any process."""
    run_dir = workdir / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    env, dumps, warnings = _spy_env(workdir / "spy")
    if launcher == "torchrun":
        result = run_torchrun(script, train_args(B), nproc=NPROC, env=env, cwd=run_dir, check=False)
    else:
        result = run_horovodrun(script, train_args(B), env=env, cwd=run_dir, check=False)
    result = checked(result, launcher, script.name)
    deprecations = deprecations_by_author(warnings, original or CORPUS / f"{script.stem}.in.py", script)
    assert deprecations["distify"] == [], "distify's code provoked:\n" + "\n".join(deprecations["distify"])
    import torch

    ranks = {}
    for r in range(NPROC):
        dump = dumps / f"rank{r}.pt"
        assert dump.is_file(), f"rank {r} left no parameter dump (did it create an optimizer?)\n" + result.describe()
        ranks[r] = torch.load(dump)
    return run_dir, ranks, result


def assert_ranks_identical(ranks: dict, label: str) -> None:
    import torch

    base = ranks[0]
    assert base, f"{label}: no optimizer parameters were recorded"
    for r, params in ranks.items():
        assert len(params) == len(base), f"{label}: rank {r} has {len(params)} parameters, rank 0 {len(base)}"
        for i, (a, b) in enumerate(zip(base, params)):
            assert a.shape == b.shape, f"{label}: parameter {i} has shape {tuple(b.shape)} on rank {r}"
            if not torch.equal(a, b):
                diff = (a.double() - b.double()).abs().max().item()
                raise AssertionError(f"{label}: parameter {i} differs between rank 0 and rank {r} (max |diff| {diff:.3e})")


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    return original_weights(tmp_path_factory, CORPUS, lambda name, batch: train_args(batch))


def _migrated(name, backend, tmp_path) -> Path:
    from distify.engine import migrate_source
    from distify.options import Options

    source = CORPUS / f"{name}.in.py"
    target = tmp_path / "script" / f"{name}.py"
    if migrate_source(source.read_bytes(), Options(backend=backend)).refused:  # the CLI exits 3
        pytest.skip(f"distify refuses {name} for {backend}")
    migrate(source, target, backend=backend)
    if target.read_bytes() == source.read_bytes():
        pytest.skip(f"distify leaves {name} unchanged for {backend}")
    return target


def _check(name, equivalent, backend, launcher, originals, tmp_path):
    script = _migrated(name, backend, tmp_path)
    run_dir, ranks, result = _launch(launcher, script, tmp_path)
    assert_ranks_identical(ranks, f"{name} ({backend})")
    checkpoint = run_dir / "final.pt"
    assert checkpoint.is_file(), f"{name} ({backend}) wrote no final.pt\n" + result.describe()
    weights = load_state(checkpoint)
    assert not [k for k in weights if k.startswith("module.")], f"{name} ({backend}): checkpoint keeps 'module.'"
    if equivalent:
        assert_same_weights(originals(name, NPROC * B), weights, atol=ATOL, label=f"{name} {backend} vs batch {NPROC * B}")


def test_corpus_has_runnable_scripts():
    assert len(RUNNABLE) >= 20, sorted(RUNNABLE)


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_ddp_ranks_agree(name, originals, tmp_path):
    _check(name, RUNNABLE[name], "ddp", "torchrun", originals, tmp_path)


@pytest.mark.horovod
@pytest.mark.parametrize("name", HOROVOD_NAMES)
def test_horovod_ranks_agree(name, originals, tmp_path):
    _check(name, RUNNABLE[name], "horovod", "horovodrun", originals, tmp_path)


def test_rank_check_detects_divergence(tmp_path):
    """Control: a migrated script whose DDP wrap is removed trains two different models; the
    per-rank dump must see that."""
    script = tmp_path / "script" / "no_ddp.py"
    migrate(CORPUS / "distill_kd.in.py", script, backend="ddp")
    text = script.read_text()
    wrap = "student = runtime.DDP(MLP(20, 16, 5).to(device), device_ids=runtime.device_ids())"
    assert wrap in text, text
    script.write_text(text.replace(wrap, "student = MLP(20, 16, 5).to(device)").replace("student.module.", "student."))
    _, ranks, _ = _launch("torchrun", script, tmp_path, CORPUS / "distill_kd.in.py")
    with pytest.raises(AssertionError, match="differs between rank 0 and rank 1"):
        assert_ranks_identical(ranks, "control")


@pytest.mark.horovod
def test_horovod_gan_ranks_need_the_averaging(tmp_path):
    """Control for the GAN form of DST111: dcgan_toy's optimizers are not hvd.DistributedOptimizers,
    their gradients are averaged by one hvd.grouped_allreduce_ before each step. With those lines
    deleted the ranks (each on its own shard) end on different weights: the agreement that
    test_horovod_ranks_agree[dcgan_toy] sees is the averaging's doing, not the broadcast's."""
    script = tmp_path / "script" / "dcgan_no_average.py"
    migrate(CORPUS / "dcgan_toy.in.py", script, backend="horovod")
    lines = script.read_text().splitlines(keepends=True)
    averaging = [ln for ln in lines if "hvd.grouped_allreduce_(" in ln]
    assert len(averaging) == 2, "".join(lines)
    assert "DistributedOptimizer" not in "".join(lines)
    script.write_text("".join(ln for ln in lines if ln not in averaging))
    _, ranks, _ = _launch("horovodrun", script, tmp_path, CORPUS / "dcgan_toy.in.py")
    with pytest.raises(AssertionError, match="differs between rank 0 and rank 1"):
        assert_ranks_identical(ranks, "control")
