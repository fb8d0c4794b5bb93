"""The output audit (DST950-DST959) and `distify lint`.

Every check is shown to fire on a deliberately broken script and to stay silent on the correct
one it was broken from (the control), on distify's own output and on hand-written DDP and Horovod
scripts in the idioms of PyTorch's and Horovod's examples (tests/lint_scripts/).
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.lint import lint_source
from distify.rules import BY_CODE
from distify.rules.base import Options

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SCRIPTS = Path(__file__).resolve().parent / "lint_scripts"
EXAMPLE = (ROOT / "examples" / "train.py").read_bytes()
AUDIT = re.compile(r"^\d+:\d+: (DST95\d) ", re.MULTILINE)


def codes(findings) -> set:
    return {f.code for f in findings if f.kind == "warning"}


def audit_codes(findings) -> set:
    return {c for c in codes(findings) if c.startswith("DST95")}


def broken(source: str, old: str, new: str) -> bytes:
    assert old in source, f"the control no longer applies: {old!r} is not in the script"
    return source.replace(old, new, 1).encode()


# ------------------------------------------------------------------ distify's own output, broken


def migrated(backend: str) -> str:
    out = migrate_source(EXAMPLE, Options(backend=backend))
    assert out.changed
    return out.output.decode()


@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
def test_the_audit_passes_distifys_output(backend) -> None:
    result = migrate_source(EXAMPLE, Options(backend=backend))
    assert audit_codes(result.findings) == set()
    assert codes(lint_source(result.output)) == set()


DDP_BREAKS = [
    ("sampler removed", ", sampler=train_sampler, num_workers=2", ", num_workers=2", {"DST951"}),
    ("set_epoch removed", "        train_sampler.set_epoch(epoch)\n", "", {"DST952"}),
    ("save unguarded", "if args.save_model and runtime.is_main_process():", "if args.save_model:", {"DST955"}),
    ("wrapper removed", "runtime.DDP(Net().to(device), device_ids=runtime.device_ids())", "Net().to(device)", {"DST954"}),
    ("wrapper keys saved", "torch.save(model.module.state_dict()", "torch.save(model.state_dict()", {"DST957"}),
    ("eval on a padding sampler", "runtime.ShardSampler(test_dataset)", "DistributedSampler(test_dataset)", {"DST953"}),
]
HVD_BREAKS = [
    ("DistributedOptimizer removed",
     "    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())\n", "", {"DST954"}),
    ("hvd.* before hvd.init()", "    hvd.init()\n", "    print(hvd.size())\n    hvd.init()\n", {"DST958"}),
    ("set_epoch removed", "        train_sampler.set_epoch(epoch)\n", "", {"DST952"}),
    ("save unguarded", "if args.save_model and hvd.rank() == 0:", "if args.save_model:", {"DST955"}),
]


@pytest.mark.parametrize(
    "backend,old,new,expected",
    [("ddp", *b[1:]) for b in DDP_BREAKS] + [("horovod", *b[1:]) for b in HVD_BREAKS],
    ids=[f"ddp-{b[0]}" for b in DDP_BREAKS] + [f"horovod-{b[0]}" for b in HVD_BREAKS],
)
def test_a_broken_migration_is_flagged(backend, old, new, expected) -> None:
    assert codes(lint_source(broken(migrated(backend), old, new))) == expected


@pytest.mark.parametrize(
    "ignored,expected",
    [("DST201", "DST951"), ("DST202", "DST952"), ("DST301", "DST955"), ("DST101", "DST954")],
)
def test_the_engine_audits_the_rewritten_module(ignored, expected) -> None:
    """With one rule switched off, the output misses what it adds; the audit of the output says so,
    at the user's line."""
    result = migrate_source(EXAMPLE, Options(backend="ddp", ignore=(ignored,)))
    assert result.changed
    assert expected in audit_codes(result.findings)
    control = migrate_source(EXAMPLE, Options(backend="ddp"))
    assert expected not in audit_codes(control.findings)
    f = next(f for f in result.findings if f.code == expected)
    assert 1 <= f.line <= EXAMPLE.count(b"\n")


