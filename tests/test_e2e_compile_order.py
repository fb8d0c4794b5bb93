"""Executed: torch.compile in nanoGPT's order (optimizer built, then ``if compile: model =
torch.compile(model)``, then training) under 2 ranks (issue 22, item 2).

fixtures/DST907/compile_after_optimizer.in.py is migrated with the real CLI and launched with
``--compile-backend aot_eager`` (AOTAutograd's compiled forward and backward, the path gradients
take under inductor, without inductor's C++ build that would cost minutes per process here):

- ddp (torchrun): the compiled module is what DDP wraps; every rank ends with the same parameters,
  the checkpoint equals the original's at batch 2B and keeps its ``_orig_mod.`` keys; control: the
  same script with the wrap removed ends with ranks that differ;
- fsdp (torchrun): sharded before the compile; the gathered checkpoint equals the original's at 2B
  under its ``_orig_mod.`` keys; control: without the line restoring the prefix the keys differ; the
  same for nanoGPT's checkpoint dict built in the loop (fixtures/DST307/compiled_checkpoint_dict);
- horovod (horovodrun --gloo): hvd.DistributedOptimizer averages the compiled module's gradients
  (they are the plain module's parameters'): ranks bit-identical, equal to the original at 2B;
  control: without the DistributedOptimizer line the ranks differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    PARAM_SPY,
    REPO_ROOT,
    assert_same_weights,
    load_state,
    migrate,
    run_horovodrun,
    run_python,
    run_torchrun,
    sitecustomize_env,
)

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST907" / "compile_after_optimizer.in.py"
B = 16
NPROC = 2


def _args(batch):
    return ["--batch-size", batch, "--epochs", 2, "--compile-backend", "aot_eager", "--checkpoint", "final.pt"]


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("compile-original")
    run_python(SOURCE, _args(NPROC * B), cwd=workdir, timeout=400)
    return load_state(workdir / "final.pt")


def _launch(launch, script: Path, workdir: Path):
    """(per-rank optimizer parameters at exit, final checkpoint or None)."""
    import torch

    dumps = workdir / "dumps"
    dumps.mkdir(parents=True)
    env = sitecustomize_env(workdir / "spy", PARAM_SPY, {"DISTIFY_E2E_PARAM_DIR": str(dumps)})
    launch(script, _args(B), nproc=NPROC, env=env, cwd=workdir, timeout=500)
    ranks = {r: torch.load(dumps / f"rank{r}.pt") for r in range(NPROC)}
    final = workdir / "final.pt"
    return ranks, (load_state(final) if final.is_file() else None)


def _identical(ranks) -> bool:
    import torch

    return all(all(torch.equal(a, b) for a, b in zip(ranks[0], ranks[r])) for r in ranks) and bool(ranks[0])


def _check(backend, launch, original, tmp_path, control_edit):
    script = tmp_path / "script" / f"nano_{backend}.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    assert "torch.compile(model" in text, text
    ranks, weights = _launch(launch, script, tmp_path / "run")
    assert _identical(ranks), f"{backend}: ranks ended with different parameters"
    assert all(k.startswith("_orig_mod.") for k in weights), sorted(weights)[:3]
    assert_same_weights(original, weights, atol=1e-5, label=f"{backend}: 2 ranks x {B} vs batch {NPROC * B}")

    control = script.with_name(f"control_{backend}.py")
    control.write_text(control_edit(text))
    ranks, _ = _launch(launch, control, tmp_path / "control")
    assert not _identical(ranks), f"control ({backend}): without the averaging the ranks should differ"


@pytest.mark.runs("DST907/compile_after_optimizer", "ddp")
def test_ddp_wraps_the_compiled_module(original, tmp_path):
    wrap = "model = runtime.DDP(model, device_ids=runtime.device_ids())\n"

    def unwrapped(text):
        assert text.index("model = torch.compile(") < text.index(wrap), "the wrap must follow the compile"
        return text.replace(wrap, "").replace("model.module.state_dict()", "model.state_dict()")

    _check("ddp", run_torchrun, original, tmp_path, unwrapped)


@pytest.mark.horovod
@pytest.mark.runs("DST907/compile_after_optimizer", "horovod")
def test_horovod_averages_the_compiled_modules_gradients(original, tmp_path):
    line = "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())\n"

    def unaveraged(text):
        assert line in text, text
        return text.replace(line, "")

    _check("horovod", run_horovodrun, original, tmp_path, unaveraged)


@pytest.mark.runs("DST907/compile_after_optimizer", "fsdp")
def test_fsdp_shards_then_compiles_and_keeps_the_keys(original, tmp_path):
    """fsdp (torchrun): fully_shard before the compile, the optimizer after it; the gathered full
    state equals the original's at batch 2B, under the original's `_orig_mod.` keys. Control: without
    the line that restores the prefix (get_model_state_dict drops it) the keys differ."""
    script = tmp_path / "script" / "nano_fsdp.py"
    migrate(SOURCE, script, backend="fsdp")
    text = script.read_text()
    assert text.index("fully_shard(model)") < text.index("model = torch.compile(") < text.index("optimizer = torch.optim")
    (tmp_path / "run").mkdir()
    run_torchrun(script, _args(B), nproc=NPROC, cwd=tmp_path / "run", timeout=500)
    assert_same_weights(original, load_state(tmp_path / "run" / "final.pt"), atol=1e-5,
                        label=f"fsdp: 2 ranks x {B} vs batch {NPROC * B}")

    prefix = [line for line in text.splitlines(keepends=True) if '"_orig_mod." + k' in line]
    assert len(prefix) == 1, text
    control = script.with_name("control_fsdp.py")
    control.write_text(text.replace(prefix[0], ""))
    (tmp_path / "control").mkdir()
    run_torchrun(control, _args(B), nproc=NPROC, cwd=tmp_path / "control", timeout=500)
    with pytest.raises(AssertionError, match="keys differ"):
        assert_same_weights(original, load_state(tmp_path / "control" / "final.pt"), atol=1e-5)


DICT_SOURCE = REPO_ROOT / "fixtures" / "DST307" / "compiled_checkpoint_dict.in.py"
DICT_ARGS = ["--compile-backend", "aot_eager", "--out", "ckpt.pt"]
DICT_PREFIX = 'if hasattr(model, "_orig_mod")'


@pytest.mark.parametrize("prefixed", [True, False], ids=["fsdp", "control-fsdp"])
def test_fsdp_checkpoint_dict_keeps_the_compiled_keys(tmp_path, prefixed):
    """nanoGPT's checkpoint dict built in the loop ({"model": model.state_dict(), ...}) of a compiled
    model: the gathered state in the dict DST307 writes carries the original's `_orig_mod.` keys.
    Control: with the prefix switched off the keys are the plain module's, not the original's."""
    import torch

    original = tmp_path / "original"
    original.mkdir()
    run_python(DICT_SOURCE, DICT_ARGS, cwd=original)
    want = set(load_state(original / "ckpt.pt")["model"])
    assert want and all(k.startswith("_orig_mod.") for k in want)
    script = tmp_path / "migrated" / "train.py"
    migrate(DICT_SOURCE, script, backend="fsdp")
    text = script.read_text()
    assert text.count(DICT_PREFIX) == 1, "DST307 did not restore the compiled keys in the dict"
    if not prefixed:
        script.write_text(text.replace(DICT_PREFIX, "if False", 1))
    run_torchrun(script, DICT_ARGS, nproc=2, cwd=script.parent)
    got = set(torch.load(script.parent / "ckpt.pt")["model"])
    assert (got == want) is prefixed, sorted(got)[:3]
