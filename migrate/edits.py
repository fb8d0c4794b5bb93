"""Edits that rules request, and the one transformer that applies all of them.

Rules never touch the tree. They record edits against nodes of the *original* tree (identity, not
equality), and the engine applies everything in a single pass:

* ``replace(node, fn)`` – ``fn(updated_node) -> new node``. Several replacements of one node compose
  in the order they were requested; replacements of nested nodes compose naturally because children
  are rewritten before their parents.
* ``insert_before(stmt, [stmts])`` / ``insert_after(stmt, [stmts])`` – new statements next to a
  statement of an indented block or of the module.
* ``guard(stmt, condition)`` – put the statement under ``if <condition>:``. Consecutive statements of
  one block guarded by the same condition share a single ``if``.
* ``move_after(stmt, anchor)`` – move a statement below a later one of the same block.
* ``hoist(expr, stmt, name)`` – compute an expression into a name just before its statement and read
  the name in its place; the expression moves as the other edits rewrite it.
* ``add_import(...)`` – queued, de-duplicated and placed once after the module's import block.

An edit nested inside a node that another edit replaces survives only if that replacement keeps
the rewritten node it is handed (or the nested rewrite in it). One that rebuilds the node from
scratch (from the original text, a fresh name) would drop the nested edit while its rule reports
it: ``ApplyEdits`` checks, at every replaced node that holds rewritten nodes below it, that each of
them is still in the result, and raises ``LostEdit`` (an internal error, nothing written) if not.
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple, Union

import libcst as cst

from distify.walk import children, walk
from distify.values import Record

Stmt = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]
NodeFn = Callable[[cst.CSTNode], cst.CSTNode]


class LostEdit(RuntimeError):
    """An edit's result is missing from the output: a replacement around it rebuilt the node
    without it. distify's bug; the file is reported as an internal error, never written."""


class EditSet(Record):
    """The edits the rules recorded against the input tree, applied in one pass (``ApplyEdits``)."""

    replacements: Dict[cst.CSTNode, List[NodeFn]]
    before: Dict[cst.CSTNode, List[Stmt]]
    after: Dict[cst.CSTNode, List[Stmt]]
    guards: Dict[cst.CSTNode, str]
    removed: Dict[cst.CSTNode, bool]
    # first statement -> (last statement, fn(updated statements) -> compound statement)
    wraps: Dict[cst.CSTNode, Tuple[cst.CSTNode, Callable[[List[cst.CSTNode]], cst.CSTNode]]]
    # import lines in the order first requested, e.g. "import torch.distributed as dist"
    imports: List[str]
    # statement -> a later statement of the same block it moves below (after that one's insertions)
    moves: Dict[cst.CSTNode, cst.CSTNode]
    # expression -> (name, the `name = expr` statement inserted for it): see `hoist`
    hoisted: Dict[cst.CSTNode, Tuple[str, cst.SimpleStatementLine]]

    def __init__(self) -> None:
        self.replacements = {}
        self.before = {}
        self.after = {}
        self.guards = {}
        self.removed = {}
        self.wraps = {}
        self.imports = []
        self.moves = {}
        self.hoisted = {}

    def replace(self, node: cst.CSTNode, fn: NodeFn) -> None:
        self.replacements.setdefault(node, []).append(fn)

    def call_around(self, node: cst.BaseExpression, func: str) -> None:
        """Replace the expression `node` by `func(node)` (`runtime.ShareSampler(sampler)`), the
        expression as the other edits rewrite it."""
        call = cst.parse_expression(f"{func}(_)")
        self.replace(node, lambda n, call=call: call.with_changes(args=[call.args[0].with_changes(value=n)]))

    def insert_before(self, stmt: cst.CSTNode, stmts: Sequence[Stmt]) -> None:
        self.before.setdefault(stmt, []).extend(stmts)

    def insert_after(self, stmt: cst.CSTNode, stmts: Sequence[Stmt], first: bool = False) -> None:
        """`stmts` below `stmt`, after what earlier edits inserted there (``first``: above it)."""
        below = self.after.setdefault(stmt, [])
        below[0 if first else len(below):0 if first else len(below)] = stmts

    def guard(self, stmt: cst.CSTNode, condition: str) -> None:
        self.guards.setdefault(stmt, condition)

    def wrap(self, first: cst.CSTNode, last: cst.CSTNode, make: Callable[[List[cst.CSTNode]], cst.CSTNode]) -> None:
        """Replace the statements first..last of one block by `make(those statements)`."""
        self.wraps[first] = (last, make)

    def remove(self, stmt: cst.CSTNode) -> None:
        """Drop a statement; comments above it stay (they move to the next statement)."""
        self.removed[stmt] = True

    def move_after(self, stmt: cst.CSTNode, anchor: cst.CSTNode) -> None:
        """Move `stmt` below `anchor`, a later statement of the same block (and below what is
        inserted after it). The statement moves as rewritten by the other edits, comments included."""
        self.moves[stmt] = anchor

    def hoist(self, expr: cst.BaseExpression, stmt: cst.CSTNode, name: str) -> None:
        """`name = <expr>` just before `stmt`, and `name` read where `expr` was. The assignment holds
        `expr` as the other edits rewrite it (a sampler DST201 gives a DataLoader built inside it),
        not its original text; applied after the expression's own replacements."""
        line = cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(target=cst.Name(name))], value=expr)])
        self.hoisted[expr] = (name, line)
        self.insert_before(stmt, [line])

    def add_import(self, line: str) -> None:
        if line not in self.imports:
            self.imports.append(line)

    def __bool__(self) -> bool:
        return bool(
            self.replacements or self.before or self.after or self.guards or self.imports or self.removed or self.wraps
            or self.moves or self.hoisted
        )


