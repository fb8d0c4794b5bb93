"""The rewritten module's bytes without generating again the code of the statements no edit touched.

The rewrite keeps every unedited subtree as the same object (``edits.ApplyEdits`` rebuilds only the
paths to its edits), and a statement of the module's body renders the same text wherever it stands
in a module of the same indentation and line break: its own text, which the source already holds.
``render`` copies that text for each statement of the new body that is a statement of the original
body (``positions.Locator.top_spans`` says where each lies in the source) and generates the code of
the others, the header and the footer as libcst's ``Module.code`` would; tests/test_render.py checks
the two equal on every fixture.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst


def render(new: cst.Module, original: cst.Module, text: str, spans: Optional[List[Tuple[int, int]]]) -> bytes:
    """``new.bytes``, `original` being the module parsed from `text` with `spans` the places of its
    body's statements in `text` (None: not known, the whole module is rendered)."""
    try:
        from libcst._nodes.internal import CodegenState
    except ImportError:  # pragma: no cover - another libcst: its public render
        return new.bytes
    if (spans is None or len(spans) != len(original.body) or not new.has_trailing_newline
            or (new.default_indent, new.default_newline, new.encoding)
            != (original.default_indent, original.default_newline, original.encoding)):
        return new.bytes
    kept = {id(stmt): (stmt, span) for stmt, span in zip(original.body, spans)}
    state = CodegenState(default_indent=new.default_indent, default_newline=new.default_newline)
    tokens = state.tokens
    for line in new.header:
        line._codegen(state)
    for stmt in new.body:
        hit = kept.get(id(stmt))
        if hit is not None and hit[0] is stmt:
            tokens.append(text[hit[1][0]:hit[1][1]])
        else:
            stmt._codegen(state)
    for line in new.footer:
        line._codegen(state)
    if not tokens:
        tokens.append(state.default_newline)
    return "".join(tokens).encode(new.encoding)
