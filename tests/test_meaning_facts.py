"""Facts decided from what the code does, never from how the user spelled it (issue #21, item 3).

Each test states a fact on a small script whose names say nothing (or say the wrong thing), and
the metamorphic tests (tests/test_metamorphic.py) hold every fixture to the same rule. The controls
named in each docstring were run by putting the old spelling test back."""

from __future__ import annotations

import pytest

from distify.anatomy import analyse
import libcst as cst

HEAD = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
a = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
b = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
"""


def _roles(src: str) -> dict:
    return {l.target: l.role for l in analyse(cst.parse_module(src)).loaders}


@pytest.mark.parametrize("names", [("a", "b"), ("val_loader", "train_loader")])
def test_loader_role_from_what_the_loop_does_with_the_batches(names) -> None:
    """A loader only a generator expression reads, under no_grad, evaluates; one a `while` loop draws
    from with next() (the iterator made again on StopIteration) trains. Swapped names (`val_loader`
    for the one that trains) change nothing. Control: with the role guessed from the names again,
    or with draws counted only inside `for` loops, or comprehensions not read, this test fails."""
    src = HEAD + """
it = iter(a)
step = 0
while step < 4:
    try:
        x, y = next(it)
    except StopIteration:
        it = iter(a)
        x, y = next(it)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    step += 1
with torch.no_grad():
    total = sum(nn.functional.mse_loss(model(x), y).item() for x, y in b)
"""
    first, second = names
    src = src.replace("\na =", f"\n{first} =").replace("\nb =", f"\n{second} =")
    src = src.replace("iter(a)", f"iter({first})").replace("in b)", f"in {second})")
    assert _roles(src) == {first: "train", second: "eval"}


def test_a_loader_nothing_reads_has_no_role_whatever_its_name() -> None:
    """Control for the name: `val_loader` and `train_loader` built and never iterated are neither
    sharded nor evaluated; only a loop over one gives it a role."""
    src = HEAD.replace("\na =", "\ntrain_loader =").replace("\nb =", "\nval_loader =")
    assert set(_roles(src).values()) == {"unknown"}
    assert _roles(src + "for x, y in val_loader:\n    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\n")[
        "val_loader"
    ] == "train"


LIB_SAVE = """import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import AutoModelForSequenceClassification

model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
data = DataLoader(TensorDataset(torch.randint(0, 9, (8, 4)), torch.randint(0, 2, (8,))), batch_size=2)
for epoch in range(2):
    for x, y in data:
        opt.zero_grad()
        model(input_ids=x, labels=y).loss.backward()
        opt.step()
model.save_pretrained("out")
"""


def _migrate(src: str) -> str:
    from distify.engine import migrate_source
    from distify.rules.base import Options

    return migrate_source(src.encode(), Options(backend="ddp")).output.decode()


def test_save_pretrained_of_a_library_model_is_a_checkpoint_write() -> None:
    out = _migrate(LIB_SAVE)
    assert "if runtime.is_main_process():\n    model.module.save_pretrained(\"out\")" in out


def test_a_method_of_the_scripts_own_class_is_not_the_librarys_save_whatever_its_name() -> None:
    """A local class's own `save_pretrained` runs the script's code: the writes inside it are guarded
    where they are, and the call is the same call as one to a method spelled `dump`. Control: with
    the call taken for Hugging Face's by its name (the old SAVE_METHODS test), the two differ."""
    src = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(nn.Linear):
    def save_pretrained(self, path):
        torch.save(self.state_dict(), path)