def test_the_audit_reports_against_the_users_lines() -> None:
    result = migrate_source(EXAMPLE, Options(backend="ddp", ignore=("DST201",)))
    f = next(f for f in result.findings if f.code == "DST951")
    line = EXAMPLE.decode().splitlines()[f.line - 1]
    assert "train_loader = DataLoader(" in line


# ------------------------------------------------------------------ a script left unchanged


def test_an_unchanged_training_script_is_not_silent() -> None:
    src = (FIXTURES / "DST950" / "manual_sgd.in.py").read_bytes()
    result = migrate_source(src, Options())
    assert not result.changed
    assert "DST950" in codes(result.findings)
    # control: the same loop without backward() is no training script
    assert "DST950" not in codes(migrate_source(src.replace(b"loss.backward()", b"pass"), Options()).findings)


def test_dst950_stays_quiet_when_a_warning_already_explains() -> None:
    src = (FIXTURES / "DST906" / "star_args.in.py").read_bytes()
    assert "DST950" not in codes(migrate_source(src, Options()).findings)


# ------------------------------------------------------------------ lint on hand-written scripts


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.py")))
def test_lint_is_quiet_on_correct_hand_written_scripts(script) -> None:
    assert lint_source((SCRIPTS / script).read_bytes()) == ()


FSDP2_LM_SHARDING = (
    "    for layer in model.layers:\n        fully_shard(layer, mp_policy=mp)\n    fully_shard(model, mp_policy=mp)\n"
    "    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
)
OPTIMIZER_FIRST = (
    "    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
    "    for layer in model.layers:\n        fully_shard(layer, mp_policy=mp)\n    fully_shard(model, mp_policy=mp)\n"
)

