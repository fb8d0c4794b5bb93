"""DST402 on gradient accumulation written as an inner loop of micro-steps (distify.micro_steps).

The sync switch is added only where the loop's own code shows that its last iteration is the one that
reduces: a loop over range(), no step or zero_grad inside, the step right after it, a backward on
every iteration, nothing that leaves an iteration early, a count the loop cannot change. Every shape
that breaks one of these keeps reducing on every micro-step (correct, slower), with an info line; its
control is the base shape, which gets the switch. Renaming the loop variable and the count changes
nothing but the names (the decision is read from facts, not spellings).
"""
from __future__ import annotations

import re

import pytest

from distify.engine import migrate_source
from distify.rules.base import Options

BASE = '''\
import torch
import torch.nn as nn


def get_batch():
    x = torch.randn(8, 4)
    return x, x.sum(1, keepdim=True)


model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
accum = 4
for it in range(10):
    for micro_step in range(accum):
        x, y = get_batch()
        loss = nn.functional.mse_loss(model(x), y) / accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
torch.save(model.state_dict(), "model.pt")
'''

BODY = '''\
        x, y = get_batch()
        loss = nn.functional.mse_loss(model(x), y) / accum
        loss.backward()
'''


def _migrate(source: str, backend: str = "ddp"):
    result = migrate_source(source.encode(), Options(backend=backend))
    infos = [f.message for f in result.findings if f.code == "DST402"]
    return result.output.decode(), infos


def _switched(out: str, backend: str) -> bool:
    return ("no_sync()" in out) if backend == "ddp" else ("set_requires_gradient_sync(" in out)


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
def test_the_base_shape_reduces_on_the_last_micro_step_only(backend):
    out, infos = _migrate(BASE, backend)
    if backend == "ddp":
        assert "        with model.no_sync() if micro_step != accum - 1 else contextlib.nullcontext():\n" in out
        assert "            loss.backward()\n" in out
    else:
        assert "        model.set_requires_gradient_sync(micro_step == accum - 1)\n" in out
    assert any("once per optimizer step" in m for m in infos), infos


# each: (id, what replaces the inner loop's header+body or the step, the info's words)
UNTOLD = [
    ("break", lambda s: s.replace("        loss.backward()\n", "        loss.backward()\n        if loss.item() > 9:\n            break\n"),
     "end the loop early"),
    ("continue_before_backward", lambda s: s.replace("        loss = nn", "        if not torch.isfinite(x).all():\n            continue\n        loss = nn"),
     "skip its backward"),
    ("conditional_backward", lambda s: s.replace("        loss.backward()\n", "        if loss.item() > 0:\n            loss.backward()\n"),
     "under a condition"),
    ("backward_in_try", lambda s: s.replace("        loss.backward()\n", "        try:\n            loss.backward()\n        except RuntimeError:\n            pass\n"),
     "under a condition"),
    ("count_changes", lambda s: s.replace("        loss.backward()\n", "        loss.backward()\n        accum = accum + 0\n"),
     "count or its variable may change"),
    ("variable_rebound", lambda s: s.replace("        loss.backward()\n", "        loss.backward()\n        micro_step = 0\n"),
     "count or its variable may change"),
    ("count_with_side_effect", lambda s: s.replace("range(accum)", "range(next(iter([accum])))"),
     "count or its variable may change"),
    ("not_a_range", lambda s: s.replace("for micro_step in range(accum):", "for micro_step in [0, 1, 2, 3]:"),
     "cannot be told"),
    ("range_with_step", lambda s: s.replace("range(accum)", "range(0, accum, 1)"),
     "cannot be told"),
    ("forward_after_backward", lambda s: s.replace("        loss.backward()\n", "        loss.backward()\n        extra = model(x)\n"),
     "after its backward"),
    ("reads_gradients", lambda s: s.replace("        loss.backward()\n", "        loss.backward()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"),
     "reads the gradients"),
]


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
@pytest.mark.parametrize("case,change,words", UNTOLD, ids=[u[0] for u in UNTOLD])
def test_a_last_iteration_it_cannot_trust_keeps_every_reduction(case, change, words, backend):
    source = change(BASE)
    assert source != BASE, "the change did not apply"
    out, infos = _migrate(source, backend)
    assert not _switched(out, backend), out
    assert any("reduced on every micro-step" in m and words in m for m in infos), infos


