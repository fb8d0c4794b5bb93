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


# where one node starts, without rendering the module ---------------------------------------------
#
# A finding needs the start of a dozen nodes of a file; ``ranges`` renders all of it for them. The
# statement a node lies in starts on the line CPython's own parser gives that statement (``ast``, a
# small fraction of a libcst render), at the indentation its line opens with; rendering that
# statement alone, with that indentation as its indent token and until the node's start is known,
# gives the node's start relative to the statement's. The result is what ``ranges`` gives
# (tests/test_walk.py compares them on every fixture); where the two trees cannot be paired
# statement by statement, ``Locator.start`` answers None and the caller renders the module.

class _Found(Exception):
    pass


class _Probe(_State):
    """Renders one statement (`root`) until the starts of `root` and of `target` are known."""

    __slots__ = ("root", "target", "root_start", "target_start", "_pending")

    def __init__(self, module: cst.Module, root: cst.CSTNode, target: cst.CSTNode, indent: str) -> None:
        super().__init__(module)
        self.indent_tokens = [indent] if indent else []
        self.root, self.target = root, target
        self.root_start: Optional[Tuple[int, int]] = None
        self.target_start: Optional[Tuple[int, int]] = None
        self._pending: Optional[Tuple[int, int]] = None

    def _check(self) -> None:
        if self.root_start is not None and self.target_start is not None:
            raise _Found

    def before_codegen(self, node: cst.CSTNode) -> None:
        if node is self.target:
            self._pending = (self.line, self.column)

    def after_codegen(self, node: cst.CSTNode) -> None:
        if node is self.target and self.target_start is None:  # no syntactic position of its own
            self.target_start = self._pending
            self._check()

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: Optional[cst.CSTNode] = None,
                                  end_node: Optional[cst.CSTNode] = None) -> "_Probe":
        if start_node is not None and (node is self.root or node is self.target):
            raise LookupError  # a start taken from another node (an IndentedBlock): not handled here
        # the first (outermost) record of a node is the one its range keeps
        if node is self.root and self.root_start is None:
            self.root_start = (self.line, self.column)
        if node is self.target and self.target_start is None:
            self.target_start = (self.line, self.column)
        self._check()
        return self

    def __exit__(self, *exc) -> bool:
        return False


_COMPOUND = {
    "FunctionDef": ("FunctionDef", "AsyncFunctionDef"), "ClassDef": ("ClassDef",), "If": ("If",),
    "For": ("For", "AsyncFor"), "While": ("While",), "Try": ("Try",), "TryStar": ("TryStar",),
    "With": ("With", "AsyncWith"), "Match": ("Match",),
}


