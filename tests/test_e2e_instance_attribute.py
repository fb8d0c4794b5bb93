"""Executed: the model a class builds and wraps itself, reached from outside through an instance.

A ``Trainer`` whose ``__init__`` builds ``self.model`` (which distify wraps there: ``runtime.DDP``,
``fully_shard``) is used from ``main()`` as ``trainer.model``: loaded into, saved
(``torch.save(trainer.model.state_dict(), ...)``), handed to a helper in the instance
(``save_weights(trainer, path)``), aliased (``net = trainer.model``), copied (``copy.deepcopy``),
asked for its own method and attribute. Each launch below runs on 2 ranks (torchrun for ddp and
fsdp, horovodrun for horovod; gloo, CPU), and asserts:

- every file saved holds the original's keys and loads, strictly, into the bare model in a plain
  process (a fresh interpreter, ``torch.load`` with its safe default), with the weights the original
  script ends with at twice the batch (one process: deterministic, shuffling off, plain SGD);
- every rank ends with the same parameters;
- control: the old output (``trainer.model.state_dict()`` of the DDP wrapper, or of the FSDP shards,
  as distify wrote it before the instance fact) is rejected by the same check.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    REPO_ROOT,
    assert_same_weights,
    executed,
    load_state,
    migrate,
    rank_parameters,
    run_python,
    same_on_every_rank,
)

pytestmark = pytest.mark.e2e

SAVES = REPO_ROOT / "fixtures" / "DST307" / "instance_attribute_outside.in.py"
USES = REPO_ROOT / "fixtures" / "DST102" / "instance_attribute_outside.in.py"
B, NPROC = 8, 2

# A fresh interpreter: builds the ORIGINAL script's bare model (its class, imported from the
# unmigrated file: no process group, no wrapper) and loads each file into it strictly, with
# torch.load's default (weights_only: a DTensor shard does not load).
CHECKER = '''\
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("original", sys.argv[1])
original = importlib.util.module_from_spec(spec)
spec.loader.exec_module(original)
out = {}
for path in sys.argv[3:]:
    model = original.build_model() if hasattr(original, "build_model") else original.Trainer([], lr=0.1).model
    try:
        state = torch.load(path)
        model.load_state_dict(state)
        out[path] = {"keys": sorted(state), "loaded": True}
    except Exception as e:
        out[path] = {"loaded": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
'''


def _init(workdir: Path) -> Path:
    """The starting weights the runs load (``--init``), drawn from their own generator."""
    import torch

    g = torch.Generator().manual_seed(5)
    shapes = {"0.weight": (16, 8), "0.bias": (16,), "2.weight": (1, 16), "2.bias": (1,)}
    path = workdir / "init.pt"
    torch.save({k: torch.randn(*s, generator=g) * 0.3 for k, s in shapes.items()}, path)
    return path


def _bare_loads(source: Path, workdir: Path, files) -> dict:
    """{file: {"loaded": bool, "keys": [...]}} from the checker, run as a plain process."""
    checker = workdir / "checker.py"
    checker.write_text(CHECKER)
    report = workdir / "loaded.json"
    run_python(checker, [source, report, *[workdir / f for f in files]], cwd=workdir)
    return {Path(k).name: v for k, v in json.loads(report.read_text()).items()}


def _original(tmp_path: Path, source: Path, args) -> dict:
    """The unmigrated script at batch NPROC * B in one plain process: the files it saves."""
    work = tmp_path / "original"
    work.mkdir()
    init = _init(work)
    extra = ["--init", init] if "--init" in source.read_text() else []
    run_python(source, ["--batch-size", NPROC * B, *args, *extra], cwd=work)
    return {f.name: load_state(f) for f in work.glob("*.pt") if f.name != "init.pt"}


def _ranks(script: Path, workdir: Path, backend: str, source: Path, args):
    workdir.mkdir(parents=True)
    init = _init(workdir)
    extra = ["--init", init] if "--init" in source.read_text() else []
    result, ranks = rank_parameters(script, ["--batch-size", B, *args, *extra], workdir, backend)
    return result, ranks


def _checked(source: Path, files, original: dict, workdir: Path) -> None:
    loads = _bare_loads(source, workdir, files)
    for name in files:
        got = loads[name]
        assert got["loaded"], f"{name} does not load into the bare model: {got.get('error')}"
        assert got["keys"] == sorted(original[name]), (name, got["keys"])
        assert_same_weights(original[name], load_state(workdir / name), atol=1e-5,
                            label=f"{name}: {NPROC} ranks x {B} vs batch {NPROC * B}")


HANDED = REPO_ROOT / "fixtures" / "DST307" / "model_handed_to_class.in.py"
# the model handed out by a getter and a property, read in place (`trainer.get_model().state_dict()`)
GETTER = REPO_ROOT / "fixtures" / "DST307" / "getter_in_place.in.py"
FILES = {SAVES: ["final.pt", "helper.pt", "alias.pt", "served.pt"], HANDED: ["final.pt", "trainer.pt"],
         GETTER: ["final.pt", "property.pt", "method.pt"]}

# the old output, as distify wrote it before it followed the model out of the class: the state of
# the wrapper (`module.` keys) or of the shards, saved as it is; and the files that then fail to load
OLD = {
    (SAVES, "ddp"): ([("trainer.model.module.state_dict()", "trainer.model.state_dict()"),
                      ("runtime.unwrap(t.model).state_dict()", "t.model.state_dict()"),
                      ("runtime.unwrap(net).state_dict()", "net.state_dict()"),
                      ("runtime.unwrap(served).state_dict()", "served.state_dict()")], FILES[SAVES]),
    (SAVES, "fsdp"): ([("torch.save(model_state, ", "torch.save(t.model.state_dict(), "),
                       ("torch.save(model_state_2, ", "torch.save(trainer.model.state_dict(), "),
                       ("torch.save(net_state, ", "torch.save(net.state_dict(), "),
                       ("torch.save(served_state, ", "torch.save(served.state_dict(), ")], FILES[SAVES]),
    # DDP's wrapper is a new object: `model` in main() stays the plain module, only trainer.model is wrapped
    (HANDED, "ddp"): ([("trainer.model.module.state_dict()", "trainer.model.state_dict()")], ["trainer.pt"]),
    # fully_shard shards the object main() handed in: `model` there holds the shards
    (HANDED, "fsdp"): ([("torch.save(model_state, ", "torch.save(model.state_dict(), ")], ["final.pt"]),
    # before the reach facts named a getter's call (syntax.held_name): the wrapper's state, saved
    (GETTER, "ddp"): ([("runtime.unwrap(trainer.get_model()).state_dict()", "trainer.get_model().state_dict()"),
                       ("runtime.unwrap(trainer.model).state_dict()", "trainer.model.state_dict()"),
                       ("runtime.unwrap(self.get_model()).state_dict()", "self.get_model().state_dict()")],
                      FILES[GETTER]),
    (GETTER, "fsdp"): ([("torch.save(get_model_state_2, ", "torch.save(trainer.get_model().state_dict(), "),
                        ("torch.save(model_state, ", "torch.save(trainer.model.state_dict(), "),
                        ("torch.save(get_model_state, ", "torch.save(self.get_model().state_dict(), ")],
                       FILES[GETTER]),
}


@pytest.mark.parametrize("source, backend", [
    executed(f"DST307/{src.name[:-len('.in.py')]}", backend, src, backend, id=f"{src.name.split('.')[0]}-{backend}")
    for src in (SAVES, HANDED, GETTER) for backend in ("ddp", "fsdp", "horovod")
])
def test_state_saved_and_loaded_through_the_instance(source, backend, tmp_path):
    script = tmp_path / "script" / "train.py"
    migrate(source, script, backend=backend)
    text = script.read_text()
    files = FILES[source]
    original = _original(tmp_path, source, [])
    assert sorted(original) == sorted(files), sorted(original)

    result, ranks = _ranks(script, tmp_path / "run", backend, source, [])
    assert same_on_every_rank(ranks), "the ranks ended with different parameters"
    _checked(source, files, original, tmp_path / "run")
    assert result.stdout.count("epoch 1 loss") == 1, result.stdout

    if backend == "horovod":
        assert "model.state_dict()" in text and "model.module" not in text and "unwrap(" not in text  # no wrapper
        return
    control = tmp_path / "script" / "old.py"
    old = text
    replacements, broken = OLD[source, backend]
    for new, was in replacements:
        assert new in old, (new, text)
        old = old.replace(new, was)
    control.write_text(old)
    _ranks(control, tmp_path / "control", backend, source, [])
    loads = _bare_loads(source, tmp_path / "control", files)
    assert not any(loads[f]["loaded"] for f in broken), f"control: the old output's files load: {loads}"


@pytest.mark.parametrize("backend", [
    executed("DST102/instance_attribute_outside", "ddp", "ddp", id="ddp"),
    executed("DST102/instance_attribute_outside", "horovod", "horovod", id="horovod"),
])
def test_bare_module_used_through_the_instance(backend, tmp_path):
    """The model's own method and attribute, a deepcopy and a save, all through `trainer.model`:
    under DDP each through `.module` (the wrapper forwards none: AttributeError, a copy of the
    wrapper, `module.` keys). Control: without `.module` the run dies on the attribute."""
    script = tmp_path / "script" / "train.py"
    migrate(USES, script, backend=backend)
    text = script.read_text()
    files = ["final.pt", "average.pt"]
    original = _original(tmp_path, USES, [])
    result, ranks = _ranks(script, tmp_path / "run", backend, USES, [])
    assert same_on_every_rank(ranks), "the ranks ended with different parameters"
    _checked(USES, files, original, tmp_path / "run")
    assert result.stdout.count("parameters width 16") == 1, result.stdout
    if backend == "horovod":
        assert "model.module" not in text and "unwrap(" not in text  # no wrapper: nothing to reach through
        return
    assert "copy.deepcopy(trainer.model.module)" in text, text
    control = tmp_path / "script" / "old.py"
    control.write_text(text.replace("trainer.model.module", "trainer.model"))
    (tmp_path / "control").mkdir()
    from e2e_support import RunFailed, run_torchrun

    with pytest.raises(RunFailed, match="has no attribute 'describe'"):
        run_torchrun(control, ["--batch-size", B], nproc=NPROC, cwd=tmp_path / "control")


GETTER_USES = REPO_ROOT / "fixtures" / "DST102" / "getter_in_place.in.py"


@pytest.mark.parametrize("backend", [
    executed("DST102/getter_in_place", "ddp", "ddp", id="ddp"),
    executed("DST102/getter_in_place", "horovod", "horovod", id="horovod"),
])
def test_bare_module_used_through_a_getter_in_place(backend, tmp_path):
    """What a getter returns, used where it is called: the model's own method
    (``trainer.get_model().describe()``), a deep copy kept as the best model, a save of its state.
    Under DDP each goes through ``runtime.unwrap(...)``: both files hold the original's keys and
    weights. Control: the old output (the calls left as they were) saves the wrapper's copy, whose
    file does not load into the bare model, and dies on the model's own method."""
    script = tmp_path / "script" / "train.py"
    migrate(GETTER_USES, script, backend=backend)
    text = script.read_text()
    files = ["final.pt", "average.pt"]
    original = _original(tmp_path, GETTER_USES, [])
    result, ranks = _ranks(script, tmp_path / "run", backend, GETTER_USES, [])
    assert same_on_every_rank(ranks), "the ranks ended with different parameters"
    _checked(GETTER_USES, files, original, tmp_path / "run")
    assert result.stdout.count(" parameters") == 1, result.stdout
    if backend == "horovod":
        assert "unwrap(" not in text  # no wrapper: nothing to reach through
        return
    assert "copy.deepcopy(runtime.unwrap(trainer.get_model()))" in text, text
    control = tmp_path / "script" / "old.py"
    old = text.replace("print(runtime.unwrap(trainer.get_model()).describe())", "print(trainer.get_model().describe())")
    old = old.replace("runtime.unwrap(trainer.get_model())", "trainer.get_model()")
    assert "unwrap(" not in old
    control.write_text(old)
    (tmp_path / "control").mkdir()
    from e2e_support import RunFailed, run_torchrun

    with pytest.raises(RunFailed, match="has no attribute 'describe'"):
        run_torchrun(control, ["--batch-size", B], nproc=NPROC, cwd=tmp_path / "control")
    # and without the method call, the saves the old output wrote: `module.` keys, refused by the bare model
    control.write_text(old.replace("print(trainer.get_model().describe())", "print('0 parameters')"))
    _ranks(control, tmp_path / "control2", backend, GETTER_USES, [])
    loads = _bare_loads(GETTER_USES, tmp_path / "control2", files)
    assert not any(loads[f]["loaded"] for f in files), f"control: the old output's files load: {loads}"
