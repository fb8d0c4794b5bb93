"""The user's project, not the file (issue 21, item 4): which modules an entry script reaches
(distify.project), the program model across them (distify.program), and what distify says and
does when the training loop lives in another module of the project."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from distify.anatomy import analyse
from distify.engine import Mode
from distify.options import Options
from distify.program import for_script
from distify.project import Project, migrate_project


def write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


# discovery ------------------------------------------------------------------------------------

def test_directory_project_follows_imports_transitively(tmp_path):
    write(tmp_path, {
        "train.py": "import utils\nfrom models.resnet import build\nimport torch\n",
        "utils.py": "import numpy\n",
        "models/__init__.py": "",
        "models/resnet.py": "from .layers import Block\n",
        "models/layers.py": "",
        "unused.py": "",
    })
    names = [m.name for m in Project.around(str(tmp_path / "train.py")).reachable(str(tmp_path / "train.py"))]
    # torch and numpy are libraries; unused.py is never imported (discovery is by imports)
    assert names == ["utils", "models", "models.resnet", "models.layers"]


def test_imports_are_found_at_any_depth_in_the_order_ast_walk_gives():
    """Project.imports reads only statements (not every node, as ast.walk does: a few times
    cheaper); it must find what ast.walk finds, in the same order, wherever a statement can be."""
    import ast

    from distify.project import statements

    tree = ast.parse(textwrap.dedent("""\
        import array; import bisect
        def f():
            import codecs
            class K:
                from difflib import ndiff
        try:
            import gzip
        except ImportError:
            import heapq
        else:
            import io
        finally:
            import json
        for _ in x:
            pass
        else:
            import keyword
        with w:
            if y:
                import logging
            elif z:
                import math
        match v:
            case 1:
                import numbers
        async def q():
            async with w:
                import operator
        while 0:
            import pickle
        import random
        """))
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert len(imports) == 15
    assert [n for n in statements(tree) if isinstance(n, (ast.Import, ast.ImportFrom))] == imports


def test_package_root_and_relative_imports(tmp_path):
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/train.py": "from .engine import fit\nfrom . import data as d\nimport pkg.sub.deep as deep\n",
        "pkg/engine.py": "",
        "pkg/data.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/deep.py": "",
    })
    script = str(tmp_path / "pkg" / "train.py")
    project = Project.around(script)
    assert project.root == str(tmp_path.resolve())  # above the topmost package
    assert project.script(script).name == "pkg.train"
    names = {m.name for m in project.reachable(script)}
    assert names == {"pkg", "pkg.engine", "pkg.data", "pkg.sub", "pkg.sub.deep"}


def test_site_packages_and_outside_root_are_never_the_project(tmp_path):
    write(tmp_path, {
        "proj/train.py": "import helper\nimport vendored\n",
        "proj/helper.py": "",
        "proj/site-packages/vendored.py": "",
    })
    project = Project.around(str(tmp_path / "proj" / "train.py"))
    project.search = project.search + (str(tmp_path / "proj" / "site-packages"),)
    assert project.module("helper") is not None
    assert project.module("vendored") is None
    # a configured root that leaves the script's folder out: its neighbours are found, not the project's
    narrow = Project.around(str(tmp_path / "proj" / "train.py"), root=str(tmp_path / "elsewhere"))
    assert narrow.module("helper") is None
    assert narrow.outside("helper.train") == str((tmp_path / "proj" / "helper.py").resolve())


def test_configured_root_and_exclude(tmp_path):
    write(tmp_path, {
        "pyproject.toml": '[tool.distify]\nproject-root = "src"\nexclude = ["*_vendored.py"]\n',
        "src/scripts/train.py": "import common\nimport lib_vendored\n",
        "src/common.py": "",
        "src/lib_vendored.py": "",
    })
    from distify import config

    cfg = config.load([str(tmp_path / "src" / "scripts" / "train.py")])
    assert cfg["project_root"] == str((tmp_path / "src").resolve())
    project = Project.around(str(tmp_path / "src" / "scripts" / "train.py"), cfg["project_root"], cfg["exclude"])
    assert project.module("common") is not None  # found from the root, not only from the script's folder
    assert project.module("lib_vendored") is None  # excluded: never read, never written


# the program model ----------------------------------------------------------------------------

PROJECT = {
    "train.py": """\
        import torch
        from torch.utils.data import TensorDataset
        import utils as U
        from engine import Trainer
        from models import build


        def main():
            model = build(4)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = U.get_loader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), 4)
            for epoch in range(2):
                U.train_one_epoch(model, optimizer, device="cpu", data_loader=loader, epoch=epoch)
            runner = Trainer(model, optimizer)
            runner.fit(loader)
    """,
    "utils.py": """\
        import torch.nn.functional as F
        from torch.utils.data import DataLoader


        def get_loader(ds, bs):
            made = DataLoader(ds, batch_size=bs, shuffle=True)
            return made


        def train_one_epoch(model, optimizer, data_loader, device, epoch):
            for x, y in data_loader:
                loss = F.mse_loss(model(x), y) * model.scale
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """,
    "engine.py": """\
        class Trainer:
            def __init__(self, model, optimizer):
                self.model = model

            def fit(self, loader):
                return len(loader)
    """,
    "models/__init__.py": "from .net import build\n",
    "models/net.py": """\
        import torch


        def build(n):
            return torch.nn.Linear(n, 1)
    """,
}


def _program(tmp_path):
    write(tmp_path, PROJECT)
    path = str(tmp_path / "train.py")
    prog, mod = for_script(path)
    a = analyse(cst.parse_module((tmp_path / "train.py").read_bytes()))
    unit = prog.adopt(mod, a)
    return prog, unit, {c.call: prog.target(unit, c.call, c.scope, c.stmt) for c in a.calls}


def test_calls_reach_project_functions_by_meaning(tmp_path):
    prog, unit, targets = _program(tmp_path)
    reached = {t.qualname for t in targets.values() if t is not None}
    # an aliased module, a re-export through a package's __init__, a class and a method of its instance
    assert reached == {
        "utils.get_loader", "utils.train_one_epoch", "models.net.build", "engine.Trainer.__init__", "engine.Trainer.fit",
    }
    fit = next(t for t in targets.values() if t is not None and t.qualname == "engine.Trainer.fit")
    assert not prog.trains(fit)
    step = next((c, t) for c, t in targets.items() if t is not None and t.qualname == "utils.train_one_epoch")
    assert prog.trains(step[1]) and step[1].where == "utils.py:10"
    bound = {k: cst.Module([]).code_for_node(v) for k, v in prog.bind(step[1], step[0]).items()}
    assert bound == {"model": "model", "optimizer": "optimizer", "device": '"cpu"', "data_loader": "loader", "epoch": "epoch"}
    assert [n for n, _ in prog.attribute_reads(step[1], "model")] == ["scale"]
    assert prog.attribute_reads(step[1], "data_loader") == []


def test_returned_loader(tmp_path):
    prog, unit, targets = _program(tmp_path)
    get = next(t for t in targets.values() if t is not None and t.qualname == "utils.get_loader")
    (site,) = prog.returned_loaders(get)
    assert site.qualname == "torch.utils.data.DataLoader"


# what distify does with a loop in another module ----------------------------------------------

def _run(cwd, *args):
    return subprocess.run([sys.executable, "-m", "distify", "--no-cache", *args], cwd=cwd, capture_output=True, text=True)


def test_loop_in_project_module_called_through_a_module_alias_is_migrated_where_it_lives(tmp_path):
    """``import utils as U`` ... ``U.train_one_epoch(...)``: the view finds the helper's function by
    what the callee resolves to (see test_project_spellings.py for every spelling)."""
    write(tmp_path, {k: v for k, v in PROJECT.items() if k != "engine.py"})
    (tmp_path / "train.py").write_text(textwrap.dedent(PROJECT["train.py"]).replace(
        "    runner = Trainer(model, optimizer)\n    runner.fit(loader)\n", "").replace("from engine import Trainer\n", ""))
    r = _run(tmp_path, "train.py")
    assert r.returncode == 1, r.stderr
    assert "utils.py:6:12: DST201" in r.stderr and "train.py:11:5: DST202 loader.sampler.set_epoch(epoch)" in r.stderr
    assert "runtime.unwrap(model).scale" in (tmp_path / "utils.py").read_text()


def test_loop_in_project_module_is_refused_with_its_line(tmp_path):
    """The view is not built where one module cannot hold both files: here the script binds a name
    the helper module defines (`train_one_epoch = None`, though it calls U.train_one_epoch)."""
    write(tmp_path, {k: v for k, v in PROJECT.items() if k != "engine.py"})
    (tmp_path / "train.py").write_text(textwrap.dedent(PROJECT["train.py"]).replace(
        "    runner = Trainer(model, optimizer)\n    runner.fit(loader)\n", "").replace(
        "from engine import Trainer\n", "train_one_epoch = None\n"))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.py")}
    r = _run(tmp_path, "train.py")
    assert r.returncode == 3, r.stderr
    assert "train.py:13:9: DST961 not migrated: training runs in U.train_one_epoch() (utils.train_one_epoch at utils.py:10)" in r.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.py")} == before
    result = migrate_project([str(tmp_path / "train.py")], Options(), Mode.WRITE)
    assert [f.status.value for f in result.files] == ["refused"] and not result.changed
    assert [os.path.basename(m) for m in result.modules] == ["utils.py", "__init__.py", "net.py"]


def test_loop_outside_the_project_is_said_with_its_file(tmp_path):
    write(tmp_path, {k: v for k, v in PROJECT.items() if k != "engine.py"})
    (tmp_path / "pyproject.toml").write_text('[tool.distify]\nexclude = ["utils.py"]\n')
    r = _run(tmp_path, "--check", "train.py")
    assert r.returncode == 0, r.stderr
    assert f"outside this project (see [tool.distify] project-root and exclude)" in r.stderr
    assert str((tmp_path / "utils.py").resolve()) in r.stderr


# a module of the project shared by entry scripts ------------------------------------------------

LOOP = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "loop_in_module"


def test_a_module_two_scripts_share_is_rewritten_once_from_its_original(tmp_path):
    import shutil

    shutil.copytree(LOOP / "in", tmp_path / "p")
    shutil.copy(tmp_path / "p" / "train.py", tmp_path / "p" / "train2.py")
    r = _run(tmp_path / "p", "train.py", "train2.py")
    assert r.returncode == 1, r.stderr  # rewritten
    assert r.stderr.count("rewrote trainlib.py") == 1
    assert (tmp_path / "p" / "trainlib.py").read_text() == (LOOP / "expected.ddp" / "trainlib.py").read_text()
    assert (tmp_path / "p" / "train2.py").read_text() == (LOOP / "expected.ddp" / "train.py").read_text()
    again = _run(tmp_path / "p", "--check", "train.py", "train2.py", ".")
    assert again.returncode == 0 and "3 files unchanged" in again.stderr, again.stderr


def test_an_object_a_helper_module_imports_too_is_imported_under_its_own_name(tmp_path):
    """trainlib.py imports DistributedSampler itself: the sampler distify adds in the script is
    imported as DistributedSampler (the same object), not as DistributedSampler_2."""
    import shutil

    shutil.copytree(LOOP / "in", tmp_path / "p")
    helper = tmp_path / "p" / "trainlib.py"
    helper.write_text(helper.read_text().replace("import torch\n", "import torch\nfrom torch.utils.data.distributed import DistributedSampler\n", 1))
    result = migrate_project([str(tmp_path / "p" / "train.py")], Options(), Mode.WRITE)
    assert result.changed
    script = (tmp_path / "p" / "train.py").read_text()
    assert "from torch.utils.data.distributed import DistributedSampler\n" in script, script
    assert "DistributedSampler_2" not in script and "train_sampler = DistributedSampler(" in script
    compile(script, "train.py", "exec")
    assert "DistributedSampler_2" not in helper.read_text()
    assert not migrate_project([str(tmp_path / "p" / "train.py")], Options(), Mode.CHECK).changed


def test_a_script_of_a_module_migrated_before_is_refused(tmp_path):
    import shutil

    shutil.copytree(LOOP / "in", tmp_path / "p")
    assert _run(tmp_path / "p", "train.py").returncode == 1  # rewritten, the module with it
    shutil.copy(LOOP / "in" / "train.py", tmp_path / "p" / "late.py")
    helper = (tmp_path / "p" / "trainlib.py").read_bytes()
    r = _run(tmp_path / "p", "late.py")
    assert r.returncode == 3 and "a module distify already migrated" in r.stderr, r.stderr
    assert (tmp_path / "p" / "trainlib.py").read_bytes() == helper  # never migrated twice


# training started from the script as a value (hogwild's `mp.Process(target=train, ...)`) ----------

HOGWILD = {
    "main.py": """\
        import torch
        import torch.multiprocessing as mp
        from worker import fit as work

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 2)

            def forward(self, x):
                return self.fc(x)

        if __name__ == "__main__":
            model = Net()
            model.share_memory()
            procs = []
            for r in range(2):
                p = mp.Process(target=work, args=(r, model))
                p.start()
                procs.append(p)
            for p in procs:
                p.join()
        """,
    "worker.py": """\
        import torch

        def fit(r, model):
            data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
            loader = torch.utils.data.DataLoader(data, batch_size=4)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        """,
}


@pytest.mark.parametrize("started", ["mp.Process(target=work, args=(r, model))", "mp.Process(None, work, None, (r, model))"])
def test_training_started_as_a_process_is_said_not_silent(tmp_path, started):
    """A script that hands a project function that trains to code that runs it says where the
    training runs (exit 0, nothing written); control: the same script whose handed function does
    not train stays quiet."""
    files = dict(HOGWILD)
    files["main.py"] = files["main.py"].replace("mp.Process(target=work, args=(r, model))", started)
    write(tmp_path, files)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.py")}
    r = _run(tmp_path, "--check", "main.py")
    assert r.returncode == 0, r.stderr
    assert "DST961 left unchanged: no training loop in this file; it hands worker.fit() (worker.py:3), which trains" in r.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.py")} == before
    (tmp_path / "worker.py").write_text("def fit(r, model):\n    return model\n")
    quiet = _run(tmp_path, "--check", "main.py")
    assert quiet.returncode == 0 and "DST961" not in quiet.stderr, quiet.stderr


def test_only_a_helper_that_loops_over_what_the_call_hands_it_joins(tmp_path):
    """The script trains in its own loop. `evaluate(model, loader)` in metrics.py loops over the
    loader it is handed: an evaluation, migrated where it lives (its print on the main process).
    `Config(path)` in config.py loops over its own state and prints: not an evaluation, its module
    is left as it is (the audit's DST956 speaks for the print instead)."""
    write(tmp_path, {
        "train.py": """\
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            from config import Config
            from metrics import evaluate

            def main():
                cfg = Config("train.cfg")
                model = torch.nn.Linear(4, 1)
                opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
                loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4, shuffle=True)
                for epoch in range(2):
                    for x, y in loader:
                        opt.zero_grad()
                        torch.nn.functional.mse_loss(model(x), y).backward()
                        opt.step()
                    evaluate(model, loader)

            main()
            """,
        "metrics.py": """\
            import torch

            def evaluate(model, loader):
                total = 0.0
                for x, y in loader:
                    total += torch.nn.functional.mse_loss(model(x), y).item()
                print(total)
            """,
        "config.py": """\
            class Config:
                def __init__(self, path):
                    with open(path) as fh:
                        for line in fh:
                            key, value = line.split("=")
                            print(key, value)
                            setattr(self, key, float(value))
            """,
    })
    result = migrate_project([str(tmp_path / "train.py")], Options(backend="ddp"), Mode.CHECK)
    rewritten = {os.path.basename(o.path) for f in result.files for o in f.others if o.output and o.output != o.source}
    assert rewritten == {"metrics.py"}, rewritten


def test_relative_imports_are_found_and_files_without_any_are_not_parsed(tmp_path, monkeypatch):
    """Project.relative_aliases parses a module only when its text can hold a relative import: the
    aliases of every spelling of one, and no parse (a cost paid for every script and every output
    the audit checks) for a module that has none."""
    import ast

    from distify import project as project_module

    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/train.py": "from .engine import fit\nfrom . import data as d\n",
        "pkg/cont.py": "import os\nfrom \\\n    .sub.deep import go\n",  # its only relative import
        "pkg/plain.py": "import os\nfrom os import path\nx = 'from here'\n",
        "pkg/engine.py": "", "pkg/data.py": "", "pkg/sub/__init__.py": "", "pkg/sub/deep.py": "",
    })
    project = Project.around(str(tmp_path / "pkg" / "train.py"))
    parsed = []
    real = ast.parse
    monkeypatch.setattr(project_module.ast, "parse", lambda data, *a, **k: parsed.append(data) or real(data, *a, **k))
    train = project.script(str(tmp_path / "pkg" / "train.py"))
    assert project.relative_aliases(train) == {"fit": "pkg.engine.fit", "d": "pkg.data"}
    cont = project.script(str(tmp_path / "pkg" / "cont.py"))
    assert project.relative_aliases(cont) == {"go": "pkg.sub.deep.go"}
    assert len(parsed) == 2
    assert project.relative_aliases(project.script(str(tmp_path / "pkg" / "plain.py"))) == {}
    assert len(parsed) == 2  # plain.py: read, not parsed