class Locator:
    """Starts of the nodes of `module` (parsed from `text`) found statement by statement.
    `owner(node)`: the innermost statement (a ``SimpleStatementLine`` or compound statement) that
    holds `node`, or None when it is not known."""

    def __init__(self, module: cst.Module, text: str, owner) -> None:
        self.module = module
        self.text = text
        self.owner = owner
        self._lines: Optional[Dict[int, int]] = None  # id(statement) -> the line it starts on
        self._seen: Dict[int, cst.CSTNode] = {}
        self._twice: set = set()
        self._elifs: set = set()
        self._tree = None  # CPython's tree of `text`, once the statements' lines were asked for

    def start(self, node: cst.CSTNode) -> Optional[Tuple[int, int]]:
        """(line, zero-based column) where `node` starts, or None: not found this way."""
        stmt = self.owner(node)
        if stmt is None:
            return None
        if self._lines is None:
            self._lines = self._statement_lines()
        line = self._lines.get(id(stmt))
        if line is None or id(stmt) in self._twice:
            return None
        source_line = self._source_lines[line - 1]
        indent = source_line[: len(source_line) - len(source_line.lstrip(" \t\f"))]
        probe = _Probe(self.module, stmt, node, indent)
        try:
            if id(stmt) in self._elifs:  # rendered by its parent as `elif`, not `if`
                probe.before_codegen(stmt)
                stmt._codegen_impl(probe, is_elif=True)
                probe.after_codegen(stmt)
            else:
                stmt._codegen(probe)
        except _Found:
            pass
        except Exception:  # noqa: BLE001 - a libcst-internal mismatch: the caller renders the module
            return None
        if probe.root_start is None or probe.target_start is None or probe.root_start[1] != len(indent):
            return None
        return (line + probe.target_start[0] - probe.root_start[0], probe.target_start[1])

    def _statement_lines(self) -> Dict[int, int]:
        import ast

        self._source_lines = _NEWLINE.split(self.text)
        out: Dict[int, int] = {}
        try:
            tree = compile(self.text, "<positions>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
            self._pair(self.module.body, tree.body, out)
        except (SyntaxError, ValueError, LookupError, RecursionError):
            return {}
        self._tree = tree
        return out

    def top_spans(self) -> Optional[List[Tuple[int, int]]]:
        """Where each statement of the module's body lies in `text`: (start, end) offsets of exactly
        the text libcst renders for it (its leading comment and blank lines included, the lines up to
        the next statement's), or None when not known without more work: the statements' lines were
        never asked for (no CPython tree yet), or the text has a shape this does not handle (a
        carriage return, a byte-order mark, no final newline), or a check below fails.

        A statement's text starts `len(leading_lines)` lines (and its first decorator's) above the
        line its first token is on (CPython's line: the first decorator's, else the statement's), and
        runs to where the next one starts; the module's header and footer are as many lines as they
        hold. Checked on the way: each such first line opens at column 0 (with `@` when decorated),
        each line counted as a leading line is blank or a comment, the header's and footer's counts
        meet the first and last statement."""
        tree = self._tree
        text = self.text
        module = self.module
        if tree is None or not module.has_trailing_newline:
            return None
        if "\r" in text or text.startswith("\ufeff") or not text.endswith("\n"):
            return None
        lines = self._source_lines  # text.split at line breaks: the last item is the empty rest
        nodes = tree.body
        starts: List[int] = []
        i = 0
        for stmt in module.body:
            if i >= len(nodes):
                return None
            node = nodes[i]
            first, lead = node.lineno, len(stmt.leading_lines)
            if isinstance(stmt, cst.SimpleStatementLine):
                i += len(stmt.body)
            else:
                i += 1
                decorators = getattr(stmt, "decorators", ())
                if len(decorators) != len(getattr(node, "decorator_list", ())):
                    return None
                if decorators:
                    first = node.decorator_list[0].lineno
                    lead += len(decorators[0].leading_lines)
                    if not lines[first - 1].startswith("@"):
                        return None
            opening = lines[first - 1]
            if not opening or opening[0] in " \t\f":
                return None
            start = first - lead
            if start < 1 or (starts and start <= starts[-1]):
                return None
            for k in range(start, first):
                rest = lines[k - 1].lstrip(" \t\f")
                if rest and not rest.startswith("#"):
                    return None
            starts.append(start)
        last = len(lines) - 1 - len(module.footer)  # the last line of the body
        if i != len(nodes) or not starts or starts[0] != len(module.header) + 1 or starts[-1] > last:
            return None
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line) + 1)
        ends = starts[1:] + [last + 1]
        return [(offsets[a - 1], offsets[b - 1]) for a, b in zip(starts, ends)]

    def _pair(self, stmts, nodes, out: Dict[int, int]) -> None:
        """Pair libcst statements with CPython's (LookupError where the two disagree)."""
        i = 0
        for stmt in stmts:
            if id(stmt) in self._seen:  # one node object in two places: its line is ambiguous
                self._twice.add(id(stmt))
            self._seen[id(stmt)] = stmt
            if isinstance(stmt, cst.SimpleStatementLine):
                if i + len(stmt.body) > len(nodes):
                    raise LookupError
                out[id(stmt)] = nodes[i].lineno
                i += len(stmt.body)
                continue
            if i >= len(nodes):
                raise LookupError
            node = nodes[i]
            i += 1
            if type(node).__name__ not in _COMPOUND.get(type(stmt).__name__, ()):
                raise LookupError
            out[id(stmt)] = node.lineno
            self._blocks(stmt, node, out)
        if i != len(nodes):
            raise LookupError

    def _blocks(self, stmt, node, out: Dict[int, int]) -> None:
        if isinstance(stmt, cst.Match):
            if len(stmt.cases) != len(node.cases):
                raise LookupError
            for case, ncase in zip(stmt.cases, node.cases):
                self._body(case.body, ncase.body, out)
            return
        self._body(stmt.body, node.body, out)
        if isinstance(stmt, (cst.Try, getattr(cst, "TryStar", cst.Try))):
            if len(stmt.handlers) != len(node.handlers):
                raise LookupError
            for handler, nhandler in zip(stmt.handlers, node.handlers):
                self._body(handler.body, nhandler.body, out)
            if stmt.finalbody is not None:
                self._body(stmt.finalbody.body, node.finalbody, out)
        orelse = getattr(stmt, "orelse", None)
        if isinstance(orelse, cst.If):  # elif
            self._elifs.add(id(orelse))
            self._pair([orelse], node.orelse, out)
        elif orelse is not None:
            self._body(orelse.body, node.orelse, out)

    def _body(self, block, nodes, out: Dict[int, int]) -> None:
        if isinstance(block, cst.IndentedBlock):
            self._pair(block.body, nodes, out)
        # a suite on the header's line (`if x: a; b`) holds no statement lines of its own


