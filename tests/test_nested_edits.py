"""Edits nested inside a node another edit rewrites: they survive, or the engine fails loudly.

A rule reports what it edited; the engine applies every edit in one pass. When an outer edit
rebuilt its node from the original text, an inner one (DST201's sampler for a DataLoader built as an
argument of a call DST302/DST911 hoist out of a print) vanished from the output while the report
still said "now shards its dataset". ``EditSet.hoist`` moves the rewritten value; any other
replacement that drops a rewrite made below it raises ``LostEdit`` (an internal error, exit 123).
"""

from __future__ import annotations

import libcst as cst
import pytest

from distify.edits import ApplyEdits, EditSet, LostEdit
from distify.engine import migrate_source
from distify.rules.base import Options
from distify.syntax import all_nodes

SOURCE = "for epoch in range(3):\n    print(epoch, train(DataLoader(ds, shuffle=True), model))\n"


def _tree():
    module = cst.parse_module(SOURCE)
    loop = module.body[0]
    stmt = loop.body.body[0]
    printed = stmt.body[0].value
    train_call = printed.args[1].value
    loader = train_call.args[0].value
    return module, stmt, train_call, loader


def _sampler(edits: EditSet, loader: cst.Call) -> None:
    edits.replace(loader, lambda n: n.with_changes(args=[*n.args[:-1], n.args[-1].with_changes(
        keyword=cst.Name("sampler"), value=cst.parse_expression("loader_sampler"))]))


def test_a_hoisted_value_keeps_the_edits_made_inside_it():
    module, stmt, train_call, loader = _tree()
    edits = EditSet()
    _sampler(edits, loader)
    edits.hoist(train_call, stmt, "train_result")
    out = module.visit(ApplyEdits(edits)).code
    assert out == (
        "for epoch in range(3):\n"
        "    train_result = train(DataLoader(ds, sampler=loader_sampler), model)\n"
        "    print(epoch, train_result)\n"
    )


def test_a_value_hoisted_with_no_edit_inside_is_its_own_text():
    module, stmt, train_call, _ = _tree()
    edits = EditSet()
    edits.hoist(train_call, stmt, "value")
    out = module.visit(ApplyEdits(edits)).code
    assert "    value = train(DataLoader(ds, shuffle=True), model)\n    print(epoch, value)\n" in out


def test_an_outer_edit_that_rebuilds_its_node_from_the_original_text_fails_loudly():
    module, stmt, train_call, loader = _tree()
    edits = EditSet()
    _sampler(edits, loader)
    text = module.code_for_node(train_call)  # the way hoisting once copied the argument
    edits.replace(train_call, lambda n: cst.parse_expression(text))
    with pytest.raises(LostEdit, match="DataLoader"):
        module.visit(ApplyEdits(edits))


def test_control_the_same_outer_edit_keeping_its_argument_passes():
    # control of the check: an outer edit that builds on the node it is handed keeps the inner one
    module, stmt, train_call, loader = _tree()
    edits = EditSet()
    _sampler(edits, loader)
    edits.call_around(train_call, "float")
    out = module.visit(ApplyEdits(edits)).code
    assert "print(epoch, float(train(DataLoader(ds, sampler=loader_sampler), model)))" in out


def test_an_inner_edit_under_a_guarded_and_replaced_statement_is_checked_through_the_block():
    # statements are re-laid by their block (guards strip their leading lines): what was made inside
    # one is still found from a replacement further up
    module = cst.parse_module("def f():\n    for e in r:\n        print(g(DataLoader(ds)))\n")
    fn = module.body[0]
    loop = fn.body.body[0]
    stmt = loop.body.body[0]
    loader = stmt.body[0].value.args[0].value.args[0].value
    edits = EditSet()
    edits.replace(loader, lambda n: n.with_changes(func=cst.Name("Loader")))
    edits.guard(stmt, "main()")
    edits.replace(loop, lambda n: n.with_changes(leading_lines=[cst.EmptyLine()]))
    out = module.visit(ApplyEdits(edits)).code
    assert "        if main():\n            print(g(Loader(ds)))\n" in out
    edits.replace(fn, lambda n, t=module.code_for_node(fn): cst.parse_statement(t))
    with pytest.raises(LostEdit):
        module.visit(ApplyEdits(edits))


def test_the_engine_reports_a_lost_edit_as_an_internal_error(monkeypatch):
    # a rule whose replacement drops what another rule made below it: the file fails (exit 123), it is
    # never written with a report of an edit that is not in it
    from distify.rules import base

    real = base.Context.finish

    def finish(self):
        for node in self.edits.replacements:
            if isinstance(node, cst.Call) and self.anatomy.qualname(node.func) == "torch.utils.data.DataLoader":
                outer = next(c.call for c in self.anatomy.calls if c.call is not node and any(
                    n is node for n in all_nodes(c.call)) and isinstance(c.stmt, cst.SimpleStatementLine))
                self.edits.replace(outer, lambda n, t=self.code(outer): cst.parse_expression(t))
                break
        return real(self)

    monkeypatch.setattr(base.Context, "finish", finish)
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\n\n"
        "def train(loader, model, opt):\n"
        "    for x in loader:\n"
        "        opt.zero_grad()\n"
        "        model(x).sum().backward()\n"
        "        opt.step()\n\n"
        "def main():\n"
        "    model = torch.nn.Linear(2, 2)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    ds = list(range(8))\n"
        "    for epoch in range(2):\n"
        "        train(DataLoader(ds, batch_size=2, shuffle=True), model, opt)\n"
    )
    monkeypatch.setattr(base.Context, "finish", real)
    plain = migrate_source(source.encode(), Options(backend="ddp"))
    assert b"sampler=loader_sampler" in plain.output  # control: DST201 edits the loader in place
    monkeypatch.setattr(base.Context, "finish", finish)
    with pytest.raises(LostEdit):
        migrate_source(source.encode(), Options(backend="ddp"))