# a DataLoader subclass the project defines (issue 21: decide from what the class is) -----------

SUBCLASS = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "loader_subclass"


@pytest.mark.parametrize("variant", ["plain", "module alias", "no own __init__"])
def test_a_loader_subclass_of_the_project_is_refused_with_its_lines(variant, tmp_path):
    """runtime.shard_loader cannot rebuild a subclass (it raises at run time): the script is refused,
    naming the call's line and the class's, whatever the spelling of the call or of the class."""
    import shutil

    shutil.copytree(SUBCLASS / "in", tmp_path / "p")
    script, loaders = tmp_path / "p" / "train.py", tmp_path / "p" / "loaders.py"
    where = "loaders.py:8"
    if variant == "module alias":
        script.write_text(script.read_text().replace("from loaders import RegressionLoader", "import loaders as L")
                          .replace("= RegressionLoader(", "= L.RegressionLoader("))
    elif variant == "no own __init__":
        loaders.write_text(loaders.read_text() + "\n\nclass Plain(BaseDataLoader):\n    pass\n")
        script.write_text(script.read_text().replace("loaders import RegressionLoader", "loaders import Plain")
                          .replace("= RegressionLoader(64, args.batch_size)", "= Plain(make(), args.batch_size, True, 0.25)")
                          .replace("\n\ndef main():", "\n\ndef make():\n    return torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))\n\n\ndef main():"))
        where = "loaders.py:16"
    before = {p: p.read_bytes() for p in (tmp_path / "p").rglob("*.py")}
    r = _run(tmp_path / "p", "train.py")
    assert r.returncode == 3, r.stderr
    assert f"DST201 data_loader feeds the training loop and is a loaders." in r.stderr and f"({where}), a subclass of torch.utils.data.DataLoader" in r.stderr, r.stderr
    assert {p: p.read_bytes() for p in (tmp_path / "p").rglob("*.py")} == before


