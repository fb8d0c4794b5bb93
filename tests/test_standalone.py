"""``distify --standalone``: the runtime helpers written into the script instead of imported.

The golden outputs live in fixtures/standalone/ (checked by test_fixtures.py); here: no import of
distify anywhere in them, a second run with or without the flag changes nothing, the inline helpers
read the launcher environment exactly as ``distify.runtime`` does, later runs only add what is
missing, and the CLI flag / ``[tool.distify]`` key. Executed equivalence: test_e2e_standalone.py.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import libcst as cst
import pytest

from distify import standalone
from distify.engine import migrate_source
from distify.options import Options

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# the inline runtime speaks ddp, horovod and fsdp (FSDP2 uses DDP's process-group helpers)
GOLDENS = sorted(p for p in (FIXTURES / "standalone").glob("*.*.py") if not p.name.endswith(".in.py"))


def distify_imports(source: str) -> list:
    """Every import statement of `source` (at any depth) that names distify."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        if any(n == "distify" or n.startswith("distify.") for n in names):
            found.append(ast.unparse(node))
    return found


def test_there_are_goldens_for_every_backend():
    backends = {p.name.split(".")[-2] for p in GOLDENS}
    assert backends == {"ddp", "horovod", "fsdp"} and len(GOLDENS) >= 12


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: p.name)
def test_golden_imports_no_distify_and_defines_what_it_uses(path):
    text = path.read_text()
    assert distify_imports(text) == []
    block = standalone.find_block(cst.parse_module(text))
    assert block is not None, "no inline runtime class"
    assert block.backend == path.name.split(".")[-2]
    used = {
        n.attr for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == block.name
    }
    assert used and used <= block.members, f"used but not defined: {sorted(used - block.members)}"


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: p.name)
@pytest.mark.parametrize("flag", [True, False], ids=["standalone", "no-flag"])
def test_second_run_changes_nothing_with_or_without_the_flag(path, flag):
    backend = path.name.split(".")[-2]
    source = path.read_bytes()
    assert migrate_source(source, Options(backend=backend, standalone=flag)).output == source


def test_default_output_turned_standalone_equals_a_direct_standalone_run():
    original = (FIXTURES / "scenarios" / "trainer_class.in.py").read_bytes()
    default = migrate_source(original, Options(backend="ddp")).output
    assert b"from distify import runtime" in default
    later = migrate_source(default, Options(backend="ddp", standalone=True)).output
    direct = migrate_source(original, Options(backend="ddp", standalone=True)).output
    assert later == direct
    assert distify_imports(later.decode()) == []


OLD_BACKEND_MARK = {
    ("ddp", "horovod"): "import torch.distributed",
    ("horovod", "ddp"): "import horovod",
    ("ddp", "fsdp"): "class DDP(",
    ("fsdp", "ddp"): "fully_shard",
    ("horovod", "fsdp"): "import horovod",
}


@pytest.mark.parametrize("first,second", sorted(OLD_BACKEND_MARK))
def test_backend_conversion_keeps_the_script_standalone(first, second):
    original = (FIXTURES / "scenarios" / "two_loaders.in.py").read_bytes()
    once = migrate_source(original, Options(backend=first, standalone=True)).output
    converted = migrate_source(once, Options(backend=second)).output.decode()
    assert distify_imports(converted) == []
    block = standalone.find_block(cst.parse_module(converted))
    assert block is not None and block.backend == second
    assert converted.count("standalone runtime (v") == 1, "the old backend's class was left behind"
    old = OLD_BACKEND_MARK[first, second]
    assert old not in converted, f"{old} is left although nothing uses it"
    compile(converted, "converted", "exec")


# --- later runs add only what is missing ----------------------------------------------------


def _runtime_class(text: str) -> str:
    start = text.index("# distify: standalone runtime")
    return text[start : text.index("\n\n\n", start)]


