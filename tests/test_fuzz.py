"""Property tests: mutated fixture inputs never crash distify, and its outputs stay sound.

A derandomized hypothesis sample (200 examples with ``--full``, 25 in the quick run) of what
``bench/fuzz.py`` checks at scale (mutations and properties are imported from there): for both
backends, ``migrate_source`` returns or raises ``InputError`` (only for input that does not
compile), every changed output compiles, migrating an output again changes nothing, and an input
without a ``.backward(`` call comes back unchanged. A sample also goes through the real CLI: never
exit 123, never a traceback, and the files it writes equal ``migrate_source``'s output.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from distify.engine import InputError, migrate_source
from distify.rules.base import Options

REPO = Path(__file__).resolve().parent.parent


def _load_fuzz():
    spec = importlib.util.spec_from_file_location("distify_bench_fuzz", REPO / "bench" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzz()
CORPUS = fuzz.corpus(str(REPO))
BACKENDS = fuzz.BACKENDS


_FUZZ = dict(
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: the failure message holds the whole input
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_MUTATED = given(
    case=st.sampled_from(CORPUS),
    names=st.lists(st.sampled_from(sorted(fuzz.MUTATIONS)), min_size=1, max_size=3),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)


@settings(max_examples=25, **_FUZZ)
@_MUTATED
def test_a_sample_of_mutated_inputs_keeps_the_properties(case, names, seed):
    """The quick run's sample of the sweep below."""
    _keeps_the_properties(case, names, seed)


@pytest.mark.sweep  # 200 examples: with --full (CI), see conftest.py
@settings(max_examples=200, **_FUZZ)
@_MUTATED
def test_mutated_inputs_keep_the_properties(case, names, seed):
    _keeps_the_properties(case, names, seed)


def _keeps_the_properties(case, names, seed):
    path, source = case
    data, applied = fuzz.mutate(random.Random(seed), source, names)
    for backend in BACKENDS:
        check = fuzz.check_source(data, backend)
        assert not check.failed, (
            f"{check.outcome} ({backend}) on {path} mutated by {applied}: {check.detail}\n"
            f"--- input ---\n{data.decode('utf-8', 'replace')}"
        )


@pytest.mark.parametrize("name", sorted(fuzz.MUTATIONS))
def test_each_mutation_applies_and_mostly_keeps_valid_syntax(name):
    """The fuzzer itself: every mutation changes something and, except raw line deletion, keeps the
    input compilable (otherwise the fuzz would test only the syntax-error path)."""
    applied = broken = 0
    for i, (path, source) in enumerate(CORPUS[:25]):
        try:
            out = fuzz.MUTATIONS[name](random.Random(i), source.decode())
        except fuzz.Skip:
            continue
        applied += 1
        assert out != source.decode() or name == "reorder", (name, path)
        broken += fuzz._compiles(out.encode()) is not None
    assert applied >= 5, f"{name} applied to only {applied} corpus files"
    if name != "delete_lines":
        assert broken == 0, f"{name} broke the syntax of {broken} inputs"


def test_input_without_backward_is_returned_unchanged():
    """Deleting the training step from every training fixture leaves nothing to migrate."""
    seen = 0
    for path, source in CORPUS[:30]:
        lines = source.splitlines(keepends=True)
        kept = b"".join(l for l in lines if b".backward(" not in l)
        if kept == source or fuzz._compiles(kept) is not None:
            continue
        seen += 1
        for backend in BACKENDS:
            assert migrate_source(kept, Options(backend=backend)).output == kept, (path, backend)
    assert seen >= 10


def test_cli_on_a_sample_of_mutated_inputs(tmp_path):
    """The real CLI over a directory of mutated inputs: exit 0/1/2/3 (never 123), no traceback, and
    every file it rewrote equals migrate_source's output."""
    fuzz._init(str(REPO))
    cases = []
    for i in range(24):
        _, data, _ = fuzz.make_case(7, i)
        cases.append((f"case{i}", data))
    for backend in BACKENDS:
        problems = fuzz.cli_check(cases, backend, str(tmp_path))
        assert not problems, problems


def test_docstring_and_future_import_on_one_line():
    source = (
        b'"""doc."""; from __future__ import annotations; import torch\n'
        b"from torch.utils.data import DataLoader\n"
        b"model = torch.nn.Linear(2, 1)\n"
        b"opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        b"loader = DataLoader(torch.randn(8, 2), batch_size=2)\n"
        b"for x in loader:\n"
        b"    opt.zero_grad()\n"
        b"    model(x).sum().backward()\n"
        b"    opt.step()\n"
    )
    for backend in BACKENDS:
        try:
            out = migrate_source(source, Options(backend=backend)).output
        except InputError:
            raise AssertionError("valid input rejected")
        compile(out, "<out>", "exec", dont_inherit=True)
        assert out.startswith(b'"""doc."""'), "the docstring must stay the module docstring"


@pytest.mark.parametrize("first", ['device = torch.device("cpu")', "from torch.utils.data import DataLoader"])
def test_model_assignment_sharing_a_line(first):
    source = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        f"{first}; model = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(torch.randn(8, 2), batch_size=2)\n"
        "for x in loader:\n"
        "    opt.zero_grad()\n"
        "    model(x).sum().backward()\n"
        "    opt.step()\n"
    ).encode()
    out = migrate_source(source, Options(backend="ddp")).output
    line = next(l for l in out.decode().splitlines() if l.startswith(first + ";"))
    assert line.startswith(first + "; model = runtime.DDP("), line