def test_a_loader_subclass_that_gives_itself_a_distributed_sampler_is_migrated(tmp_path):
    """The control of the refusal: a subclass whose __init__ builds a DistributedSampler is sharded
    already (runtime.shard_loader returns such a loader as it is): the script is migrated."""
    import shutil

    shutil.copytree(SUBCLASS / "in", tmp_path / "p")
    base = tmp_path / "p" / "base_loader.py"
    base.write_text(base.read_text().replace("from torch.utils.data.sampler import SubsetRandomSampler",
                                             "from torch.utils.data.sampler import SubsetRandomSampler\n"
                                             "from torch.utils.data.distributed import DistributedSampler")
                    .replace("super().__init__(sampler=self.sampler, **self.init_kwargs)",
                             "super().__init__(sampler=DistributedSampler(dataset), **self.init_kwargs)"))
    r = _run(tmp_path / "p", "--check", "train.py")
    assert r.returncode == 1 and "DST201" in r.stderr and "subclass" not in r.stderr, r.stderr


def test_the_audit_of_a_view_knows_the_helpers_it_migrated():
    """unet_get_loaders: utils.py joins the migration (it builds the loaders), and its writes and
    prints are guarded there; the audit of the outputs must see those helpers as migrated code of
    the view, not say "writes a file on every rank ... or let distify migrate utils.py" (DST955/956)."""
    script = Path(__file__).resolve().parent.parent / "fixtures" / "corpus" / "projects" / "unet_get_loaders" / "train.py"
    result = migrate_project([str(script)], Options(), Mode.CHECK)
    assert result.changed
    codes = [(f.path, x.code) for f in result.files for x in f.findings] + [
        (o.path, x.code) for f in result.files for o in f.others for x in o.findings]
    assert not [c for c in codes if c[1] in ("DST955", "DST956")], codes