def test_a_later_run_appends_only_the_missing_helper_and_keeps_edits_to_the_class():
    out = (FIXTURES / "standalone" / "module_level.ddp.py").read_text()
    assert "def world_size" not in out
    edited = out.replace(
        '"""Global rank of this process (0 without a launcher)."""',
        '"""Global rank of this process (0 without a launcher). Edited by hand."""',
    ) + 'print("ranks:", runtime.world_size())\n'
    again = migrate_source(edited.encode(), Options(backend="ddp")).output.decode()
    before, after = _runtime_class(edited), _runtime_class(again)
    assert after.startswith(before), "the class as it was (hand edit included) changed"
    added = after[len(before):]
    assert added.startswith("\n\n    @staticmethod\n    def world_size():") and added.count("def ") == 1, added
    assert again.count("class runtime") == 1
    assert 'if runtime.is_main_process():\n    print("ranks:", runtime.world_size())' in again
    assert migrate_source(again.encode(), Options(backend="ddp")).output.decode() == again


def test_helpers_unknown_to_the_inline_class_keep_the_distify_import(tmp_path):
    default = (FIXTURES / "scenarios" / "module_level.ddp.py").read_text()
    edited = default + "print(runtime.no_such_helper())\n"
    result = migrate_source(edited.encode(), Options(backend="ddp", standalone=True))
    out = result.output.decode()
    assert "from distify import runtime" in out and "standalone runtime (v" not in out
    warnings = [f.message for f in result.findings if f.kind == "warning"]
    assert any("runtime.no_such_helper: not a part of distify.runtime" in w for w in warnings), warnings


def test_a_script_that_shadows_a_builtin_the_class_reads_keeps_the_distify_import():
    """The class's code reads `open` and `next` as builtins; a script that binds one of them at top
    level would hand the class its own object instead: refused, with the reason."""
    default = (FIXTURES / "scenarios" / "module_level.ddp.py").read_text()
    result = migrate_source((default + "next = 3\n").encode(), Options(backend="ddp", standalone=True))
    out = result.output.decode()
    assert "from distify import runtime" in out and "standalone runtime (v" not in out
    warnings = [f.message for f in result.findings if f.kind == "warning"]
    assert any("the script binds next" in w for w in warnings), warnings
    # bound in a function only, or not at all: the class is written
    for extra in ("def f(next):\n    type = next\n    return type\n", "for epoch in range(1):\n    pass\n"):
        out = migrate_source((default + extra).encode(), Options(backend="ddp", standalone=True)).output.decode()
        assert "from distify import runtime" not in out and "standalone runtime (v" in out, extra


# --- the inline helpers read the environment like distify.runtime -------------------------------

