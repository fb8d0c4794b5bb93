"""Where each node of a module starts and ends: what libcst's ``PositionProvider`` computes, at a
fraction of its cost.

The provider renders the module once with a code-generation state that tracks line and column and
records a ``CodeRange`` per node. Most of its cost is bookkeeping, not rendering: two ``CodePosition``
objects and a ``CodeRange`` per node, a generator-based context manager per
``record_syntactic_position``, a regular-expression split per token. ``ranges(module)`` renders the
same way with a state that keeps plain tuples, a stack instead of generators and a newline test
before any split, and builds a ``CodeRange`` only for the nodes asked about. The ranges are the
provider's own rules (syntactic positions win over the node's whole extent); tests/test_walk.py
checks them equal on every fixture.
"""

from __future__ import annotations

import re
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

import libcst as cst
try:
    from libcst._nodes.internal import CodegenState  # the hooks every node's _codegen calls
except ImportError:  # pragma: no cover - another libcst: ranges() fails, anatomy.positions falls back
    CodegenState = object  # type: ignore[misc,assignment]
from libcst._position import CodePosition, CodeRange

_NEWLINE = re.compile(r"\r\n?|\n")  # libcst's own line-break rule for positions

Span = Tuple[cst.CSTNode, int, int, int, int]  # node, start line, start column, end line, end column


class _State(CodegenState):
    __slots__ = ("line", "column", "_starts", "_syntactic", "spans")

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.line = 1  # one-based
        self.column = 0  # zero-based
        self._starts: List[Tuple[int, int]] = []
        self._syntactic: List[tuple] = []
        self.spans: Dict[int, Span] = {}  # by id(node): the module keeps every node alive

    def _advance(self, value: str) -> None:
        if "\n" not in value and "\r" not in value:
            self.column += len(value)
        else:
            parts = _NEWLINE.split(value)
            self.line += len(parts) - 1
            self.column = len(parts[-1])

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self._advance(value)

    def add_indent_tokens(self) -> None:
        self.tokens.extend(self.indent_tokens)
        for token in self.indent_tokens:
            self._advance(token)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        line, column = self._starts.pop()
        if id(node) not in self.spans:  # a syntactic position recorded inside stays
            self.spans[id(node)] = (node, line, column, self.line, self.column)

    # ``with state.record_syntactic_position(node, start_node=..., end_node=...):`` the state is its
    # own context manager; a stack keeps nested uses apart
    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: Optional[cst.CSTNode] = None,
                                  end_node: Optional[cst.CSTNode] = None) -> "_State":
        self._syntactic.append((node, start_node, end_node, self.line, self.column))
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> bool:
        node, start_node, end_node, line, column = self._syntactic.pop()
        end_line, end_column = self.line, self.column
        if start_node is not None:
            _, line, column, _, _ = self.spans[id(start_node)]
        if end_node is not None:
            _, _, _, end_line, end_column = self.spans[id(end_node)]
        self.spans[id(node)] = (node, line, column, end_line, end_column)
        return False


class Ranges(Mapping):
    """node -> ``CodeRange``, as ``MetadataWrapper.resolve(PositionProvider)`` maps them."""

    def __init__(self, spans: Dict[int, Span]) -> None:
        self._spans = spans

    def start(self, node: cst.CSTNode) -> Optional[Tuple[int, int]]:
        """(line, zero-based column) where `node` starts, without building a CodeRange."""
        span = self._spans.get(id(node))
        return None if span is None or span[0] is not node else (span[1], span[2])

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        span = self._spans.get(id(node))
        if span is None or span[0] is not node:
            raise KeyError(node)
        return CodeRange(CodePosition(span[1], span[2]), CodePosition(span[3], span[4]))

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return (span[0] for span in self._spans.values())

    def __len__(self) -> int:
        return len(self._spans)


def ranges(module: cst.Module) -> Ranges:
    state = _State(module)
    module._codegen(state)
    return Ranges(state.spans)