FLAG = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "flag_loader_trainer"


@pytest.mark.parametrize("shape", ["self attribute", "local name", "rebound flag"])
@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_a_factory_that_shards_only_when_told_is_told_where_it_alone_builds_the_loader(shape, backend, tmp_path):
    """data_loader.get_data_loader(..., distributed, ...) builds `DistributedSampler(ds) if
    distributed else None`; called with False for training only (not shared with evaluation, so
    its module joins the migration). DDP: the call passes True (the process group exists in every
    run) and set_epoch goes on the sampler it returns; data_loader.py is left as it is. Horovod
    has no torch.distributed group for that sampler: refused at the line (DST901), as is any
    backend where the flag is rebound in the factory (control: what the caller passes is not what
    decides, so setting it proves nothing)."""
    import shutil

    shutil.copytree(FLAG / "in", tmp_path / "p")
    script = tmp_path / "p" / "train.py"
    factory = tmp_path / "p" / "data_loader.py"
    text = script.read_text().replace(
        "        self.val_loader, self.val_sampler = get_data_loader(self.args.batch_size, 32, 2, False, train=False)\n",
        "        self.val_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)\n")
    if shape == "local name":
        text = textwrap.dedent("""\
            import torch
            import torch.nn.functional as F

            from data_loader import get_data_loader


            def main():
                train_loader, train_sampler = get_data_loader(8, 64, 1, False, train=True)
                model = torch.nn.Linear(4, 1)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
                for epoch in range(2):
                    for x, y in train_loader:
                        loss = F.mse_loss(model(x), y)
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()


            if __name__ == "__main__":
                main()
            """)
    if shape == "rebound flag":
        source = factory.read_text()
        line = "    dataset = make_data(n, seed)\n"
        assert line in source
        factory.write_text(source.replace(line, line + "    distributed = distributed and torch.distributed.is_available()\n"))
    script.write_text(text)
    r = _run(tmp_path / "p", "--check", "--diff", "--backend", backend, "train.py")
    if backend == "horovod" or shape == "rebound flag":
        assert r.returncode == 3, r.stderr
        line = 20 if shape == "rebound flag" else 19
        assert f"data_loader.py:{line}:37: DST901 dataloader gets a DistributedSampler only when `distributed` is true" in r.stderr, r.stderr
        return
    assert r.returncode == 1, r.stderr
    assert "DST901" not in r.stderr and "DST951" not in r.stderr, r.stderr
    assert "get_data_loader() gives its loader a DistributedSampler when `distributed` is true; passed True here" in r.stderr
    added = [line[1:].strip() for line in r.stdout.splitlines() if line.startswith("+") and not line.startswith("+++")]
    call = "get_data_loader(self.args.batch_size, 64, 1, True, train=True)" if shape == "self attribute" else "get_data_loader(8, 64, 1, True, train=True)"
    sampler = "self.train_sampler" if shape == "self attribute" else "train_sampler"
    assert any(call in line for line in added), r.stdout
    assert f"{sampler}.set_epoch(epoch)" in added, r.stdout
    assert "data_loader.py" not in r.stdout  # the factory is not rewritten


