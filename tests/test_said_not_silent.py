"""Issue 21 item 5: a file distify leaves unchanged says why, without -v, when it holds training
constructs (a DataLoader, an optimizer, backward()): where the training seems to run, with the line,
or what it cannot follow. Clean files stay quiet. Checked over every file of the corpus projects
(fixtures/corpus/projects), and on the two shapes that used to exit 0 with no line at all:
victoresque/pytorch-template's optimizer built by name from a config, and pytorch-CycleGAN-and-
pix2pix's model object whose class `create_model(opt)` imports by name."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.options import Options

PROJECTS = Path(__file__).resolve().parent.parent / "fixtures" / "corpus" / "projects"


def _constructs(source: bytes) -> list:
    """The training constructs a reader sees in a file (the test's own reading, with `ast`): a call of
    `.backward()`, of a `DataLoader`, of a `torch.optim` class."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            optim = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr == "optim"
            if name in ("backward", "DataLoader") or (optim and name[:1].isupper()):
                out.append((name, n.lineno))
    return out


def _migrate(path: Path, backend: str = "ddp"):
    return migrate_source(path.read_bytes(), Options(backend=backend), path=str(path))


FILES = sorted(p for p in PROJECTS.rglob("*.py") if _constructs(p.read_bytes()))


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(PROJECTS)) for p in FILES])
def test_no_project_file_with_training_constructs_is_left_unchanged_in_silence(path):
    result = _migrate(path)
    assert result.output != result.source or result.refused or result.findings, (
        f"{path.relative_to(PROJECTS)} holds {_constructs(path.read_bytes())[:3]} and is left unchanged with no word")


def _note(path: Path):
    result = _migrate(path)
    assert result.output == result.source and not result.refused
    return [f for f in result.findings if f.code == "DST961"]


def test_an_optimizer_built_by_name_is_said_with_the_call_that_takes_it():
    said = _note(PROJECTS / "template_config_trainer" / "train.py")
    # `trainer = Trainer(model, criterion, metrics, optimizer, ...)` takes the optimizer; the note names
    # the method the script then runs on it, `trainer.train()`, inherited from base/base_trainer.py
    assert len(said) == 1 and said[0].line == 71, said
    assert "trainer.train() (base.base_trainer.BaseTrainer.train at base/base_trainer.py:40" in said[0].message


def test_a_model_object_built_by_importlib_is_said_with_the_import_and_the_loop():
    said = _note(PROJECTS / "pix2pix_model_object" / "train.py")
    assert len(said) == 1 and said[0].line == 34, said  # `model = create_model(opt)`
    msg = said[0].message
    assert "create_model() (models/__init__.py:18)" in msg and "import_module() at models/__init__.py:10" in msg
    assert "model.set_input() (line 45)" in msg


def test_a_module_that_only_builds_loaders_says_so():
    said = _note(PROJECTS / "pix2pix_model_object" / "data" / "__init__.py")
    assert len(said) == 1 and "only builds a DataLoader" in said[0].message


def test_clean_scripts_stay_quiet(tmp_path):
    """An evaluation script that builds its loader and runs it (no optimizer, no backward), and a
    script whose object comes from a project function importing by its own name: nothing said."""
    (tmp_path / "evaluate.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        "def make():\n    return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)\n\n"
        "def run(net):\n    with torch.no_grad():\n        return [net(x) for (x,) in make()]\n\n"
        "run(torch.nn.Linear(2, 1))\n")
    assert _migrate(tmp_path / "evaluate.py").findings == ()
    (tmp_path / "models.py").write_text("class Model:\n    def step(self):\n        return 1\n\n\n"
                                        "def create_model():\n    return Model()\n")
    (tmp_path / "train.py").write_text("import torch\nfrom models import create_model\n\nmodel = create_model()\n"
                                       "for i in range(3):\n    model.step()\n")
    assert _migrate(tmp_path / "train.py").findings == ()