def parse_stmts(code: str, newline: str = "\n", shared: bool = False) -> List[Stmt]:
    """Parse statement source (written with '\\n') into statements for insertion. ``shared``: the
    nodes may be the ones an earlier call with the same code returned (libcst nodes are immutable;
    the caller must not put one code's nodes twice into a tree, where facts keyed by node would
    confuse the two places)."""
    return list(_parsed(code) if shared else _parse_stmts(code))


def _parse_stmts(code: str) -> Tuple[Stmt, ...]:
    module = cst.parse_module(code if code.endswith("\n") else code + "\n")
    body = list(module.body)
    if module.header and body:
        # libcst puts comments that open the code into the module header: keep them on the statement
        body[0] = body[0].with_changes(leading_lines=[*module.header, *body[0].leading_lines])
    return tuple(body)


_parsed = functools.lru_cache(maxsize=1024)(_parse_stmts)  # rules insert the same lines file after file


def _apply_wraps(original, updated, edits: EditSet):
    """Fold wrapped runs of statements into one compound statement (keyed by the run's first)."""
    if not edits.wraps or not any(o in edits.wraps for o in original):
        return list(original), list(updated)
    orig_out, upd_out = [], []
    i = 0
    while i < len(original):
        o = original[i]
        if o in edits.wraps:
            last, make = edits.wraps[o]
            j = i
            while j < len(original) and original[j] is not last:
                j += 1
            if j < len(original):
                run = list(updated[i : j + 1])
                leading = getattr(run[0], "leading_lines", ())
                run[0] = run[0].with_changes(leading_lines=())
                new = make(run).with_changes(leading_lines=leading)
                orig_out.append(o)  # the run's first statement stands for the whole run
                upd_out.append(new)
                i = j + 1
                continue
        orig_out.append(o)
        upd_out.append(updated[i])
        i += 1
    return orig_out, upd_out