TRAINER_CLASS = {
    "train.py": """\
        import torch
        import torch.nn as nn
        from torch.utils.data import TensorDataset

        from trainer import Trainer


        def main():
            data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
            trainer = Trainer(nn.Linear(4, 1), data)
            trainer.fit(2)


        if __name__ == "__main__":
            main()
        """,
    "trainer.py": """\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader


        class Trainer:
            def __init__(self, model, dataset, lr=0.1):
                self.model = model
                self.loader = DataLoader(dataset, batch_size=8, shuffle=True)
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)

            def fit(self, epochs):
                for epoch in range(epochs):
                    for x, y in self.loader:
                        self.optimizer.zero_grad()
                        nn.functional.mse_loss(self.model(x), y).backward()
                        self.optimizer.step()
        """,
}


def test_a_script_whose_training_runs_in_a_project_class_is_refused_not_silent(tmp_path):
    """The script builds neither loader nor optimizer: a Trainer of another module builds both in
    __init__ and trains in fit(). It used to be left unchanged in silence (exit 0, "no training
    loop" only under -v); now it is refused, naming the method that trains and its line, and nothing
    is written. Control: with a fit() that does not train, the script stays quiet."""
    write(tmp_path, TRAINER_CLASS)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.py")}
    r = _run(tmp_path, "train.py")
    assert r.returncode == 3, r.stderr
    assert "train.py:11:5: DST961 not migrated: training runs in trainer.fit() (trainer.Trainer.fit at trainer.py:12)" in r.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.py")} == before
    (tmp_path / "trainer.py").write_text("class Trainer:\n    def __init__(self, model, dataset):\n        pass\n\n"
                                         "    def fit(self, epochs):\n        return epochs\n")
    quiet = _run(tmp_path, "train.py")
    assert quiet.returncode == 0 and "DST961" not in quiet.stderr, quiet.stderr