MISTAKES = [
    ("ddp_trainer.py", "        self.train_data.sampler.set_epoch(epoch)\n", "", {"DST952"}),
    ("ddp_trainer.py", '"MODEL_STATE": self.model.module.state_dict()', '"MODEL_STATE": self.model.state_dict()', {"DST957"}),
    ("ddp_trainer.py", "if self.gpu_id == 0 and epoch % self.save_every == 0:", "if epoch % self.save_every == 0:",
     {"DST955", "DST956"}),
    ("ddp_spawn_trainer.py", "if self.gpu_id == 0 and epoch % self.save_every == 0:", "if epoch % self.save_every == 0:",
     {"DST955", "DST956"}),
    ("ddp_main_worker.py", "num_workers=0, sampler=train_sampler", "num_workers=0", {"DST951"}),
    ("ddp_main_worker.py", "batch_size=args.batch_size, shuffle=False)",
     "batch_size=args.batch_size, sampler=torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False))",
     {"DST953"}),
    ("ddp_main_worker.py", '    if args.rank == 0:\n        print(f" * Acc@1',
     '    if args.rank == 0:\n        dist.barrier()\n        print(f" * Acc@1', {"DST911"}),
    ("ddp_main_worker.py", "    model = torch.nn.parallel.DistributedDataParallel(model)\n", "", {"DST954"}),
    ("horovod_mnist.py",
     "    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)\n",
     "", {"DST954"}),
    ("horovod_mnist.py", "    hvd.init()\n    torch.manual_seed(args.seed)\n",
     "    torch.manual_seed(args.seed + hvd.rank())\n    hvd.init()\n", {"DST958"}),
    ("horovod_mnist.py", '    if hvd.rank() == 0:\n        torch.save(', '    if True:\n        torch.save(', {"DST955"}),
    ("horovod_mnist.py", "    train_sampler.set_epoch(epoch)\n", "", {"DST952"}),
    ("horovod_mnist.py", "test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=1000)",
     "test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=1000, "
     "sampler=torch.utils.data.distributed.DistributedSampler(test_dataset, num_replicas=hvd.size(), rank=hvd.rank()))",
     {"DST953"}),
    ("horovod_nested_train.py", "            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:",
     "            if batch_idx % args.log_interval == 0:", {"DST956"}),
    ("horovod_nested_train.py", "        train_sampler.set_epoch(epoch)\n", "", {"DST952"}),
    ("horovod_nested_train.py", "test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=50)",
     "test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=50, "
     "sampler=torch.utils.data.distributed.DistributedSampler(test_dataset, num_replicas=hvd.size(), rank=hvd.rank()))",
     {"DST953"}),
    ("ddp_char_lm.py", "torch.manual_seed(1337 + seed_offset)", "torch.manual_seed(1337)", {"DST959"}),
    ("ddp_char_lm.py", "if iter_num % eval_interval == 0 and master_process:", "if iter_num % eval_interval == 0:",
     {"DST955", "DST956"}),
    ("ddp_char_lm.py", '{"model": raw_model.state_dict()', '{"model": model.state_dict()', {"DST957"}),
    # FSDP2 (fully_shard) and FSDP1: each break of a correct hand-written script, one finding
    ("fsdp2_lm.py", "        sampler.set_epoch(epoch)\n", "", {"DST952"}),
    ("fsdp2_lm.py", FSDP2_LM_SHARDING, OPTIMIZER_FIRST, {"DST954"}),
    ("fsdp2_lm.py", "    fully_shard(model, mp_policy=mp)\n    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n",
     "    fully_shard(model, mp_policy=mp)\n    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
     "    head = nn.Linear(VOCAB, VOCAB)\n    head_optimizer = torch.optim.SGD(head.parameters(), lr=0.1)\n"
     "    head_optimizer.step()\n", {"DST954"}),
    ("fsdp2_lm.py", "    model_state = get_model_state_dict(model, options=options)\n    optim_state = "
     "get_optimizer_state_dict(model, optimizer, options=options)\n    if rank == 0:\n",
     "    if rank == 0:\n        model_state = get_model_state_dict(model, options=options)\n        optim_state = "
     "get_optimizer_state_dict(model, optimizer, options=options)\n", {"DST911"}),
    ("fsdp2_lm.py", "    model_state = get_model_state_dict(model, options=options)\n",
     "    model_state = model.state_dict()\n", {"DST957"}),
    ("fsdp2_lm.py", "    if rank == 0:\n        os.makedirs(", "    if True:\n        os.makedirs(", {"DST955"}),
    ("fsdp2_example.py", "        accuracy = evaluate(model, val_loader)\n        if rank == 0:\n",
     "        if rank == 0:\n            accuracy = evaluate(model, val_loader)\n", {"DST911"}),
    ("fsdp2_example.py", "    val_loader = DataLoader(val_set, batch_size=64)",
     "    val_loader = DataLoader(val_set, batch_size=64, sampler=ShardSampler(val_set))", {"DST953"}),
    ("fsdp2_example.py", "    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)",
     "    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)", {"DST951"}),
    ("fsdp2_example.py", "        set_model_state_dict(model, full,", "        if rank == 0:\n            set_model_state_dict(model, full,",
     {"DST911"}),
    ("fsdp1_classifier.py", "    state = model.state_dict()\n    if rank == 0:\n", "    if rank == 0:\n        state = model.state_dict()\n",
     {"DST911"}),
    ("fsdp1_classifier.py", "        sampler.set_epoch(epoch)\n", "", {"DST952"}),
    ("fsdp1_classifier.py", "        if rank == 0:\n            print(", "        if True:\n            print(", {"DST956"}),
]


@pytest.mark.parametrize("script,old,new,expected", MISTAKES, ids=[f"{m[0]}-{sorted(m[3])[0]}-{i}" for i, m in enumerate(MISTAKES)])
def test_lint_reports_the_real_mistake_and_nothing_else(script, old, new, expected) -> None:
    source = (SCRIPTS / script).read_text()
    assert codes(lint_source(broken(source, old, new))) == expected


def test_lint_scripts_flavours() -> None:
    """The FSDP lint scripts are recognised as FSDP (fully_shard, or FSDP1's wrapper), so the FSDP
    invariants are what lint checks in them."""
    import libcst as cst

    from distify.anatomy import analyse

    for script in ("fsdp2_lm.py", "fsdp2_example.py", "fsdp1_classifier.py"):
        assert analyse(cst.parse_module((SCRIPTS / script).read_bytes())).flavour == "fsdp"
    assert analyse(cst.parse_module((SCRIPTS / "ddp_trainer.py").read_bytes())).flavour == "ddp"