def _block_statements(
    original: Sequence[cst.CSTNode], updated: Sequence[cst.CSTNode], edits: EditSet, values=None
) -> Tuple[List[cst.CSTNode], bool]:
    """Rebuild one block's statement list: wraps, insertions and guard grouping. `values`: the
    rewritten expression of each hoisted assignment (see ``EditSet.hoist``), by its statement."""
    if values:
        edits = _with_values(edits, original, values)
    changed = bool(edits.wraps) and any(o in edits.wraps for o in original)
    original, updated = _apply_wraps(original, updated, edits)
    out: List[cst.CSTNode] = []
    pending_guard: Optional[str] = None
    guarded: List[cst.CSTNode] = []

    def flush() -> None:
        nonlocal pending_guard, guarded
        if pending_guard is not None and guarded:
            first = guarded[0]
            leading = getattr(first, "leading_lines", ())
            body = [_strip_leading(guarded[0])] + guarded[1:]
            out.append(
                cst.If(
                    test=cst.parse_expression(pending_guard),
                    body=cst.IndentedBlock(body=body),
                    leading_lines=leading,
                )
            )
        pending_guard, guarded = None, []

    carried: Sequence[cst.EmptyLine] = ()
    held: Dict[cst.CSTNode, List[cst.CSTNode]] = {}  # anchor -> statements moved below it
    for orig, upd in zip(original, updated):
        if orig in edits.moves:
            flush()
            changed = True
            held.setdefault(edits.moves[orig], []).append(upd)
            continue
        if orig in edits.removed:
            flush()
            changed = True
            carried = list(carried) + list(getattr(upd, "leading_lines", ()))
            # what other rules put around the statement stays (DST121's shard after a DataParallel
            # line that DST902 removes), in its place
            inserted = [*edits.before.get(orig, []), *edits.after.get(orig, [])]
            if inserted and hasattr(inserted[0], "leading_lines"):
                inserted[0] = inserted[0].with_changes(leading_lines=[*carried, *inserted[0].leading_lines])
                carried = ()
            out.extend(inserted)
            continue
        if carried and hasattr(upd, "leading_lines"):
            own = list(upd.leading_lines)
            if own:  # the statement has its own spacing: keep only the removed one's comments
                carried = [line for line in carried if line.comment is not None]
            upd = upd.with_changes(leading_lines=[*carried, *own])
            carried = ()
        before = edits.before.get(orig, [])
        after = edits.after.get(orig, [])
        cond = edits.guards.get(orig)
        if before:
            flush()
            changed = True
            # blank lines above the original statement move above the insertion; comments stay
            # with the statement they describe
            leading = list(getattr(upd, "leading_lines", ()))
            blanks = 0
            while blanks < len(leading) and leading[blanks].comment is None:
                blanks += 1
            if blanks and hasattr(before[0], "leading_lines"):
                own = list(before[0].leading_lines)  # e.g. a comment the rule put above its insertion
                before = [before[0].with_changes(leading_lines=[*leading[:blanks], *own])] + list(before[1:])
                upd = upd.with_changes(leading_lines=leading[blanks:])
            out.extend(before)
        if cond is not None:
            changed = True
            if pending_guard is not None and pending_guard != cond:
                flush()
            if pending_guard is not None and getattr(upd, "leading_lines", ()):
                # a blank line or comment separates it from the previous guarded statement:
                # keep the visual grouping by starting a new guard
                flush()
            pending_guard = cond
            guarded.append(upd)
        else:
            flush()
            out.append(upd)
        if after:
            flush()
            changed = True
            out.extend(after)
        if orig in held:
            flush()
            out.extend(held.pop(orig))
    flush()
    for stmts in held.values():  # pragma: no cover - an anchor outside the block: keep the statements
        out.extend(stmts)
    if changed and not out:
        out.append(cst.SimpleStatementLine(body=[cst.Pass()]))
    return out, changed


def _with_values(edits: EditSet, original: Sequence[cst.CSTNode], values) -> EditSet:
    """`edits` whose insertions next to the statements of `original` hold, in each hoisted
    assignment, the expression as rewritten (the statement lists of this block only)."""
    def fill(stmts):
        return [
            s.with_changes(body=[s.body[0].with_changes(value=values[s])]) if s in values else s for s in stmts
        ]

    before = {o: fill(edits.before[o]) for o in original if o in edits.before}
    after = {o: fill(edits.after[o]) for o in original if o in edits.after}
    if not before and not after:
        return edits
    from copy import copy

    out = copy(edits)
    out.before = {**edits.before, **before}
    out.after = {**edits.after, **after}
    return out