@pytest.mark.parametrize("entry", ["train.py", "a_train.py"])  # the script listed after the module, or before
def test_a_directory_run_migrates_a_module_with_the_script_that_imports_it(tmp_path, entry):
    """`distify DIR` on a script and the module holding its loop: the module is migrated with the
    script (the project's expected trees) and written once, whatever order the files come in (a
    metamorphic guard: the module's own run now waits for the script's); a second run changes
    nothing."""
    import shutil

    shutil.copytree(LOOP / "in", tmp_path / "p")
    os.rename(tmp_path / "p" / "train.py", tmp_path / "p" / entry)
    r = _run(tmp_path, "p")
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("rewrote p/trainlib.py") == 1, r.stderr
    assert (tmp_path / "p" / "trainlib.py").read_text() == (LOOP / "expected.ddp" / "trainlib.py").read_text()
    assert (tmp_path / "p" / entry).read_text() == (LOOP / "expected.ddp" / "train.py").read_text()
    again = _run(tmp_path, "--check", "p")
    assert again.returncode == 0, again.stderr


def test_a_module_whose_script_is_refused_is_not_written_alone(tmp_path):
    """`distify DIR` on the Trainer-class project (the script refused: DST961): the module's own
    migration (a DDP wrap and a sampler, and no process group anywhere) is refused too, with its
    reason, and nothing is written. Control: the module alone is still migrated on its own."""
    write(tmp_path / "p", TRAINER_CLASS)
    before = {p: p.read_bytes() for p in (tmp_path / "p").rglob("*.py")}
    r = _run(tmp_path, "p")
    assert r.returncode == 3, r.stderr
    assert "refused p/trainer.py: not migrated: p/train.py, which imports it, was not migrated" in r.stderr, r.stderr
    assert {p: p.read_bytes() for p in (tmp_path / "p").rglob("*.py")} == before
    alone = _run(tmp_path, "p/trainer.py")
    assert alone.returncode == 1, alone.stderr