def statement_of(statements, calls, attributes, module: Optional[cst.Module] = None):
    """`owner` for a ``Locator`` from the analysis' records: a statement is its own; a call or an
    attribute is in the statement the analysis saw it in (None when seen in two places). Any other
    node of `module` (an argument, a small statement, a name) is looked up in a map of every node to
    the innermost statement around it, built by one read-only walk the first time such a node is
    asked about: a walk costs a fraction of the module render the caller would otherwise need."""
    found: Dict[int, Optional[cst.CSTNode]] = {}
    for node, stmt in [(c.call, c.stmt) for c in calls] + [(a[0], a[3]) for a in attributes]:
        found[id(node)] = stmt if id(node) not in found or found[id(node)] is stmt else None
    around: List[Optional[Dict[int, Optional[cst.CSTNode]]]] = [None]

    def owner(node: cst.CSTNode) -> Optional[cst.CSTNode]:
        if node in statements:
            return node
        if id(node) in found or module is None:
            return found.get(id(node))
        if around[0] is None:
            around[0] = _innermost_statements(module)
        return around[0].get(id(node))

    return owner


_IS_STATEMENT: Dict[type, bool] = {}


def _innermost_statements(module: cst.Module) -> Dict[int, Optional[cst.CSTNode]]:
    """id(node) -> the innermost ``SimpleStatementLine`` or compound statement holding it (a
    statement maps to itself; the module's own trivia and nodes outside any statement are absent),
    None for a node object found at two places (its position is the module render's answer)."""
    from distify.walk import children

    out: Dict[int, Optional[cst.CSTNode]] = {}
    is_statement = _IS_STATEMENT
    stack: List[Tuple[cst.CSTNode, Optional[cst.CSTNode]]] = [(c, None) for c in reversed(children(module))]
    while stack:
        node, stmt = stack.pop()
        t = type(node)
        flag = is_statement.get(t)
        if flag is None:
            flag = is_statement[t] = issubclass(t, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
        if flag:
            stmt = node
        if stmt is not None:
            key = id(node)
            out[key] = stmt if key not in out else None
        below = children(node)
        below.reverse()
        stack += [(c, stmt) for c in below]
    return out