def _code(stmt: cst.CSTNode) -> str:
    return cst.Module(body=[stmt]).code.strip()


def _strip_leading(node: cst.CSTNode) -> cst.CSTNode:
    if getattr(node, "leading_lines", None):
        return node.with_changes(leading_lines=())
    return node


class Put(cst.CSTTransformer):
    """Replaces the placeholder name `_` of a parsed template by a node (an edit builder rules
    share: ``template.visit(Put(node))``)."""

    def __init__(self, node: cst.BaseExpression) -> None:
        super().__init__()
        self.node = node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name):
        return self.node if original_node.value == "_" else updated_node


class ApplyEdits(cst.CSTTransformer):
    """Applies an EditSet in one pass. Only the nodes that hold an edit or contain one are entered
    (found by a cheap read-only walk from the root first): the rest of the tree is kept as it is,
    which is what visiting it would rebuild anyway, at a fraction of the cost."""

    def __init__(self, edits: EditSet) -> None:
        super().__init__()
        self.edits = edits
        self._enter: Optional[set] = None  # nodes to descend into; None: all of them
        self._depth = 0
        # per node being visited: the (original, result) of each replacement made below it
        self._made: List[List[Tuple[cst.CSTNode, cst.CSTNode]]] = []
        self._values: Dict[cst.CSTNode, cst.CSTNode] = {}  # hoisted assignment -> its rewritten value
        self._dropped: List[cst.CSTNode] = []  # rewritten nodes a replacement around them did not keep

    def on_visit(self, node) -> bool:  # type: ignore[override]
        if self._depth == 0:  # the root of a visit
            self._enter = _holding_edits(node, self.edits)
        self._depth += 1
        self._made.append([])
        if self._enter is not None and node not in self._enter:
            return False
        return super().on_visit(node)

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        self._depth -= 1  # libcst calls on_leave for every node, entered or not
        below = self._made.pop()
        updated_node = super().on_leave(original_node, updated_node)  # leave_IndentedBlock etc.
        fns = self.edits.replacements.get(original_node)
        hoisted = self.edits.hoisted.get(original_node)
        if fns or hoisted:
            for fn in fns or ():
                updated_node = fn(updated_node)
            if hoisted is not None:  # the rewritten value goes into the assignment before the statement
                self._values[hoisted[1]] = updated_node
                below = []  # it stays in the output, in the assignment
                updated_node = cst.Name(hoisted[0])
            if below:
                self._dropped += _not_kept(updated_node, below)
            if not isinstance(original_node, (cst.BaseStatement, cst.BaseSuite, cst.Module)):
                below = [(original_node, updated_node)]  # holds what was made below it (checked above)
            # a statement's own result may be re-laid by its block (guards, blank lines): what was
            # made inside it is checked further up
        if self._made:
            self._made[-1].extend(below)
        elif self._dropped:  # the end of the visit
            _check_dropped(original_node, updated_node, self._dropped)
        return updated_node

    def leave_IndentedBlock(self, original_node, updated_node):
        body, changed = _block_statements(original_node.body, updated_node.body, self.edits, self._values)
        return updated_node.with_changes(body=body) if changed else updated_node

    def leave_Module(self, original_node, updated_node):
        body, _ = _block_statements(original_node.body, updated_node.body, self.edits, self._values)
        if self.edits.imports:
            body = _insert_imports(body, self.edits.imports)
        return updated_node.with_changes(body=body)


def _not_kept(result: cst.CSTNode, below: List[Tuple[cst.CSTNode, cst.CSTNode]]) -> List[cst.CSTNode]:
    """The originals of the rewritten nodes made below a replaced node that are not in `result`, what
    its replacements made of it (by identity: libcst keeps the child objects a new parent is built
    from). Dropping one is right when the replacement removes that part (an argument it deletes)."""
    present = {id(n) for n in _subtree(result)}
    return [o for o, made in below if id(made) not in present]


