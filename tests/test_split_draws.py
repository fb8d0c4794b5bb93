"""DST208 / DST965: the dataset a DistributedSampler shards is made by a random draw the script never
seeds (distify.split_draws), so every rank would shard another split. DST208 gives the draw a seed
every rank shares (runtime.shared_seed()); the audit (DST965) refuses an output where a draw is left
unseeded. Each case has its control: the same script seeded, or the draw kept away from the
training set, stays quiet; the same script with DST208 switched off is refused, not written."""

from __future__ import annotations

from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.rules.base import Options

SCRIPT = '''\
import random
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset, random_split

SEED_LINE
def make_sets(full):
    return random_split(full, [48, 16]SPLIT_KW)


def main():
    xs = torch.arange(64.0).reshape(64, 1)
    full = TensorDataset(xs, xs * 2)
    train_ds, val_ds = make_sets(full)
    train_loader = DataLoader(TRAIN_DS, batch_size=8, shuffle=True)
    val_loader = DataLoader(val_ds, batch_size=8)
    model = nn.Linear(1, 1)
    optimizer = torch.optim.Adam(model.parameters())
    for epoch in range(2):
        for step, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            (model(x) - y).pow(2).mean().backward()
            optimizer.step()
    with torch.no_grad():
        print(sum(nn.functional.mse_loss(model(x), y).item() for x, y in val_loader))


if __name__ == "__main__":
    main()
'''


def script(seed: str = "", kw: str = "", train: str = "train_ds") -> bytes:
    return SCRIPT.replace("SEED_LINE", seed).replace("SPLIT_KW", kw).replace("TRAIN_DS", train).encode()


def draw_line(source: bytes) -> int:
    return next(i for i, text in enumerate(source.decode().splitlines(), 1) if "return random_split(" in text)


def seeded(source: bytes, backend: str) -> list:
    """The lines DST208 gave a shared seed (the output written, the audit quiet)."""
    out = migrate_source(source, Options(backend=backend))
    assert out.changed and not out.refused
    assert not [f for f in out.findings if f.code == "DST965"]
    return [f.line for f in out.findings if f.code == "DST208" and f.kind == "fix"]


def refused(source: bytes, backend: str = "ddp") -> list:
    """The lines DST965 refuses the file at (nothing written)."""
    out = migrate_source(source, Options(backend=backend))
    assert out.refused and out.output == source
    return [f.line for f in out.findings if f.code == "DST965" and f.message.endswith("file not migrated")]


@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
def test_an_unseeded_split_of_the_training_set_gets_a_shared_seed(backend, monkeypatch) -> None:
    # in make_sets(), reached through the call that binds train_ds
    source = script()
    assert seeded(source, backend) == [draw_line(source)]
    out = migrate_source(source, Options(backend=backend)).output.decode()
    assert "random_split(full, [48, 16], generator=torch.Generator().manual_seed(runtime.shared_seed()))" in out
    # control: DST208 switched off, the output would shard another split on every rank: refused
    from distify.rules.dst208_shared_split_seed import RULE

    monkeypatch.setattr(type(RULE), "apply", lambda self, ctx: None)
    assert refused(source, backend) == [draw_line(source)]


@pytest.mark.parametrize("seed, kw", [
    ("torch.manual_seed(0)\n", ""),  # the global generator seeded: the same split on every rank
    ("", ", generator=torch.Generator().manual_seed(3)"),  # a generator of its own
    ("", ", torch.Generator().manual_seed(3)"),  # ... passed positionally (library.SPLIT_DRAWS' position)
])
def test_a_seeded_split_is_left_as_it_is(seed, kw) -> None:
    source = script(seed, kw)
    assert seeded(source, "ddp") == []
    assert b"shared_seed" not in migrate_source(source, Options(backend="ddp")).output


def test_a_seed_of_another_generator_does_not_count() -> None:
    # control of the family: random.seed / np.random.seed leave torch's generator unseeded
    source = script("random.seed(0)\nnp.random.seed(0)\n")
    assert seeded(source, "ddp") == [draw_line(source)]


def test_a_split_that_only_the_evaluation_reads_is_left_as_it_is() -> None:
    # control of the data flow: the training loader reads the whole set, the split only feeds validation
    assert seeded(script(train="full"), "ddp") == []


def test_a_draw_whose_arguments_may_carry_a_seed_is_refused() -> None:
    # `**opts` may hold generator=: adding one could pass it twice; DST208 warns, DST965 refuses
    source = SCRIPT.replace("SEED_LINE", "opts = {}\n").replace("SPLIT_KW", ", **opts").replace("TRAIN_DS", "train_ds").encode()
    assert refused(source) == [draw_line(source)]
    out = migrate_source(source, Options(backend="ddp"))
    assert [f.kind for f in out.findings if f.code == "DST208"] == ["warning"]


def test_shared_seed_is_a_collective() -> None:
    # DST911, DST958 and the rank guards treat runtime.shared_seed() as every rank's call
    from distify.records import COLLECTIVES

    assert "distify.runtime.shared_seed" in COLLECTIVES


SAMPLED = '''\
import numpy as np
import torch
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

SEED_LINE
xs = torch.linspace(-1, 1, 64).reshape(32, 2)
data = TensorDataset(xs, xs)
order = np.random.permutation(len(data))
loader = DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(order[8:].tolist()))
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.l1_loss(model(x), y).backward()
        opt.step()
'''


