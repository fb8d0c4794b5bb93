"""A training loader built by a function of the project's own module next to the script (issue 13,
category 4; issue 21): distify reads that module and migrates the loader where it is built: a plain
loader gets its DistributedSampler in the factory, one that has a DistributedSampler already only
gets set_epoch, one with its own sampler/batch_sampler has it shared out there (ShareSampler).
Without the module to read (stdin), the script re-shards the loader at run time
(runtime.shard_loader)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.options import Options
from distify.siblings import find_builder

SCRIPT = textwrap.dedent('''\
    import torch
    import torch.nn.functional as F

    from {module} import get_training_dataloader


    def main():
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train_loader = get_training_dataloader(batch_size=8)
        for epoch in range(3):
            for x, y in train_loader:
                optimizer.zero_grad()
                F.mse_loss(model(x), y).backward()
                optimizer.step()


    if __name__ == "__main__":
        main()
''').format(module="utils")  # the project's own module, written next to the script by each test

UTILS = {
    "plain": "    return DataLoader(ds, batch_size=batch_size, shuffle=True)\n",
    "distributed": "    sampler = DistributedSampler(ds)\n    return DataLoader(ds, batch_size=batch_size, sampler=sampler)\n",
    "sampler": "    return DataLoader(ds, batch_size=batch_size, sampler=WeightedRandomSampler(w, len(ds)))\n",
    "batch_sampler": "    return DataLoader(ds, batch_sampler=BucketSampler(ds, batch_size))\n",
}


def _project(tmp_path: Path, kind: str) -> Path:
    (tmp_path / "utils.py").write_text(
        "from torch.utils.data import DataLoader, DistributedSampler\n\n\n"
        "def get_training_dataloader(batch_size=16):\n    ds = make_dataset()\n" + UTILS[kind]
    )
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return script


def _migrate(script: Path, backend="ddp"):
    return migrate_source(script.read_bytes(), Options(backend=backend), str(script))


@pytest.mark.parametrize("kind,expected", [("plain", None), ("distributed", "distributed"), ("sampler", "sampler"),
                                           ("batch_sampler", "batch_sampler")])
def test_find_builder_reads_the_sampler_the_module_gives(tmp_path, kind, expected):
    script = _project(tmp_path, kind)
    b = find_builder(str(script), "utils.get_training_dataloader")
    assert (b.file, b.line, b.sampler) == ("utils.py", 4, expected)


def test_find_builder_packages_and_what_it_cannot_read(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "loaders.py").write_text("def train_loader():\n    return DataLoader(ds)\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    script = str(tmp_path / "train.py")
    assert find_builder(script, "data.loaders.train_loader").where == "data/loaders.py:1"
    assert find_builder(script, "data.loaders.missing") is None
    assert find_builder(script, "broken.f") is None
    assert find_builder(script, "elsewhere.f") is None
    assert find_builder(None, "data.loaders.train_loader") is None


def _project_run(script: Path, backend="ddp") -> dict:
    """The project migration (issue 21): {file name: (output text, findings)} for each file it rewrites."""
    from distify.project import migrate_project

    result = migrate_project([str(script)], Options(backend=backend))
    return {Path(f.path).name: (f.output.decode(), f.findings) for f in result.files}


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_plain_loader_is_sharded_where_the_module_builds_it(tmp_path, backend):
    """The module next to the script is the project's: its factory gets the sampler (not a run-time
    re-shard in the script), the script the epoch's set_epoch, the report the factory's line."""
    out = _project_run(_project(tmp_path, "plain"), backend)
    utils, findings = out["utils.py"]
    assert "sampler=DistributedSampler" in utils and "shuffle=True)" in utils
    script, _ = out["train.py"]
    assert "shard_loader" not in script and "train_loader.sampler.set_epoch(epoch)" in script
    assert any(f.code == "DST201" and "returned by a helper" in f.message for f in findings)


def test_loader_with_a_distributed_sampler_only_gets_set_epoch(tmp_path):
    script = _project(tmp_path, "distributed")
    result = _migrate(script)
    out = result.output.decode()
    assert "shard_loader" not in out and "train_loader.sampler.set_epoch(epoch)" in out
    again = migrate_source(result.output, Options(backend="ddp"), str(script))
    assert again.output == result.output


@pytest.mark.parametrize("kind", ["sampler", "batch_sampler"])
def test_loader_with_its_own_sampler_is_shared_out_where_it_is_built(tmp_path, kind):
    """The factory's own sampler keeps its draw and is shared out (DST901, runtime.ShareSampler)."""
    out = _project_run(_project(tmp_path, kind))
    utils, findings = out["utils.py"]
    assert f"{kind}=runtime.ShareSampler(" in utils
    assert "shard_loader" not in out["train.py"][0]
    assert any(f.code == "DST901" for f in findings)


def test_without_the_module_the_loader_is_resharded_all_the_same(tmp_path):
    """No file to read (stdin, a module elsewhere): shard_loader decides at run time."""
    script = _project(tmp_path, "batch_sampler")
    result = migrate_source(script.read_bytes(), Options(backend="ddp"))
    assert b"train_loader = runtime.shard_loader(train_loader)" in result.output


def test_cli_reads_the_module_next_to_the_file(tmp_path):
    script = _project(tmp_path, "batch_sampler")
    proc = subprocess.run([sys.executable, "-m", "distify", str(script), "--diff"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    assert "shard_loader" not in proc.stdout and "utils.py" in proc.stdout
    assert "batch_sampler=runtime.ShareSampler(BucketSampler(ds, batch_size))" in proc.stdout


def test_the_helper_modules_calls_are_known_by_their_imports(tmp_path: Path) -> None:
    """What the helper module calls is resolved through its own imports: torch's DataLoader and
    DistributedSampler under other names are seen; a class of the module spelled DataLoader is not
    torch's. Control: with callees compared by spelling (`== "DataLoader"`), the aliased helper reads
    as 'nothing seen' and the module's own DataLoader class as a loader."""
    (tmp_path / "aliased.py").write_text(
        "from torch.utils.data import DataLoader as Batches\n"
        "from torch.utils.data.distributed import DistributedSampler as Split\n\n\n"
        "def build(ds):\n    return Batches(ds, batch_size=4, sampler=Split(ds))\n"
    )
    (tmp_path / "own.py").write_text(
        "class DataLoader:\n    pass\n\n\ndef build(ds, s):\n    return DataLoader(ds, sampler=s)\n"
    )
    script = str(tmp_path / "train.py")
    assert find_builder(script, "aliased.build").sampler == "distributed"
    assert find_builder(script, "own.build").sampler is None