def _check_dropped(original: cst.CSTNode, result: cst.CSTNode, dropped: List[cst.CSTNode]) -> None:
    """Raise LostEdit when a dropped rewrite is back in the output as a new copy of its original
    text: a replacement or an insertion rebuilt that part from the original source, so the output
    holds it without the edit its rule reported. Nodes of the input kept as they were are no copies."""
    kept = {id(n) for n in _subtree(original)}
    texts = {}
    for o in dropped:
        texts.setdefault(type(o), {}).setdefault(_text(o), o)
    for n in _subtree(result):
        o = texts.get(type(n), {}).get(_text(n)) if type(n) in texts and id(n) not in kept else None
        if o is not None:
            raise LostEdit(
                f"an edit of {type(o).__name__} `{_code_of(o)}` is lost: the output holds a copy of its "
                "original text, rebuilt around or beside it without that edit"
            )


def _subtree(node: cst.CSTNode):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(children(n))


def _text(node: cst.CSTNode) -> str:
    try:
        return " ".join(cst.Module(body=[]).code_for_node(node).split())
    except Exception:  # noqa: BLE001 - a node that renders only inside its parent
        return f"<{type(node).__name__} {id(node)}>"


def _code_of(node: cst.CSTNode) -> str:
    text = _text(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _holding_edits(root: cst.CSTNode, edits: EditSet) -> Optional[set]:
    """The nodes under `root` (itself included) that are an edited node or an ancestor of one;
    None (enter everything) when an edited node is not found by the walk (e.g. a token)."""
    targets = set()
    for table in (edits.replacements, edits.before, edits.after, edits.guards, edits.removed, edits.wraps, edits.moves,
                  edits.hoisted):
        targets.update(table)
    targets.update(last for last, _ in edits.wraps.values())
    enter: set = set()
    stack: List[cst.CSTNode] = []  # the nodes around the one visited (trivia aside)
    found = 0

    def visit(node: cst.CSTNode) -> None:
        nonlocal found
        stack.append(node)
        if node in targets:
            found += 1
            enter.update(stack)
        for child in children(node):
            visit(child)
        stack.pop()

    visit(root)
    if found != len(targets):
        return None
    enter.add(root)
    return enter


def _is_import(stmt: cst.CSTNode) -> bool:
    """A line of imports, possibly opened by the module docstring (`'''doc'''; import x`)."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    body = list(stmt.body)
    if len(body) > 1 and isinstance(body[0], cst.Expr) and isinstance(body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
        body = body[1:]
    return all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in body)


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def import_anchor(body: Sequence[cst.CSTNode], needed: Iterable[str] = ()) -> int:
    """Index after which new imports go: after the last import of the leading import block, but
    before the first statement that reads one of the `needed` names (the names the new imports
    bind). A notebook-style script imports again mid-file with plain statements in between
    (``x = ...``, ``import matplotlib.pyplot as plt``): what distify added to those statements
    (``dist.init_process_group(...)``, ``runtime.device()``) runs before that later import."""
    anchor = _leading_import_block(body)
    needed = frozenset(needed)
    if needed:
        for i in range(anchor + 1):
            if not _is_import(body[i]) and names_read(body[i]) & needed:
                return i - 1
    return anchor


def names_read(node: cst.CSTNode) -> FrozenSet[str]:
    """Names a statement mentions as variables (attribute names after a dot are not variables)."""
    found: set = set()

    class V(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            found.add(n.value)

        def visit_Attribute(self, n: cst.Attribute) -> bool:
            walk(n.value, self)
            return False

    walk(node, V())
    return frozenset(found)


def bound_by_import(line: str) -> FrozenSet[str]:
    """The local names an import line binds (``import a.b`` binds ``a``)."""
    out = set()
    for stmt in parse_stmts(line, shared=True):  # read, never inserted
        for small in getattr(stmt, "body", ()):
            if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    if alias.asname is not None:
                        out.add(cst.ensure_type(alias.asname.name, cst.Name).value)
                    elif isinstance(small, cst.Import):
                        out.add(_code(alias.name).split(".")[0])
                    else:
                        out.add(_code(alias.name))
    return frozenset(out)


def _leading_import_block(body: Sequence[cst.CSTNode]) -> int:
    anchor = -1
    for i, stmt in enumerate(body):
        if _is_import(stmt):
            anchor = i
        elif i == 0 and _is_docstring(stmt):
            anchor = max(anchor, 0)
        elif isinstance(stmt, (cst.Try, cst.If)) and anchor >= 0 and _only_imports(stmt):
            # `try: import x / except ImportError: ...` inside the import block
            anchor = i
        elif isinstance(stmt, cst.SimpleStatementLine) and anchor >= 0:
            # simple statements (constants, sys.path tweaks) may sit between imports
            continue
        else:
            break
    return anchor


def _only_imports(stmt: cst.CSTNode) -> bool:
    found = False
    ok = True

    class V(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node):
            nonlocal found, ok
            for s in node.body:
                if isinstance(s, (cst.Import, cst.ImportFrom)):
                    found = True
                elif not isinstance(s, (cst.Pass, cst.Expr)):
                    ok = False
            return False

    stmt.visit(V())
    return found and ok


def _import_order(line: str) -> tuple:
    # third-party torch imports first (plain `import` before `from`), distify's own last
    return (line.startswith("from distify") or line.startswith("import distify"), line.startswith("from "), line)


def _imports_distify(stmt: cst.CSTNode) -> bool:
    """A line of imports that imports from distify itself (what it says, not how it is written:
    a comment above or beside it changes nothing)."""
    if not _is_import(stmt):
        return False

    def root(node) -> str:
        while isinstance(node, cst.Attribute):
            node = node.value
        return node.value if isinstance(node, cst.Name) else ""

    for s in stmt.body:
        if isinstance(s, cst.ImportFrom) and s.module is not None and not s.relative and root(s.module) == "distify":
            return True
        if isinstance(s, cst.Import) and any(root(a.name) == "distify" for a in s.names):
            return True
    return False


def _merge_from_imports(lines: Sequence[str]) -> List[str]:
    """One ``from M import a, b`` line for the names distify imports from one module (the
    checkpoint API, ``get_model_state_dict`` with its ``StateDictOptions``), in first-seen order."""
    out: List[str] = []
    merged: dict = {}
    for line in lines:
        words = line.split(" import ", 1)
        if line.startswith("from ") and len(words) == 2 and "(" not in line:
            module = words[0][len("from "):]
            if module in merged:
                out[merged[module]] += ", " + words[1]
                continue
            merged[module] = len(out)
        out.append(line)
    for i, line in enumerate(out):
        if len(line) > 99 and "(" not in line:  # one name a line, as black would
            head, names = line.split(" import ", 1)
            inner = "".join(f"    {n.strip()},\n" for n in names.split(","))
            out[i] = f"{head} import (\n{inner})"
    return out


def _insert_imports(
    body: List[cst.CSTNode], lines: Sequence[str], also_needed: Iterable[str] = ()
) -> List[cst.CSTNode]:
    """`body` with the import `lines` added after its import block, bound before the first statement
    that reads what they bind (or any of `also_needed`: names defined next to the imports)."""
    new = parse_stmts("\n".join(_merge_from_imports(sorted(lines, key=_import_order))))
    needed = frozenset(also_needed).union(*(bound_by_import(line) for line in lines))
    anchor = import_anchor(body, needed)
    # keep distify's own imports last: new torch imports go above an existing `from distify ...`
    while anchor > 0 and _imports_distify(body[anchor]) and not all(
        _import_order(line)[0] for line in lines
    ):
        anchor -= 1
    if anchor < 0:
        if body:
            body = [body[0].with_changes(leading_lines=body[0].leading_lines)] + body[1:]
        return list(new) + list(body)
    if anchor == 0 and _is_docstring(body[0]) and not _is_import(body[0]):
        new = [new[0].with_changes(leading_lines=[cst.EmptyLine()])] + new[1:]
    return list(body[: anchor + 1]) + list(new) + list(body[anchor + 1 :])