model = Regressor(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
for epoch in range(2):
    for x, y in data:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
model.save_pretrained("out.pt")
"""
    out = _migrate(src)
    assert "        if runtime.is_main_process():\n            torch.save(self.state_dict(), path)" in out
    assert _migrate(src.replace("save_pretrained", "dump")) == out.replace("save_pretrained", "dump")


RANKED = """import argparse
import os
import torch
import torch.distributed as d
import torch.multiprocessing as mp


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--local-rank", type=int, default=0)
    return p.parse_args()


def leader():
    return d.get_rank() == 0


def work(i, n):
    pass


args = get_args()
v1 = d.get_rank()
v2 = int(os.environ["LOCAL_RANK"])
v3 = torch.device("cuda", v2)
v4 = f"out_{v2}.pt"
v5 = f"out_{v3}.pt"
v6 = f"log_{os.getpid()}.txt"
rank = 3
gpu_rank_pid = "ckpt.pt"
worker_count = torch.cuda.device_count()
mp.spawn(work, args=(2,), nprocs=2)
"""


def _facts(src: str = RANKED):
    a = analyse(cst.parse_module(src))
    return a, a.facts


def _condition(test: str):
    """The facts of RANKED with `if <test>: pass` where the test's names are bound, and that test."""
    if test.startswith("i "):
        src = RANKED.replace("def work(i, n):\n    pass", f"def work(i, n):\n    if {test}:\n        pass")
    else:
        src = RANKED + f"if {test}:\n    pass\n"
    a, facts = _facts(src)
    ifs = [s for s in facts.statements() if isinstance(s, cst.If)]
    return facts, ifs[-1].test


@pytest.mark.parametrize(
    "test,ranked",
    [
        ("v1 == 0", True),  # a value of dist.get_rank()
        ("v2 > 0", True),  # the launcher's LOCAL_RANK
        ("leader()", True),  # a function of the script that returns a rank flag
        ("args.local_rank == 0", True),  # --local-rank, parsed in a helper
        ("i == 0", True),  # the process index mp.spawn hands its function
        ("rank == 0", False),  # named rank, holds a constant
        ("worker_count > 1", False),  # named worker, the same on every rank
        ("v3.type == 'cuda'", False),  # a device built from the rank is no rank number
    ],
)
def test_rank_conditions_by_data_flow(test, ranked) -> None:
    """Control: with the old identifier regex back in distify.rank (`(^|_)rank$`...), `rank == 0`
    counts and `leader()`/`i == 0` need their names; the metamorphic DST403 control covers text."""
    facts, node = _condition(test)
    assert facts.rank_condition(node) is ranked


def test_per_rank_file_names_by_data_flow() -> None:
    """A path built from the local rank names a per-rank file; one built from a device object (the
    same on many hosts) and a string in a name spelled `gpu_rank_pid` do not; a path made from
    os.getpid() does. Control: the old name-substring test (`gpu`, `pid`) fails the third assertion."""
    a, _ = _facts()
    assert a.mentions_rank(cst.parse_expression("open(v4, 'w')"))
    assert not a.mentions_rank(cst.parse_expression("open(v5, 'w')"))
    assert not a.mentions_rank(cst.parse_expression("open(gpu_rank_pid, 'w')"))
    assert a.mentions_rank(cst.parse_expression("open(v6, 'w')"))


def test_gradients_by_data_flow() -> None:
    """What a hand-written all-reduce reduces (DST909, DST954, the Horovod conversion): gradients
    are torch's `.grad` and the names bound from it, not names containing `grad`. Control: with the
    old `"grad" in ctx.code(arg)` test, the loss total spelled grad_norm_total counts too."""
    from distify.grad_values import gradient_value

    src = """import torch
import torch.distributed as dist

model = torch.nn.Linear(2, 2)
v1 = [p.grad for p in model.parameters()]
for v2 in v1:
    dist.all_reduce(v2)
grad_norm_total = torch.tensor(0.0)
dist.all_reduce(grad_norm_total)
"""
    a = analyse(cst.parse_module(src))
    reduced = [c.call.args[0].value for c in a.calls if c.qualname == "torch.distributed.all_reduce"]
    assert [gradient_value(a.facts, r) for r in reduced] == [True, False]


DP_CHATTER = """import logging

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

logger = logging.getLogger(__name__)
model = nn.Linear(4, 1)
if torch.cuda.device_count() > 1:
    logger.info("using %d GPUs", torch.cuda.device_count())
    model = nn.DataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
for epoch in range(2):
    for x, y in data:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
"""


def test_a_logger_is_known_by_what_it_is_not_its_name() -> None:
    """DST902 removes an `if` that only chose DataParallel and said so: a logger's line says so
    whatever the logger is called. Control: with the old `"log" in <receiver name>` test back, the
    renamed logger keeps a dead `if` that the original loses, and this test fails."""
    out = _migrate(DP_CHATTER)
    assert "DataParallel" not in out and "device_count() > 1" not in out
    assert _migrate(DP_CHATTER.replace("logger", "v7")) == out.replace("logger", "v7")


TRAIN = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(4, 1)
data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
for epoch in range(2):
    for x, y in data:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
"""


def test_an_lr_already_scaled_by_the_world_size_is_known_by_the_call() -> None:
    """--scale-lr leaves an lr that already multiplies by the world size, however torch.distributed
    is imported. Control: with the old test (the text `dist.get_world_size()` in the lr's source) the
    aliased call is not seen and the lr is scaled twice."""
    from distify.engine import migrate_source
    from distify.rules.base import Options

    src = "from torch.distributed import get_world_size as procs\n" + TRAIN.replace(
        "data = DataLoader", "opt = torch.optim.SGD(model.parameters(), lr=0.1 * procs())\ndata = DataLoader")
    out = migrate_source(src.encode(), Options(backend="ddp", scale_lr=True)).output.decode()
    assert "lr=0.1 * procs())" in out and "get_world_size()" not in out.replace("get_world_size as procs", "")


def test_a_pathlib_directory_is_made_on_rank_0_whatever_it_is_called() -> None:
    """`v1 = pathlib.Path("out"); v1.mkdir(...)` makes a directory: rank 0 makes it. Control: the old
    test (the text `Path` in the call's source) misses it and the mkdir runs on every rank."""
    src = "import pathlib\n" + TRAIN.replace(
        "data = DataLoader", "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nv1 = pathlib.Path('out')\nv1.mkdir(exist_ok=True)\ndata = DataLoader")
    out = _migrate(src)
    assert "if runtime.is_main_process():\n    v1.mkdir(exist_ok=True)" in out


@pytest.mark.parametrize("param", ["x", "scheduler", "grad_scaler", "lr_sched"])
def test_a_step_trains_whatever_its_receiver_is_called(param) -> None:
    """A function that steps what it is handed (here the optimizer) trains, whatever its parameter
    is called: `training_call` once took `x.step()` for a scheduler's or a grad scaler's step when
    the receiver's spelling held "sched" or "scaler". Control: that test put back, the
    `scheduler`, `grad_scaler` and `lr_sched` cases fail."""
    src = HEAD + f"\n\ndef advance({param}):\n    {param}.step()\n\n\nadvance(opt)\n"
    trainers = analyse(cst.parse_module(src)).facts.trainers
    assert [fn.name.value for fn in trainers] == ["advance"]


@pytest.mark.parametrize("param", ["data", "a"])
def test_a_parameter_spelled_like_a_global_loader_is_not_that_loader(param) -> None:
    """`def train(a): for x, y in a: ...` called as `train(b)`: the loop trains on `b`, and the
    module's own `a` (evaluated only) keeps its role whatever the parameter is called. A global's
    readers once included every function, even one whose parameter shadows the name, so `a` was
    taken for a training loader and sharded (its printed evaluation then covered rank 0's half).
    Control: the shadowing test taken out of `placed`, the `a` case fails."""
    src = HEAD + (
        f"\n\ndef train({param}):\n    for x, y in {param}:\n        opt.zero_grad()\n"
        "        model(x).sum().backward()\n        opt.step()\n\n\n"
        "train(b)\nfor x, y in a:\n    print(model(x).sum().item())\n"
    )
    roles = _roles(src)
    assert roles == _roles(HEAD + "\n\ndef train(data):\n    for x, y in data:\n        opt.zero_grad()\n"
                           "        model(x).sum().backward()\n        opt.step()\n\n\n"
                           "train(b)\nfor x, y in a:\n    print(model(x).sum().item())\n")
    assert roles["a"] != roles["b"], roles


@pytest.mark.parametrize("me", ["self", "this"])
def test_a_methods_instance_parameter_is_known_by_its_place_not_its_name(me) -> None:
    """`loader` binds the method's second parameter whatever its first (the instance) is called:
    Facts.params once dropped the first parameter only when it was spelled `self`. Control: that
    test put back, the `this` case fails."""
    src = HEAD + (
        f"\n\nclass Trainer:\n    def fit(self, data):\n        pass\n\n    def run({me}, data, epochs):\n"
        f"        return data\n\n\nTrainer().run(a, 2)\n"
    )
    an = analyse(cst.parse_module(src))
    run = next(m for m in an.facts.methods if m.name.value == "run")
    assert an.facts.params(run) == ["data", "epochs"]