NOT_MICRO_STEPS = [
    # the loop steps itself: the ordinary batch loop, not micro-steps (DST402's other shape's business)
    ("step_inside", lambda s: s.replace(BODY, BODY + "        optimizer.step()\n").replace("    optimizer.step()\n    optimizer.zero_grad()\n", "")),
    # something clears the gradients inside the loop: its iterations do not all feed one step
    ("zero_grad_inside", lambda s: s.replace(BODY, BODY + "        optimizer.zero_grad()\n")),
    # the step after the loop may be skipped: the next iteration's micro-steps add to unreduced gradients
    ("conditional_step", lambda s: s.replace("    optimizer.step()\n", "    if it % 2 == 0:\n        optimizer.step()\n")),
    # another backward between the loop and the step
    ("backward_between", lambda s: s.replace("    optimizer.step()\n", "    model(get_batch()[0]).sum().backward()\n    optimizer.step()\n")),
    # the loop already controls the sync (nanoGPT's own flag)
    ("own_flag", lambda s: s.replace("        x, y = get_batch()\n", "        model.require_backward_grad_sync = micro_step == accum - 1\n        x, y = get_batch()\n", 1)),
]


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
@pytest.mark.parametrize("case,change", NOT_MICRO_STEPS, ids=[n[0] for n in NOT_MICRO_STEPS])
def test_loops_that_are_not_micro_steps_are_left_alone(case, change, backend):
    source = change(BASE)
    assert source != BASE, "the change did not apply"
    out, infos = _migrate(source, backend)
    assert "micro_step != accum - 1" not in out and "micro_step == accum - 1)" not in out, out


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
def test_spellings_of_the_count(backend):
    """range(a, b), an integer literal, an attribute, arithmetic: the last iteration is stop - 1."""
    for header, last in [
        ("range(1, accum + 1)", "micro_step != accum + 1 - 1" if backend == "ddp" else "micro_step == accum + 1 - 1"),
        ("range(4)", "micro_step != 3" if backend == "ddp" else "micro_step == 3"),
        ("range(min(accum, 8))", None),
        ("range(accum << 0)", "micro_step != (accum << 0) - 1" if backend == "ddp" else "micro_step == (accum << 0) - 1"),
    ]:
        out, _ = _migrate(BASE.replace("range(accum)", header), backend)
        assert _switched(out, backend), header
        if last is not None:
            assert last in out, (header, out)


RENAMES = [("micro_step", "k"), ("accum", "n_chunks"), ("it", "step")]


@pytest.mark.parametrize("backend", ["ddp", "fsdp", "horovod"])
def test_renaming_the_loop_variable_and_the_count_changes_no_decision(backend):
    def renamed(text: str) -> str:
        for old, new in RENAMES:
            text = re.sub(rf"\b{old}\b", new, text)
        return text

    out, infos = _migrate(BASE, backend)
    out2, infos2 = _migrate(renamed(BASE), backend)
    assert out2 == renamed(out)
    assert [renamed(m) for m in infos] == infos2
    # and a name that says "accumulation" where there is none changes nothing either
    plain = BASE.replace("    for micro_step in range(accum):\n" + BODY, BODY.replace("        ", "    ")).replace("/ accum", "")
    named = re.sub(r"\bit\b", "micro_step", plain).replace("accum = 4", "gradient_accumulation_steps = 4")
    assert "for micro_step in range(10):" in named and "gradient_accumulation_steps = 4" in named
    out3, _ = _migrate(named, backend)
    assert "no_sync" not in out3 and "set_requires_gradient_sync" not in out3