@pytest.mark.parametrize("seed, found", [("", True), ("np.random.seed(4)", False)])
def test_the_indices_of_a_shared_sampler_are_followed(seed, found) -> None:
    # DST901 shares SubsetRandomSampler out with runtime.ShareSampler: its indices must be alike too;
    # the draw becomes the same method of a RandomState of its own (the global stream untouched)
    source = SAMPLED.replace("SEED_LINE", seed).encode()
    assert bool(seeded(source, "ddp")) is found
    out = migrate_source(source, Options(backend="ddp")).output
    assert (b"order = np.random.RandomState(runtime.shared_seed()).permutation(len(data))" in out) is found


LEARNT = (Path(__file__).resolve().parents[1] / "fixtures" / "DST901" / "loss_weighted_sampler.in.py").read_text()
WRITE = "            hardness[idx] = per_sample.detach() + 1e-3\n"


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_a_sampler_built_from_weights_the_training_writes_is_refused(backend) -> None:
    out = migrate_source(LEARNT.encode(), Options(backend=backend))
    assert not out.changed and [f.line for f in out.findings if f.code == "DST901"] == [
        LEARNT.splitlines().index(WRITE.rstrip("\n")) + 1]
    # control: weights fixed before training (the write taken out) are shared out as before
    assert WRITE in LEARNT
    fixed = migrate_source(LEARNT.replace(WRITE, "").encode(), Options(backend=backend))
    assert fixed.changed and b"ShareSampler(sampler)" in fixed.output


# one split, spelled four ways: by what the callee resolves to through the imports, never by its name
SPELLED = '''\
import torch
import torch.nn as nn
IMPORT


def main():
    xs = torch.arange(64.0).reshape(64, 1)
    full = torch.utils.data.TensorDataset(xs, xs * 2)
    fit_set, held_out = CALL(full, [48, 16])
    loader = torch.utils.data.DataLoader(fit_set, batch_size=8, shuffle=True)
    net = nn.Linear(1, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            (net(x) - y).pow(2).mean().backward()
            opt.step()


if __name__ == "__main__":
    main()
'''
SPELLINGS = [
    ("from torch.utils.data import random_split", "random_split"),
    ("from torch.utils.data import random_split as cut", "cut"),
    ("import torch.utils.data as tud", "tud.random_split"),
    ("from torch.utils.data import dataset as parts", "parts.random_split"),
]


def spelled(imp: str, call: str) -> bytes:
    return SPELLED.replace("IMPORT", imp).replace("CALL", call).encode()


@pytest.mark.parametrize("imp, call", SPELLINGS)
def test_the_draw_is_known_by_what_it_resolves_to(imp, call) -> None:
    source = spelled(imp, call)
    out = migrate_source(source, Options(backend="ddp"))
    assert [f.code for f in out.findings if f.code in ("DST208", "DST965")] == ["DST208"]
    first = migrate_source(spelled(*SPELLINGS[0]), Options(backend="ddp")).output.decode()
    # the same migration as the first spelling's, but for the spelling itself
    assert out.output.decode().replace(imp, SPELLINGS[0][0]).replace(f"{call}(", "random_split(") == first
    assert f"{call}(full, [48, 16], generator=torch.Generator().manual_seed(runtime.shared_seed()))" in out.output.decode()


def test_a_function_of_the_script_spelled_like_the_draw_is_left_alone() -> None:
    # control of the spelling: the script's own random_split (a fixed cut) is no draw
    own = "def random_split(ds, lens):\n    return torch.utils.data.Subset(ds, range(lens[0])), None\n"
    source = spelled("import torch.utils.data\n\n\n" + own, "random_split")
    out = migrate_source(source, Options(backend="ddp"))
    assert out.changed and not [f for f in out.findings if f.code in ("DST208", "DST965")]
    assert b"shared_seed" not in out.output


HELPER = '''\
import random

import torch
from torch.utils.data import Subset, TensorDataset
SEED_LINE

def make_sets(n):
    ids = list(range(n))
    random.shuffle(ids)
    xs = torch.linspace(-1, 1, n).unsqueeze(1)
    full = TensorDataset(xs, 2 * xs)
    return Subset(full, ids[:48]), Subset(full, ids[48:])
'''
ENTRY = '''\
import torch
from torch.utils.data import DataLoader

from data import make_sets


def main():
    train_set, val_set = make_sets(64)
    loader = DataLoader(train_set, batch_size=8, shuffle=True)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()


if __name__ == "__main__":
    main()
'''


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
@pytest.mark.parametrize("seed", ["", "random.seed(0)"])
def test_a_split_drawn_in_another_module_of_the_project_is_refused_with_its_line(tmp_path, backend, seed) -> None:
    # distify does not rewrite data.py, so it cannot give that draw a shared seed: refused, naming it;
    # control: the helper module seeds Python's generator, and the script is migrated as before
    (tmp_path / "data.py").write_text(HELPER.replace("SEED_LINE", seed))
    script = tmp_path / "train.py"
    script.write_text(ENTRY)
    out = migrate_source(ENTRY.encode(), Options(backend=backend), path=str(script))
    said = [(f.line, f.kind) for f in out.findings if f.code == "DST208"]
    if seed:
        assert out.changed and not out.refused and said == []
    else:
        assert out.refused and out.output == ENTRY.encode()
        assert said == [(8, "warning")]
        assert "random.shuffle() at data.py:9" in next(f.message for f in out.findings if f.code == "DST208")