def test_an_optimizer_built_again_after_fully_shard_is_not_flagged() -> None:
    """Control of DST954's built-before-sharding check: the optimizer moved above fully_shard is
    flagged; the same early optimizer built again after fully_shard is the correct shape (the
    first one never steps), and so is the script as written."""
    source = (SCRIPTS / "fsdp2_lm.py").read_text()
    assert codes(lint_source(broken(source, FSDP2_LM_SHARDING, OPTIMIZER_FIRST))) == {"DST954"}
    rebuilt = broken(source, FSDP2_LM_SHARDING, "    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n" + FSDP2_LM_SHARDING)
    assert codes(lint_source(rebuilt)) == set()
    assert codes(lint_source(source.encode())) == set()


# ------------------------------------------------------------------ fixtures


def _audit_lines(path: Path) -> set:
    return set(AUDIT.findall(path.read_text())) if path.exists() else set()


# Audit findings in the fixtures of the rules: each is a shape distify refuses on purpose (its own
# warning says why) or one that issue #13 / #14 leaves to another change. Anything else the audit
# finds in a fixture's output is a distify bug, and test_fixtures fails on it.
EXPECTED = {
    ("DST204", "numpy_choice"): ("DST959", "numpy's global stream is not re-seeded per rank; DST204 warns instead"),
    ("DST903", "while_epochs"): ("DST952", "no epoch loop found; DST903 asks for set_epoch by hand"),
    ("DST906", "star_args"): ("DST951", "DataLoader arguments unpacked; DST906 refuses to shard"),
    ("DST906", "two_splats"): ("DST951", "DataLoader arguments unpacked; DST906 refuses to shard"),
    ("DST205", "no_input_nodes"): ("DST951", "a NeighborLoader without input_nodes; DST205 does not guess the node count"),
    ("DST201", "loader_in_place_comprehension"): ("DST951", "a DataLoader built in place inside a comprehension; "
                                                            "DST201 cannot name a sampler before it and says so"),
    ("DST905", "configure_optimizers_extra"): ("DST954", "the model's method builds the optimizer over its instance's "
                                                         "parameters and a list the caller hands in: no one model is "
                                                         "named, the probe alone would be wrapped, the output is refused"),
}


def test_every_audit_finding_in_a_rule_fixture_is_declared() -> None:
    seen = set()
    for path in sorted(FIXTURES.rglob("*.warnings")):
        group = path.parent.name
        if group.startswith("DST95"):
            continue  # the audit's own fixtures: scripts with the mistake, by design
        case = path.name.split(".")[0]
        for code in _audit_lines(path):
            declared = EXPECTED.get((group, case))
            assert declared is not None and declared[0] == code, (
                f"{path.relative_to(ROOT)}: the audit reports {code} in distify's output: fix the rule, or "
                "declare the finding with a reason in tests/test_audit.py EXPECTED"
            )
            seen.add((group, case))
    assert seen == set(EXPECTED), f"declared but no longer reported: {set(EXPECTED) - seen}"


@pytest.mark.parametrize("code", sorted(c for c in BY_CODE if c.startswith("DST95")))
def test_each_audit_fixture_shows_its_check(code) -> None:
    cases = list((FIXTURES / code).glob("*.in.py"))
    assert cases
    for case in cases:
        stem = case.name[: -len(".in.py")]
        found = set()
        for backend in ("ddp", "horovod"):
            found |= _audit_lines(case.with_name(f"{stem}.{backend}.warnings"))
        assert code in found, f"{case.name} does not show {code}"


# ------------------------------------------------------------------ the command line


def _distify(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "distify", *args], capture_output=True, text=True, timeout=120, input=stdin)