ENVIRONMENTS = {
    "plain python": {},
    "torchrun": {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                 "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "h0", "MASTER_PORT": "29400"},
    "kubeflow": {"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"},
    "horovodrun": {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"},
    "open mpi": {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_ADDR": "n1"},
    "mpich": {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "n1"},
    "srun": {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_STEP_ID": "0",
             "SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "gpu[07-10,12],cpu1"},
    "srun, nested node list": {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
                               "SLURM_STEP_ID": "3", "SLURM_STEP_NODELIST": "rack[1-2]-n[01-03]"},
    "srun, one host": {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
                       "SLURM_JOB_NODELIST": "node5"},
    "python in an sbatch script": {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
                                   "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-4]"},
    "sbatch batch step": {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": str(0xFFFFFFFB)},
    "mpirun inside an allocation": {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0",
                                    "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                                    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "MASTER_ADDR": "n1"},
    "empty strings are unset": {"RANK": "", "WORLD_SIZE": "", "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"},
    "explicit LOCAL_RANK wins": {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
                                 "SLURM_STEP_ID": "0", "LOCAL_RANK": "1", "MASTER_ADDR": "h"},
}


def inline_runtime(backend: str, environ: dict, names=None):
    """The inline class of `backend` with every member (or `names` and what they need), executed
    with a fake `os.environ` of its own."""
    from distify.inline_helpers import load

    code = standalone.source(names or list(load().order), backend)
    namespace: dict = {}
    exec(compile(code, f"<inline runtime {backend}>", "exec"), namespace)
    import os

    namespace["os"] = types.SimpleNamespace(environ=dict(environ), urandom=os.urandom)  # what its functions read from now on
    return namespace["runtime"]


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
@pytest.mark.parametrize("case", sorted(ENVIRONMENTS))
def test_inline_environment_matches_distify_runtime(case, backend, monkeypatch):
    """Rank, world size, local rank, rendezvous and what init_kwargs exports, from the same
    variables: the inline class and distify.runtime agree on every launcher."""
    import os

    from distify import runtime as rt

    env = ENVIRONMENTS[case]
    expected = rt.discover(env)
    runtime = inline_runtime(backend, env)
    assert runtime.discover() == runtime.Environment(*(getattr(expected, f) for f in (
        "rank", "world_size", "local_rank", "master_addr", "master_port", "source")))
    assert (runtime.rank(), runtime.world_size(), runtime.local_rank()) == (
        expected.rank, expected.world_size, expected.local_rank,
    )
    assert runtime.is_main_process() == (expected.rank == 0)
    if expected.world_size > 1 and expected.rank > 0:  # (rank 0 would check MASTER_PORT is free)
        monkeypatch.setattr(os, "environ", dict(env))
        theirs = _outcome(rt.init_kwargs)
        mine = _outcome(runtime.init_kwargs)
        assert mine == theirs
        assert runtime.init_kwargs.__globals__["os"].environ == os.environ  # the same variables exported


def _outcome(init_kwargs):
    """init_kwargs() without the store object (one per call), or the message it exits with."""
    try:
        return {k: v for k, v in init_kwargs().items() if k != "store"}
    except SystemExit as stop:
        return str(stop)


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_inline_shard_nodes_splits_as_the_runtime_does(backend):
    """The same seed nodes, world and rank give the same share from the inline class as from
    distify.runtime (masks, index tensors, typed pairs; sizes that do and do not divide)."""
    import torch

    from distify.runtime import shard_nodes

    inputs = [torch.arange(10), torch.arange(9) * 2, torch.tensor([True, False, True, True, False, True, True]),
              ("paper", torch.arange(5)), torch.arange(0)]
    for rank in range(3):
        inline = inline_runtime(backend, {"RANK": str(rank), "WORLD_SIZE": "3", "HOROVOD_RANK": str(rank),
                                          "HOROVOD_SIZE": "3"})
        for nodes in inputs:
            got, want = inline.shard_nodes(nodes), shard_nodes(nodes, 3, rank)
            if isinstance(want, tuple):
                assert got[0] == want[0]
                got, want = got[1], want[1]
            assert torch.equal(got, want), (rank, nodes)


def test_inline_helpers_without_a_process_group():
    import torch

    runtime = inline_runtime("ddp", {"RANK": "1", "WORLD_SIZE": "3"})
    assert runtime.device(False) == torch.device("cpu") and runtime.device_ids() is None
    assert list(runtime.ShardSampler(list(range(8)))) == [1, 4, 7] and len(runtime.ShardSampler(range(8))) == 3
    assert runtime.all_reduce(3) == 3 and isinstance(runtime.all_reduce(3), int)
    assert runtime.all_reduce_sum(2, 0.5) == (2, 0.5)
    assert isinstance(runtime.all_reduce_sum(2, 0.5)[0], int)
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(runtime.all_reduce(t, "mean"), t) and runtime.all_reduce(t) is not t
    model = torch.nn.Linear(2, 2)
    assert runtime.unwrap(model) is model
    seeds = {runtime.shared_seed() for _ in range(4)}  # one process: a fresh seed each call, as unseeded
    assert len(seeds) > 1 and all(isinstance(s, int) and 0 <= s < 2**32 for s in seeds)


def _same(a, b) -> bool:
    """Equal values of the same types (tensors: same dtype and values)."""
    import torch

    if isinstance(a, tuple) or isinstance(b, tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


def test_inline_reductions_and_guards_match_distify_runtime_in_a_process_group(monkeypatch):
    """In a real (gloo, one-process) group: the same reductions, kinds of results, broadcast,
    barrier, rank-0 guard and evaluation shards from the inline class as from distify.runtime, and the
    same refusals of what cannot be reduced."""
    import os

    import torch
    import torch.distributed as dist

    from distify import runtime as rt

    monkeypatch.setattr(os, "environ", dict(os.environ))  # what init_kwargs exports stays in the test
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                 "PMI_RANK", "HOROVOD_RANK"):
        os.environ.pop(name, None)
    inline = inline_runtime("ddp", {})
    inline.init_kwargs.__globals__["os"] = os  # this group's environment, as the runtime reads it
    assert not dist.is_initialized()
    dist.init_process_group(**inline.init_kwargs())
    try:
        values = [3, 2.5, True and 7, torch.tensor([1, 2]), torch.tensor([1.5, -2.0]), torch.tensor(4)]
        for value in values:
            for op in ("sum", "mean", "max", "min"):
                assert _same(inline.all_reduce(value, op), rt.all_reduce(value, op)), (value, op)
        assert _same(inline.reduce_mean(5), rt.reduce_mean(5))
        for args in ((2, 0.5), (torch.tensor([1.0]), 3), (4,)):
            assert _same(inline.all_reduce_sum(*args), rt.all_reduce_sum(*args)), args
        for bad in ((lambda r: r.all_reduce(1, "prod")), (lambda r: r.all_reduce("1")), (lambda r: r.all_reduce_sum())):
            with pytest.raises((ValueError, TypeError)) as mine:
                bad(inline)
            with pytest.raises((ValueError, TypeError)) as theirs:
                bad(rt)
            assert (type(mine.value), str(mine.value)) == (type(theirs.value), str(theirs.value))
        assert inline.broadcast_object({"a": [1]}) == rt.broadcast_object({"a": [1]}) == {"a": [1]}
        with monkeypatch.context() as m:  # rank 0's draw, through the group
            m.setattr(os, "urandom", lambda n: bytes(range(1, n + 1)))
            assert inline.shared_seed() == rt.shared_seed() == int.from_bytes(bytes([1, 2, 3, 4]), "little")
        inline.barrier()
        assert (inline.rank(), inline.world_size(), inline.is_main_process()) == (
            rt.rank(), rt.world_size(), rt.is_main_process()) == (0, 1, True)
        for replicas, rank in ((1, 0), (3, 1), (4, 3)):
            assert list(inline.ShardSampler(range(10), replicas, rank)) == list(rt.ShardSampler(range(10), replicas, rank))
        model = torch.nn.Linear(2, 2)
        mine, theirs = inline.DDP(model), rt.DDP(model)  # a group of one: the pass-through, both
        assert type(mine).__name__ == type(theirs).__name__ == "DDP" and list(mine.state_dict()) == list(theirs.state_dict())
        assert isinstance(mine, inline.DDP) and inline.unwrap(mine) is model and rt.unwrap(theirs) is model
    finally:
        inline.cleanup()
    assert not dist.is_initialized()


def test_every_runtime_helper_is_inlinable():
    """Everything distify.runtime exports can be written into a script: a helper added to the
    runtime needs no inline twin, and nothing in it defeats the generator."""
    import distify.runtime as rt
    from distify.inline_helpers import load

    assert [h for h in rt.__all__ if not load().inlinable(h)] == []


# --- the inline class is generated from the runtime's source, not written twice ------------------


def _normalised(node: ast.AST, cls: str = "") -> str:
    """`node` as ast.dump, less what the generator documents it changes: `cls.x` reads of the
    class's members (bare x in the runtime), @staticmethod, docstrings, annotations, `global`."""

    class Undo(ast.NodeTransformer):
        def visit_Attribute(self, n):
            self.generic_visit(n)
            if isinstance(n.value, ast.Name) and n.value.id == cls:
                return ast.copy_location(ast.Name(n.attr, n.ctx), n)
            return n

        def _body(self, n):
            self.generic_visit(n)
            first = n.body[0] if n.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                n.body = n.body[1:] or [ast.Pass()]
            return n

        def visit_FunctionDef(self, n):
            n.decorator_list = [d for d in n.decorator_list if not (isinstance(d, ast.Name) and d.id == "staticmethod")]
            n.returns = None
            return self._body(n)

        def visit_ClassDef(self, n):
            return self._body(n)

        def visit_arg(self, n):
            n.annotation = None
            return n

        def visit_AnnAssign(self, n):
            self.generic_visit(n)
            if n.value is None:
                return ast.Expr(n.target)
            return ast.Assign([n.target], n.value)

        def visit_Global(self, n):
            return None  # dropped

    tree = Undo().visit(ast.parse(ast.unparse(node)))
    return ast.dump(ast.Module([s for s in tree.body if not isinstance(s, ast.Pass)], []))


def _runtime_sources():
    from distify.inline_helpers import _runtime_dir

    out = {}
    for path in sorted(_runtime_dir().glob("*.py")):
        for stmt in ast.parse(path.read_text()).body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            names = [stmt.name] if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) else [
                t.id for t in targets if isinstance(t, ast.Name)]
            for name in names:
                out[name] = stmt
    return out


def test_every_generated_member_is_its_runtime_source_under_the_documented_rewrites():
    """No helper text is written twice: each member of the class, parsed back, equals the runtime's
    own definition once the generator's documented rewrites are undone (compared with `ast`, not
    with the libcst code that generated it)."""
    from distify.inline_helpers import load

    runtime, sources = load(), _runtime_sources()
    assert len(runtime.order) >= 40
    for name in runtime.order:
        generated = ast.parse(standalone.source([name], "ddp", header_too=False, cls="runtime_9")).body[0].body[0]
        assert _normalised(generated, "runtime_9") == _normalised(sources[name]), name


def test_a_change_to_the_runtime_reaches_the_inline_class(tmp_path):
    """The control for the test above: a runtime whose shard_nodes pads differently (and gains a
    helper) generates a class that behaves the new way -- a hand-written copy would not follow."""
    import shutil

    import torch

    from distify.inline_helpers import _runtime_dir, load

    copy = tmp_path / "runtime"
    shutil.copytree(_runtime_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    text = (copy / "__init__.py").read_text()
    old = "    total = -(-index.numel() // replicas) * replicas\n"
    assert old in text
    text = text.replace(old, "    total = _floor(index.numel(), replicas)\n")
    text += "\n\ndef _floor(n, k):\n    return n // k * k  # drop the remainder instead of padding\n"
    (copy / "__init__.py").write_text(text)

    changed = load(copy)
    assert "_floor" in changed.closure(["shard_nodes"])
    namespace: dict = {}
    exec(standalone.source(["shard_nodes"], "ddp", runtime=changed), namespace)
    namespace["os"] = types.SimpleNamespace(environ={"RANK": "0", "WORLD_SIZE": "3"})
    assert namespace["runtime"].shard_nodes(torch.arange(10)).tolist() == [0, 3, 6]  # 9 nodes shared, not 12
    assert inline_runtime("ddp", {"RANK": "0", "WORLD_SIZE": "3"}).shard_nodes(torch.arange(10)).tolist() == [0, 3, 6, 9]


def test_what_the_generator_cannot_carry_is_refused_with_its_reason(tmp_path):
    """A runtime function reading the module's __name__ (which is "__main__" in a script) or a
    global bound only inside a function is not inlinable, nor is what calls it."""
    from distify.inline_helpers import load

    (tmp_path / "__init__.py").write_text(
        "import os\n\n\ndef where():\n    return __name__\n\n\ndef uses():\n    return where()\n\n\n"
        "def later():\n    global _made\n    _made = 1\n    return _made\n\n\ndef fine():\n    return os.sep\n"
    )
    runtime = load(tmp_path)
    assert not runtime.inlinable("where") and "__name__" in runtime.why_not("where")
    assert not runtime.inlinable("uses") and runtime.why_not("uses").startswith("where:")
    assert not runtime.inlinable("later") and "_made" in runtime.why_not("later")
    assert runtime.inlinable("fine") and runtime.why_not("nothing") == "not a part of distify.runtime"


# --- CLI -----------------------------------------------------------------------------------------


def test_cli_flag_and_pyproject_key(cli, tmp_path, train_py):
    result = cli(train_py, "--standalone", "-q")
    assert result.exit_code == 1, result.stderr
    text = Path(train_py).read_text()
    assert distify_imports(text) == [] and "standalone runtime (v2, ddp)" in text

    other = tmp_path / "other.py"
    other.write_bytes((FIXTURES / "scenarios" / "module_level.in.py").read_bytes())
    (tmp_path / "pyproject.toml").write_text("[tool.distify]\nstandalone = true\n")
    assert cli(other, "-q").exit_code == 1
    assert other.read_text() == text
    assert cli(other, "-q").exit_code == 0  # nothing left to do


# --- devices: torch.accelerator (faked) and the CUDA-or-CPU fallback -------------------------------

LAUNCHED = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234"}


def test_inline_class_picks_the_accelerator_and_passes_its_device_id(fake_accelerator):
    import torch

    fake = fake_accelerator("xpu", 2)
    runtime = inline_runtime("ddp", LAUNCHED)
    kwargs = runtime.init_kwargs()
    assert kwargs["backend"] == "cpu:gloo,xpu:xccl" and kwargs["init_method"] == "env://"
    assert kwargs["device_id"] == torch.device("xpu", 1) and fake.current == 1
    fake.current = None
    assert runtime.device() == torch.device("xpu", 1) and fake.current == 1
    assert runtime.device_ids() == [1]
    assert runtime.device(False) == torch.device("cpu") and runtime.device_ids() is None


def test_inline_class_on_the_cpu_passes_no_device_id(fake_accelerator):
    import torch

    fake_accelerator("cuda", 0)  # a CUDA build without a GPU
    runtime = inline_runtime("ddp", LAUNCHED)
    kwargs = runtime.init_kwargs()
    assert kwargs["backend"] == "gloo" and "device_id" not in kwargs
    assert runtime.device() == torch.device("cpu") and runtime.device_ids() is None
    fake_accelerator("mps", 1)  # gloo cannot reduce mps tensors: the CPU, as before
    assert "device_id" not in inline_runtime("ddp", LAUNCHED).init_kwargs()


def test_inline_class_never_trains_on_the_fake_test_backend(monkeypatch, fake_accelerator):
    """torch 2.14 makes its no-communication "fake" backend hpu's default once
    torch.distributed.fsdp is imported."""
    import torch

    real = torch.distributed.get_default_backend_for_device
    fake_accelerator("hpu", 2)
    for answer, backend in (("fake", "gloo"), ("hccl", "cpu:gloo,hpu:hccl")):
        monkeypatch.setattr(torch.distributed, "get_default_backend_for_device",
                            lambda device, answer=answer: answer if str(device) == "hpu" else real(device))
        assert inline_runtime("ddp", LAUNCHED).init_kwargs()["backend"] == backend


def test_inline_class_without_the_accelerator_api_uses_cuda(monkeypatch, no_accelerator_api):
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    runtime = inline_runtime("ddp", LAUNCHED)
    kwargs = runtime.init_kwargs()
    assert kwargs["backend"] == "cpu:gloo,cuda:nccl" and "device_id" not in kwargs
    assert runtime.device() == torch.device("cuda", 1) and calls == [1]
    assert runtime.device_ids() == [1]


def test_inline_horovod_class_stays_on_cuda(monkeypatch, fake_accelerator):
    """Horovod reduces CPU and CUDA tensors only: once the script imported horovod.torch, device()
    never picks another accelerator."""
    import sys

    import torch

    fake_accelerator("xpu", 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "horovod.torch", types.SimpleNamespace(is_initialized=lambda: False))
    assert inline_runtime("horovod", LAUNCHED).device() == torch.device("cpu")


def test_inline_shard_loader_keeps_the_batch_size_when_dataloader_init_is_wrapped(monkeypatch):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    real = DataLoader.__init__
    monkeypatch.setattr(DataLoader, "__init__", lambda self, *args, **kwargs: real(self, *args, **kwargs))
    runtime = inline_runtime("ddp", {"RANK": "1", "WORLD_SIZE": "2"})
    shard = runtime.shard_loader(DataLoader(TensorDataset(torch.arange(12)), batch_size=3, drop_last=True))
    assert (shard.batch_size, shard.drop_last, len(shard)) == (3, True, 2)


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_inline_shard_loader_matches_distify_runtime(backend):
    """runtime.shard_loader and its inline twin hand each rank the same batches, and refuse alike."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from distify import runtime as rt

    ds = TensorDataset(torch.arange(13))
    g = torch.Generator()
    g.manual_seed(3)
    for make in (lambda: DataLoader(ds, batch_size=2, shuffle=True, generator=g), lambda: DataLoader(ds, batch_size=4)):
        for rank in (0, 1):
            runtime = inline_runtime(backend, {"RANK": str(rank), "WORLD_SIZE": "2"})
            mine = runtime.shard_loader(make())
            theirs = rt.shard_loader(make(), num_replicas=2, rank=rank)
            assert [b[0].tolist() for b in mine] == [b[0].tolist() for b in theirs]
            assert (mine.sampler.shuffle, mine.sampler.seed) == (theirs.sampler.shuffle, theirs.sampler.seed)
    runtime = inline_runtime(backend, {})
    with pytest.raises(ValueError, match="custom sampler"):
        runtime.shard_loader(DataLoader(ds, sampler=[1, 0]))


def test_writing_the_class_imports_neither_torch_nor_the_runtime():
    """The generator reads distify.runtime's files; importing the package would import torch into
    the CLI."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from distify.engine import migrate_source\n"
        "from distify.options import Options\n"
        f"src = Path({str(FIXTURES / 'scenarios' / 'module_level.in.py')!r}).read_bytes()\n"
        "out = migrate_source(src, Options(backend='ddp', standalone=True)).output\n"
        "assert b'standalone runtime (v' in out\n"
        "print(sorted(m for m in ('torch', 'distify.runtime') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_module_spelled_like_a_local_of_the_runtime_is_imported_again():
    """The runtime's functions bind `env` and `api` for themselves; a script that calls os `env`
    and torch `api` must not lend the class those spellings, or `env.environ` would read the local."""
    original = (FIXTURES / "scenarios" / "module_level.in.py").read_text()
    script = "import os as env\nimport torch as api\n" + original + "print(env.sep, api.zeros(1))\n"
    out = migrate_source(script.encode(), Options(backend="ddp", standalone=True)).output.decode()
    module = cst.parse_module(out)
    block = standalone.find_block(module)
    head = [s for s in module.body if isinstance(s, cst.SimpleStatementLine)
            and isinstance(s.body[0], (cst.Import, cst.ImportFrom))]
    namespace: dict = {}
    exec(compile(cst.Module([*head, block.node]).code, "<class>", "exec"), namespace)
    assert namespace["env"].__name__ == "os" and namespace["api"].__name__ == "torch"
    runtime = namespace[block.name]
    assert (runtime.rank(), runtime.discover().world_size, runtime.discover().source) == (0, 1, "none")
    assert runtime.device(False).type == "cpu" and runtime.is_main_process()


def test_a_docstring_cut_after_a_quote_still_closes(tmp_path):
    """Only a docstring's first paragraph is kept; one that ends with a quote must not run into
    the closing quotes."""
    from distify.inline_helpers import load

    (tmp_path / "__init__.py").write_text('def hello():\n    """Say "hi"\n\n    More words.\n    """\n    return "hi"\n')
    namespace: dict = {}
    exec(standalone.source(["hello"], "ddp", runtime=load(tmp_path)), namespace)
    assert namespace["runtime"].hello() == "hi" and namespace["runtime"].hello.__doc__ == 'Say "hi" '
