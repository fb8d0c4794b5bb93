"""Facts of distributed code (distify.parallel) read every statement of a line: `k = 0; x = ...`
binds `x` as surely as a line of its own (the audit once called a model unwrapped, and refused
distify's own output, because the wrapper shared its line with another statement)."""

from __future__ import annotations

import libcst as cst
import pytest

from distify.anatomy import analyse
from distify.parallel import container_of, loader_loops, same_modules, wrapped_models

HEAD = '''\
import torch
from torch.utils.data import DataLoader
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

'''


def _a(body: str):
    return analyse(cst.parse_module(HEAD + body))


@pytest.mark.parametrize("first", ["", "k = 0; "])
def test_a_wrapper_bound_after_another_statement(first):
    a = _a(f"net = torch.nn.Linear(2, 2)\n{first}model = DDP(net)\n")
    assert wrapped_models(a) == ({"model"}, {"net"})


@pytest.mark.parametrize("first", ["", "k = 0; "])
def test_a_container_of_loaders_bound_after_another_statement(first):
    a = _a(f"{first}loaders = [DataLoader(range(4)), DataLoader(range(8))]\n")
    assert [container_of(c) for c in a.calls if c.qualname == "torch.utils.data.DataLoader"] == ["loaders", "loaders"]
    # the statement beside it binds no container of the call
    b = _a(f"loaders = [DataLoader(range(4))]; {first or 'k = 0'}\n")
    assert [container_of(c) for c in b.calls if c.qualname == "torch.utils.data.DataLoader"] == ["loaders"]


@pytest.mark.parametrize("first", ["", "k = 0; "])
def test_a_second_name_for_a_module_bound_after_another_statement(first):
    a = _a(f"model = torch.nn.Linear(2, 2)\n{first}raw = model\n")
    assert same_modules(a, {"model"}) == {"model", "raw"}


@pytest.mark.parametrize("first", ["", "k = 0; "])
def test_a_progress_bar_bound_after_another_statement_leads_to_its_loader(first):
    """The loader is kept in a dict and reached through a bar bound on a shared line: only the audit's
    own look-through (parallel.loader_loops) connects the loop to it."""
    a = _a(
        "def main(model):\n"
        "    loaders = {'train': DataLoader(range(8))}\n"
        f"    {first}bar = tqdm(loaders['train'])\n"
        "    for x in bar:\n"
        "        print(model(x))\n"
    )
    [loader] = a.loaders
    assert [type(loop) for loop, _ in loader_loops(a).get(loader, [])] == [cst.For]