# train.py refused for a reason the cache keeps (DST201: a DataLoader subclass of its own), beside
# the Trainer module whose own migration changes it
CACHED_REFUSAL = {
    "train.py": """\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        import trainer


        class RegressionLoader(DataLoader):
            def __init__(self, dataset):
                super().__init__(dataset, batch_size=8, shuffle=True)


        def main():
            data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
            model = nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = RegressionLoader(data)
            for epoch in range(2):
                for x, y in loader:
                    optimizer.zero_grad()
                    nn.functional.mse_loss(model(x), y).backward()
                    optimizer.step()


        if __name__ == "__main__":
            main()
        """,
    "trainer.py": TRAINER_CLASS["trainer.py"],
}


def test_a_module_whose_script_the_cache_answered_refused_is_not_written_alone(tmp_path):
    """A project run twice with the cache: on the second run the cache answers train.py (refused)
    without parsing it, and trainer.py, which the cache does not keep (its own run rewrites it), is
    migrated again. The refused script's imports must still be read (runner._process_all reads those
    of the files the cache answered refused), so trainer.py is refused again and nothing is written.
    Control, run by hand on 2026-12-04: with only the files the cache did not answer read for
    imports, the second run wrote trainer.py alone."""
    write(tmp_path / "p", CACHED_REFUSAL)
    before = {p: p.read_bytes() for p in (tmp_path / "p").rglob("*.py")}
    env = dict(os.environ, DISTIFY_CACHE_DIR=str(tmp_path / "cache"))
    for run in ("first", "second"):
        r = subprocess.run([sys.executable, "-m", "distify", "p"], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert r.returncode == 3, (run, r.stderr)
        assert "refused p/trainer.py: not migrated: p/train.py, which imports it" in r.stderr, (run, r.stderr)
        assert {p: p.read_bytes() for p in (tmp_path / "p").rglob("*.py")} == before, run
        assert len([p for p in (tmp_path / "cache").rglob("*") if p.is_file()]) == 1, "train.py's refusal is not cached"


def test_control_without_settling_the_module_alone_is_half_migrated(tmp_path, monkeypatch):
    """The same project in process with ``settle_reached`` switched off: the module's own
    migration is written though the script that imports it was refused: the half migration the
    test above rules out."""
    import distify.project as project
    from distify.engine import Status

    write(tmp_path / "p", TRAINER_CLASS)
    paths = sorted(str(p) for p in (tmp_path / "p").rglob("*.py"))
    settled = {Path(f.path).name: f.status for f in migrate_project(paths, Options(), Mode.WRITE).files}
    assert settled == {"train.py": Status.REFUSED, "trainer.py": Status.REFUSED}, settled
    monkeypatch.setattr(project, "settle_reached", lambda results, reached: list(results))
    before = (tmp_path / "p" / "trainer.py").read_bytes()
    loose = {Path(f.path).name: f.status for f in migrate_project(paths, Options(), Mode.WRITE).files}
    assert loose["trainer.py"] is Status.CHANGED and (tmp_path / "p" / "trainer.py").read_bytes() != before