def test_lint_cli_exit_codes_and_nothing_rewritten(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_bytes((SCRIPTS / "horovod_mnist.py").read_bytes())
    bad = tmp_path / "bad.py"
    bad.write_bytes(broken((SCRIPTS / "horovod_mnist.py").read_text(), "    train_sampler.set_epoch(epoch)\n", ""))
    before = bad.read_bytes()
    ok = _distify("lint", str(good))
    assert ok.returncode == 0 and ok.stdout == "", ok.stderr
    found = _distify("lint", str(good), str(bad))
    assert found.returncode == 1
    assert re.fullmatch(rf"{re.escape(str(bad))}:\d+:\d+: DST952 .*\n", found.stdout)
    assert bad.read_bytes() == before
    (tmp_path / "broken.py").write_text("import torch\ndef f(:\n")
    assert _distify("lint", str(tmp_path / "broken.py")).returncode == 2
    assert _distify("lint").returncode == 2
    assert _distify("lint", str(tmp_path / "missing.py")).returncode == 2
    assert _distify("lint", "-", stdin=bad.read_text()).returncode == 1


def test_strict_exits_2_on_an_audit_warning(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(EXAMPLE)
    proc = _distify(str(script), "--check", "--strict", "--ignore", "DST202")
    assert proc.returncode == 2
    assert "DST952" in proc.stderr
    script.write_bytes(EXAMPLE)
    assert _distify(str(script), "--check", "--strict").returncode == 1  # control: changes, no warning


@pytest.mark.parametrize("code", sorted(c for c in BY_CODE if c.startswith("DST95")))
def test_explain_documents_each_audit_code(code) -> None:
    proc = _distify("--explain", code)
    assert proc.returncode == 0
    assert inspect.cleandoc(type(BY_CODE[code]).__doc__) in proc.stdout


def test_the_lint_hook_is_declared() -> None:
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    assert re.search(r"- id: distify-lint\n(?:  .*\n)*?  entry: distify lint\n", text)


def test_the_audit_does_not_import_torch() -> None:
    code = (
        "import sys; from distify.engine import migrate_source; from distify.lint import lint_source; "
        "from distify.rules.base import Options; "
        f"src = open({str(ROOT / 'examples' / 'train.py')!r}, 'rb').read(); "
        "lint_source(migrate_source(src, Options()).output); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------ a loader built in another module


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_a_module_built_loader_left_whole_is_flagged(backend) -> None:
    """loader_from_utils: distify's output passes; with the shard_loader line (and the set_epoch it
    made possible) taken out, the control, the audit reports the loader. A script that tells the
    loader's sampler the epoch without re-sharding it says its module shards it: trusted."""
    out = (FIXTURES / "corpus" / f"loader_from_utils.{backend}.py").read_text()
    assert codes(lint_source(out.encode())) == set()
    line = next(ln for ln in out.splitlines(keepends=True) if "runtime.shard_loader(" in ln)
    sharded_there = broken(out, line, "")
    assert codes(lint_source(sharded_there)) == set()
    whole = broken(sharded_there.decode(), "        training_loader.sampler.set_epoch(epoch)\n", "")
    assert codes(lint_source(whole)) == {"DST951"}


RETURNED_SHARDED = '''\
import torch
import torch.nn as nn
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard


def train(model, steps):
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(dist.get_rank())  # each rank its own inputs (else DST963)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 2, generator=data)).sum().backward()
        optimizer.step()
    return model


def main():
    dist.init_process_group("gloo")
    trained = train(nn.Linear(2, 1), 2)
    state = get_model_state_dict(trained, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save(state, "model.pt")


if __name__ == "__main__":
    main()
'''


def test_a_sharded_model_returned_by_a_function_is_followed_to_its_save() -> None:
    """DST957 follows the sharded model out of `train()` through its return value to the caller's
    `trained` (the anatomy's flow facts): saving `trained.state_dict()` writes DTensor shards.
    Control: the correct script, gathering with get_model_state_dict, is quiet."""
    assert codes(lint_source(RETURNED_SHARDED.encode())) == set()
    wrong = broken(RETURNED_SHARDED, "torch.save(state,", "torch.save(trained.state_dict(),")
    assert codes(lint_source(wrong)) == {"DST957"}


# ------------------------------------------------------------------ batches no fact traces

UNTRACED = [
    ("loader_built_in_the_loop_header",
     "for epoch in range(EPOCHS):",
     "train_loader = cifar_utils.get_training_dataloader(cifar_utils.CIFAR_MEAN, cifar_utils.CIFAR_STD)\n"
     "for epoch in range(EPOCHS):",
     "enumerate(cifar_utils.get_training_dataloader(cifar_utils.CIFAR_MEAN, cifar_utils.CIFAR_STD))",
     "enumerate(train_loader)"),
    ("endless_generator_over_a_call",
     "batches = infinite(get_training_dataloader(CIFAR_MEAN, CIFAR_STD, batch_size=8))",
     "train_loader = get_training_dataloader(CIFAR_MEAN, CIFAR_STD, batch_size=8)\n"
     "batches = infinite(train_loader)",
     None, None),
]


@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
@pytest.mark.parametrize("case, old1, new1, old2, new2", UNTRACED, ids=[u[0] for u in UNTRACED])
def test_batches_from_a_source_no_fact_traces_are_flagged(backend, case, old1, new1, old2, new2) -> None:
    """A loader built by another module's function where the loop uses it (no name holds it) can
    be re-sharded by nothing; the output says so. Control: the same loader bound to a name first is
    re-sharded (runtime.shard_loader) and nothing is flagged."""
    src = (FIXTURES / "DST951" / f"{case}.in.py").read_text()
    result = migrate_source(src.encode(), Options(backend=backend))
    assert result.changed and "DST951" in audit_codes(result.findings)
    named = broken(src, old1, new1).decode()
    if old2 is not None:
        named = broken(named, old2, new2).decode()
    control = migrate_source(named.encode(), Options(backend=backend))
    assert "shard_loader(train_loader" in control.output.decode()
    assert "DST951" not in audit_codes(control.findings)
    # lint holds distify's output (it imports the runtime) to it, not a hand-written Horovod script:
    # lint cannot know the other module does not shard what it builds
    assert ("DST951" in codes(lint_source(result.output))) == (backend != "horovod")


def test_a_while_loop_drawing_with_next_is_a_batch_loop() -> None:
    """`while step < max_steps: batch = next(data_iter)` (the iterator made again on StopIteration)
    trains on the loader it draws from, as a `for` loop over it would: another module's loader is
    re-sharded where it is bound and the output's audit is clean; a DataLoader of the script's own gets
    a DistributedSampler whatever its name. Control: with draws counted only inside `for` loops (as
    before), nothing is re-sharded and this test fails."""
    src = (FIXTURES / "DST201" / "foreign_loader_drawn_in_a_while_loop.in.py").read_text()
    result = migrate_source(src.encode(), Options(backend="ddp"))
    assert "train_loader = runtime.shard_loader(train_loader)" in result.output.decode()
    assert "DST951" not in audit_codes(result.findings)
    old = "train_loader = get_training_dataloader(CIFAR_MEAN, CIFAR_STD, batch_size=16)\n"
    own = broken(src, old, "train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset("
                 "torch.randn(64, 3, 8, 8), torch.randint(0, 4, (64,))), batch_size=16, shuffle=True)\n")
    for name in ("train_loader", "v1", "test_loader"):  # its role comes from the loop, not its name
        result = migrate_source(own.replace(b"train_loader", name.encode()), Options(backend="ddp"))
        assert "DistributedSampler" in result.output.decode() and "DST951" not in audit_codes(result.findings), name


# ------------------------------------------------------------------ optimizers built in a function


BUILDER_DDP = '''\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def build_optimizer(model, lr):
    return torch.optim.SGD(model.parameters(), lr=lr)


dist.init_process_group("gloo")
net = DDP(nn.Linear(8, 1))
optimizer = build_optimizer(net, 0.1)
for x in torch.randn(4, 8):
    optimizer.zero_grad()
    net(x).sum().backward()
    optimizer.step()
'''


@pytest.mark.parametrize("returned", ["return torch.optim.SGD(model.parameters(), lr=lr)",
                                      "opt = torch.optim.SGD(model.parameters(), lr=lr)\n    return opt"])
def test_an_optimizer_built_in_a_function_is_judged_by_what_its_callers_pass(returned) -> None:
    """DST954 follows a builder's model parameter to what each call passes. A model read inside the
    returned optimizer is not handed back (the old check took any mention in a `return` for an
    escape, so an unwrapped model passed to the builder went unreported, and distify wrote such a
    migration). Control: the same script with the model left unwrapped is reported."""
    good = BUILDER_DDP.replace("return torch.optim.SGD(model.parameters(), lr=lr)", returned)
    assert codes(lint_source(good.encode())) == set()
    bad = broken(good, "net = DDP(nn.Linear(8, 1))", "net = nn.Linear(8, 1)")
    assert codes(lint_source(bad)) == {"DST954"}


def test_a_horovod_optimizer_with_no_name_must_be_built_into_the_wrapper() -> None:
    """An optimizer handed straight to the script's own scheduling class is averaged only when it
    is built inside hvd.DistributedOptimizer (fixtures/DST111/optimizer_in_schedule); the audit
    reported only optimizers bound to a name, so the unwrapped one passed in silence. Control: the
    migrated fixture with the wrap removed."""
    source = migrate_source((FIXTURES / "DST111" / "optimizer_in_schedule.in.py").read_bytes(),
                            Options(backend="horovod")).output.decode()
    assert audit_codes(lint_source(source.encode())) == set()
    unwrapped = broken(
        source,
        "hvd.DistributedOptimizer(torch.optim.Adam(net.parameters(), lr=0, betas=(0.9, 0.98), eps=1e-9), "
        "named_parameters=net.named_parameters())",
        "torch.optim.Adam(net.parameters(), lr=0, betas=(0.9, 0.98), eps=1e-9)",
    )
    assert "DST954" in codes(lint_source(unwrapped))


def test_an_output_that_wraps_no_model_while_an_untraced_optimizer_steps_is_refused(monkeypatch) -> None:
    """distify's own output with no DDP wrap and no fully_shard at all, while an optimizer whose
    model distify cannot name steps (a method of the model building it over a list held on the
    instance, which distify.obtained does not follow): the data was sharded and each rank trained
    its own model, written with only DST905's warning. DST954 refuses it. Control: with that check
    switched off, the same migration is written again."""
    case = broken(
        (FIXTURES / "DST905" / "configure_optimizers.in.py").read_text(),
        "        return torch.optim.AdamW(groups, lr=lr)",
        "        self.groups = groups\n        return torch.optim.AdamW(self.groups, lr=lr)",
    )
    for backend in ("ddp", "fsdp"):
        result = migrate_source(case, Options(backend=backend))
        assert not result.changed and "DST954" in codes(result.findings), backend
    check = type(BY_CODE["DST954"])
    monkeypatch.setattr(check, "_nothing_wrapped", lambda self, ctx, a, stepped: None)
    result = migrate_source(case, Options(backend="ddp"))
    assert result.changed and "DST954" not in codes(result.findings)


def test_an_output_that_trains_under_a_rank_guard_is_refused(monkeypatch) -> None:
    """fixtures/DST966/print_computes_by_training: `print(epoch, self.train_epoch())` is guarded for
    rank 0 only after the epoch's value is computed on every rank (Context.guard_statement counts a
    call that trains as a hazard under every backend). Control: with that hazard not seen, the guard
    takes the training with it, and DST966 refuses the output instead of writing it. (The epoch's
    loss the method returns is reduced over the ranks, DST206, which also keeps the call off the
    guard as a collective: the control leaves DST206 out.)"""
    from distify.rules.base import Context

    case = (FIXTURES / "DST966" / "print_computes_by_training.in.py").read_bytes()
    for backend in ("ddp", "fsdp", "horovod"):
        result = migrate_source(case, Options(backend=backend))
        assert result.changed and "DST966" not in codes(result.findings), backend
    monkeypatch.setattr(Context, "training_in", lambda self, stmt: None)
    from distify.rules import dst206_reduce_train_sums

    monkeypatch.setattr(dst206_reduce_train_sums.RULE, "apply", lambda ctx: None)
    for backend in ("ddp", "fsdp"):
        result = migrate_source(case, Options(backend=backend))
        assert not result.changed and "DST966" in codes(result.findings), backend


def test_an_optimizer_a_method_builds_over_the_instance_and_a_handed_list_is_refused(monkeypatch) -> None:
    """fixtures/DST905/configure_optimizers_extra: `model.configure_optimizers(list(probe.parameters()), lr)`
    builds one optimizer over the model's and the probe's parameters. distify.obtained names no one
    model, and the rules wrapped the probe alone (the call hands it `probe.parameters()`): the model's
    updates were not averaged, written with only DST905's warning. DST954 refuses it under DDP and
    FSDP. Control: with that check switched off, the wrong migration is written."""
    case = (FIXTURES / "DST905" / "configure_optimizers_extra.in.py").read_bytes()
    for backend in ("ddp", "fsdp"):
        result = migrate_source(case, Options(backend=backend))
        assert not result.changed and "DST954" in codes(result.findings), backend
    check = type(BY_CODE["DST954"])
    monkeypatch.setattr(check, "_untraced_builder", lambda self, ctx, a: None)
    result = migrate_source(case, Options(backend="ddp"))
    assert result.changed and "DST954" not in codes(result.findings)
    assert b"probe = runtime.DDP(" in result.output and b"model = runtime.DDP(" not in result.output


def test_an_optimizer_a_method_or_builder_of_the_script_returns_is_migrated(monkeypatch) -> None:
    """nanoGPT's `optimizer = model.configure_optimizers(...)` and a builder `build_optimizer(model, ...)`
    were refused (DST954: distify could not name the model). distify.obtained names the model the
    optimizer steps where the script obtains it: DDP wraps it (the method reached through
    model.module), FSDP shards it before the call, Horovod wraps the optimizer the call returns.
    Control: with the fact switched off, the refusal comes back (for the builder under Horovod, the
    old wrap inside the builder, over parameters it cannot name, with a warning)."""
    import distify.anatomy as anatomy

    cases = [(FIXTURES / "DST905" / f"{c}.in.py").read_bytes() for c in ("configure_optimizers", "build_optimizer_groups",
                                                                           "configure_optimizers_compile")]
    for case in cases:
        for backend in ("ddp", "fsdp", "horovod"):
            result = migrate_source(case, Options(backend=backend))
            assert result.changed and not audit_codes(result.findings), backend
    ddp = migrate_source(cases[0], Options(backend="ddp")).output
    assert b"optimizer = model.module.configure_optimizers(1e-3)" in ddp
    fsdp = migrate_source(cases[0], Options(backend="fsdp")).output
    assert fsdp.index(b"fully_shard(model)\n") < fsdp.index(b"optimizer = model.configure_optimizers(1e-3)")
    compiled = migrate_source(cases[2], Options(backend="fsdp")).output  # nanoGPT's order: compile after
    assert compiled.index(b"fully_shard(model)\n") < compiled.index(b"model = torch.compile(model)") < compiled.index(
        b"optimizer = model.configure_optimizers(")
    hvd = migrate_source(cases[0], Options(backend="horovod")).output
    assert b"optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())" in hvd
    monkeypatch.setattr(anatomy, "obtained", lambda *args: None)
    for case in cases:
        for backend in ("ddp", "fsdp"):
            assert not migrate_source(case, Options(backend=backend)).changed, backend
    assert not migrate_source(cases[0], Options(backend="horovod")).changed
    old = migrate_source(cases[1], Options(backend="horovod")).output
    assert b"named_parameters=model.named_parameters()" not in old and b"hvd.DistributedOptimizer(optimizer)\n" in old


def test_dst954_names_the_backends_own_wrapper(monkeypatch) -> None:
    """An FSDP migration with the shard switched off leaves the model loose: DST954 says to
    fully_shard it, not to wrap it in DDP (the wording followed the output's flavour, which a script
    with nothing sharded does not show). Control: the same output audited as a DDP migration says
    DistributedDataParallel."""
    result = migrate_source(EXAMPLE, Options(backend="fsdp", ignore=("DST121",)))
    said = [f.message for f in result.findings if f.code == "DST954"]
    assert said and all("not sharded with fully_shard" in m for m in said), said
    result = migrate_source(EXAMPLE, Options(backend="ddp", ignore=("DST101",)))
    said = [f.message for f in result.findings if f.code == "DST954"]
    assert said and all("not wrapped in DistributedDataParallel" in m for m in said), said
