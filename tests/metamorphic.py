"""Meaning-preserving transformations of a training script, for the metamorphic tests.

Three transformations, each a pure function of the source text:

- `rename(source, style)` renames every identifier the script itself defines, consistently, to
  neutral (`v1`, `f2`, `C3`) or misleading names (`gpu_`, `rank_`, `ema_`, `val_`, `test_`, `log_`,
  `train_` prefixes on whatever they land on). It returns the new source and a `Renaming` that applies
  the same renaming to any other text (distify's output of the original).
- `add_comments(source)` adds comments with distributed words before and after every statement.
- `canonical(text, known)` is the form two outputs are compared in: comments and layout dropped
  (`ast.unparse`), and the names distify introduced itself (those not in `known`, the input's names)
  numbered in order of first appearance, so `train_loader_sampler` and `v3_sampler` compare equal
  when they play the same part.

What "the script defines" means here (libcst scope metadata): every name with an assignment in some
scope that is not an import and not a builtin: variables, functions, classes, parameters, loop and
`with` targets. Also attribute names assigned on `self` and method names, and the instance (or class)
parameter of every method (`self`, `cls`: the first positional parameter of a function defined in a
class body that is no staticmethod), each method's to a name of its own (`def train(v7)`, `def fit(v9)`):
`self` and `cls` are a convention of the language, not something a decision may read. Left alone,
because renaming them would change what the program does, not only how it is spelled: imported names
and any name that is also imported somewhere in the file, dunder names, a `self` or `cls` that is no
method's first parameter, keyword arguments of calls to anything the script did not define,
attribute names reached from an imported name (`F.relu`), and attribute or method names that library
objects also have (`model.train`, `self.weight`, `forward`): renaming those would break the override.
"""

from __future__ import annotations

import ast
import io
import keyword
import re
import tokenize
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, Set, Tuple

import libcst as cst
from libcst.metadata import Assignment, ClassScope, GlobalScope, MetadataWrapper, ScopeProvider

PREFIXES = ("gpu_", "rank_", "ema_", "val_", "test_", "log_", "train_")
WORDS = ("loader", "ds", "model", "device", "sched", "scaler", "worker", "pid", "opt", "eval", "dev")
COMMENTS = ("# rank", "# no_sync", "# TODO: DistributedSampler", "# local_rank gpu", "# TODO: try no_sync later")
RECEIVERS = frozenset({"self", "cls"})


def _library_attributes() -> FrozenSet[str]:
    """Attribute names the objects a training script meets already have: renaming one of them on the
    script's side would stop overriding (or start shadowing) the library's."""
    names: Set[str] = set(dir(object))
    try:
        import torch
        from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

        model = torch.nn.Linear(1, 1)
        names |= set(dir(model)) | set(dir(torch.nn.Module)) | set(dir(torch.Tensor))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        names |= set(dir(opt)) | set(dir(torch.optim.lr_scheduler.StepLR(opt, 1)))
        names |= set(dir(DataLoader([0]))) | set(dir(Dataset)) | set(dir(IterableDataset)) | set(dir(Sampler))
        names |= set(dir(torch.amp.GradScaler)) | set(dir(torch.autograd.Function))
        names |= {"dataset", "sampler", "module", "batch_sampler", "weight", "bias", "state", "param_groups"}
    except ImportError:  # pragma: no cover - the suite has torch
        pass
    import argparse
    import threading

    names |= set(dir(argparse.Namespace)) | set(dir(threading.Thread)) | set(dir(dict)) | set(dir(list))
    return frozenset(names)


LIBRARY_ATTRIBUTES = _library_attributes()


def _root(node: cst.BaseExpression):
    """The name an attribute chain starts from (`F` in `F.relu`); None through a call or index
    (`runtime.unwrap(model).decode` is the model's attribute, not the runtime's)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return node if isinstance(node, cst.Name) else None


class _Survey(cst.CSTVisitor):
    """Which Name nodes are attributes, keywords or import parts: those are renamed (or not) by their
    own rules, never as plain variable references."""

    def __init__(self) -> None:
        self.attr_names: Dict[int, cst.Attribute] = {}
        self.keywords: Dict[int, cst.Call] = {}
        self.import_parts: Set[int] = set()
        self.self_attrs: Set[str] = set()
        self.all_names: Set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.all_names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.attr_names[id(node.attr)] = node

    def visit_Call(self, node: cst.Call) -> None:
        for a in node.args:
            if a.keyword is not None:
                self.keywords[id(a.keyword)] = node

    def visit_Import(self, node: cst.Import) -> bool:
        for n in _names_in(node):
            self.import_parts.add(id(n))
        return True

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        for n in _names_in(node):
            self.import_parts.add(id(n))
        return True

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._self_targets(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._self_targets(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._self_targets(node.target)

    def _self_targets(self, target: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for el in target.elements:
                self._self_targets(el.value)
        elif isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self":
            self.self_attrs.add(target.attr.value)


def _names_in(node: cst.CSTNode) -> Iterable[cst.Name]:
    class _Collect(cst.CSTVisitor):
        def __init__(self) -> None:
            self.found: list = []

        def visit_Name(self, n: cst.Name) -> None:
            self.found.append(n)

    c = _Collect()
    node.visit(c)
    return c.found


def _nodes(tree: cst.CSTNode, kind) -> list:
    found: list = []

    class V(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, kind):
                found.append(node)
            return True

    tree.visit(V())
    return found


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


@dataclass
class Renaming:
    """A consistent renaming: `names` for variables, functions, classes and parameters; `attrs` for
    attribute and method names. `apply` rewrites any text with it, by the same rules."""

    names: Dict[str, str]
    attrs: Dict[str, str]
    # (scope path, name) of every binding in the original script: a name distify binds itself
    # (`for block in model.layers: fully_shard(block)`, `[p.grad for p in g["params"]]`) is not the
    # script's `block` or `p` of another scope
    bindings: FrozenSet[Tuple[str, str]] = frozenset()

    # string literals of the original script; one distify wrote (`"model." + k`, a parameter-name
    # prefix made from the variable's name) spells the renamed names too
    strings: FrozenSet[str] = frozenset()
    # scope path of a method ("Trainer/fit") -> the new name of its instance (or class) parameter
    receivers: Dict[str, str] = None

    def __post_init__(self) -> None:
        if self.receivers is None:
            self.receivers = {}

    def apply(self, source: str) -> str:
        module = cst.parse_module(source)
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        survey = _Survey()
        wrapper.visit(survey)
        scopes = wrapper.resolve(ScopeProvider)
        receivers = _receiver_nodes(wrapper.module, scopes, self.receivers)
        return wrapper.module.visit(_Renamer(self, survey, _imported_names(wrapper), scopes, receivers)).code


def _methods(module: cst.Module):
    """(scope path, method) of every function defined directly in a class body that takes its
    instance or class first: not a staticmethod, with a positional parameter."""
    out = []

    def go(body, path: str, in_class: bool) -> None:
        for stmt in body:
            if isinstance(stmt, cst.ClassDef):
                go(_block(stmt), f"{path}{stmt.name.value}/", True)
            elif isinstance(stmt, cst.FunctionDef):
                params = (*stmt.params.posonly_params, *stmt.params.params)
                static = any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in stmt.decorators)
                if in_class and params and not static:
                    out.append((f"{path}{stmt.name.value}", stmt))
                go(_block(stmt), f"{path}{stmt.name.value}/", False)
            elif isinstance(stmt, cst.BaseCompoundStatement):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    part = getattr(stmt, field, None)
                    for sub in part if isinstance(part, (list, tuple)) else [part]:
                        if isinstance(sub, (cst.BaseSuite, cst.ExceptHandler, cst.Else, cst.Finally)):
                            go(_block(sub), path, in_class)

    go(module.body, "", False)
    return out


def _block(node) -> list:
    body = node.body
    return list(body.body) if isinstance(body, cst.IndentedBlock) else list(getattr(body, "body", ()) or ())


def _receiver_nodes(module: cst.Module, scopes, receivers: Dict[str, str]) -> Dict[int, str]:
    """id of every Name node that reads or binds a method's instance parameter -> its new name
    (`receivers`: by the method's scope path), found through the scopes (closures too)."""
    params = {}
    for path, fn in _methods(module):
        if path in receivers:
            params[id((*fn.params.posonly_params, *fn.params.params)[0])] = receivers[path]
    out: Dict[int, str] = {}
    if not params:
        return out
    for node, scope in scopes.items():
        if isinstance(node, cst.Name) and scope is not None and node.value in scope:
            for a in scope[node.value]:
                if id(getattr(a, "node", None)) in params:
                    out[id(node)] = params[id(a.node)]
    return out


def _scope_path(scope) -> str:
    parts = []
    while scope is not None and not isinstance(scope, GlobalScope):
        node = getattr(scope, "node", None)
        parts.append(node.name.value if isinstance(node, (cst.FunctionDef, cst.ClassDef)) else "<comp>")
        scope = scope.parent
    return "/".join(reversed(parts))


def _bindings(wrapper: MetadataWrapper) -> FrozenSet[Tuple[str, str]]:
    out = set()
    for scope in set(wrapper.resolve(ScopeProvider).values()):
        if scope is not None:
            out |= {(_scope_path(scope), a.name) for a in scope.assignments}
    return frozenset(out)


def _imported_names(wrapper: MetadataWrapper) -> Set[str]:
    scopes = wrapper.resolve(ScopeProvider)
    out: Set[str] = set()
    for scope in set(scopes.values()):
        if scope is None:
            continue
        for a in scope.assignments:
            if not isinstance(a, Assignment) or isinstance(a.node, (cst.Import, cst.ImportFrom)):
                out.add(a.name)
    return out


class _Renamer(cst.CSTTransformer):
    def __init__(self, renaming: Renaming, survey: _Survey, imported: Set[str], scopes=None, receivers=None) -> None:
        self.r = renaming
        self.s = survey
        self.receivers = receivers or {}  # id of a Name node of a method's instance -> its new name
        self.imported = imported
        self.scopes = scopes  # given when renaming distify's output: check whose binding a name is
        self.words = None
        if scopes is not None and (renaming.names or renaming.attrs):
            self.words = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.?")

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.SimpleString:
        if self.words is None or original.value in self.r.strings:
            return updated
        prefix, quote = updated.prefix, updated.quote
        body = updated.value[len(prefix) + len(quote): -len(quote)]
        if self.words.fullmatch(body) is None:  # prose (the inlined runtime's docstrings) keeps its words
            return updated
        # `"model." + k`: a parameter-name prefix made from a variable; `"decode"`: a method's name
        new = self.r.names.get(body[:-1], body[:-1]) + "." if body.endswith(".") else self.r.attrs.get(body, body)
        return updated.with_changes(value=f"{prefix}{quote}{new}{quote}")

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        key = id(original)
        if key in self.receivers:
            return updated.with_changes(value=self.receivers[key])
        if key in self.s.import_parts:
            return updated
        if key in self.s.attr_names:
            owner = self.s.attr_names[key]
            root = _root(owner.value)
            if isinstance(root, cst.Name) and root.value in self.imported and root.value not in RECEIVERS:
                return updated
            new = self.r.attrs.get(original.value)
            return updated.with_changes(value=new) if new else updated
        if key in self.s.keywords:
            func = self.s.keywords[key].func
            callee = func.value if isinstance(func, cst.Name) else None
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in RECEIVERS:
                callee = func.attr.value
            if callee is not None and (callee in self.r.names or callee in self.r.attrs):
                new = self.r.names.get(original.value)
                return updated.with_changes(value=new) if new else updated
            return updated
        new = self.r.names.get(original.value)
        if new and self.scopes is not None and not self._users(original):
            return updated
        return updated.with_changes(value=new) if new else updated

    def _users(self, name: cst.Name) -> bool:
        scope = self.scopes.get(name)
        if scope is None:
            return True
        found = scope[name.value] if name.value in scope else set()
        if not found:
            return True
        return any((_scope_path(a.scope), name.value) in self.r.bindings for a in found)


def _defined_names(wrapper: MetadataWrapper) -> tuple:
    scopes = wrapper.resolve(ScopeProvider)
    defined: Set[str] = set()
    blocked: Set[str] = set()
    in_class: Set[str] = set()
    for scope in set(scopes.values()):
        if scope is None:
            continue
        for a in scope.assignments:
            if isinstance(a, Assignment) and not isinstance(a.node, (cst.Import, cst.ImportFrom)):
                defined.add(a.name)
                if isinstance(scope, ClassScope):
                    in_class.add(a.name)
            else:
                blocked.add(a.name)
        for access in scope.accesses:
            if not access.referents:  # a builtin or a name the scope cannot see bound
                blocked.add(access.node.value if isinstance(access.node, cst.Name) else "")
    return defined, blocked, in_class


class _Strings(cst.CSTVisitor):
    """Words spelled in string literals (`"--lr"`, `"hidden"`): an attribute named like one may be an
    argparse destination or a `getattr` key, so it keeps its spelling."""

    def __init__(self) -> None:
        self.words: Set[str] = set()

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        try:
            value = node.evaluated_value
        except Exception:  # noqa: BLE001 - bytes or odd escapes: nothing to learn
            return
        if isinstance(value, str):
            self.words.add(value.lstrip("-").replace("-", "_"))


def imported_in(text: str) -> Set[str]:
    """Every name an import statement of `text` spells: the names distify's own imports want
    (`os`, `runtime`, `dist`). A script variable that takes one of them keeps its name (renamed, it
    would free the name and distify would no longer need to import under another one)."""
    found: Set[str] = set()
    for node in _nodes(cst.parse_module(text), (cst.Import, cst.ImportFrom)):
        found |= {n.value for n in _names_in(node)}
    return found


def rename(source: str, style: str = "neutral", keep: Iterable[str] = ()):
    """Rename what the script defines (except `keep`); `style` is "neutral" or "misleading".
    Returns the renamed source and the `Renaming`."""
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    survey = _Survey()
    wrapper.visit(survey)
    defined, blocked, in_class = _defined_names(wrapper)
    strings = _Strings()
    wrapper.module.visit(strings)
    # A name imported anywhere, or used as a builtin, keeps its spelling everywhere; so does a name
    # bound in a class body that a library object also has (`forward`, `train`): it overrides it.
    blocked |= {n for n in defined if _is_dunder(n) or n in RECEIVERS or keyword.iskeyword(n)}
    blocked |= (in_class | survey.self_attrs) & (LIBRARY_ATTRIBUTES | strings.words)
    blocked |= set(keep)
    taken = set(survey.all_names)
    counter = [0]

    def fresh(kind: str) -> str:
        while True:
            counter[0] += 1
            i = counter[0]
            if style == "neutral":
                name = f"{kind}{i}"
            else:
                name = f"{PREFIXES[i % len(PREFIXES)]}{WORDS[(i // len(PREFIXES)) % len(WORDS)]}{i}"
            if name not in taken:
                taken.add(name)
                return name

    names: Dict[str, str] = {}
    for n in sorted(defined - blocked):
        names[n] = fresh("v")
    attrs: Dict[str, str] = {}
    for n in sorted((survey.self_attrs | in_class) - blocked - LIBRARY_ATTRIBUTES - RECEIVERS):
        if _is_dunder(n):
            continue
        # A method that is also a module-level name keeps one spelling for both.
        attrs[n] = names.get(n) or fresh("a")
    receivers: Dict[str, str] = {}
    for path, _fn in _methods(wrapper.module):
        receivers.setdefault(path, fresh("s"))  # one name per method (a property's setter shares its getter's)
    literals = frozenset(n.value for n in _nodes(wrapper.module, cst.SimpleString))
    renaming = Renaming(names, attrs, bindings=_bindings(wrapper), strings=literals, receivers=receivers)
    scopes = wrapper.resolve(ScopeProvider)
    renamer = _Renamer(renaming, survey, _imported_names(wrapper), receivers=_receiver_nodes(wrapper.module, scopes, receivers))
    return wrapper.module.visit(renamer).code, renaming


class _Commenter(cst.CSTTransformer):
    def __init__(self) -> None:
        self.i = 0

    def _next(self) -> str:
        self.i += 1
        return COMMENTS[self.i % len(COMMENTS)]

    def _lead(self, updated):
        line = cst.EmptyLine(comment=cst.Comment(self._next()))
        return updated.with_changes(leading_lines=[*updated.leading_lines, line])

    def leave_SimpleStatementLine(self, original, updated):
        updated = self._lead(updated)
        if updated.trailing_whitespace.comment is None:
            ws = updated.trailing_whitespace.with_changes(
                whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(self._next())
            )
            updated = updated.with_changes(trailing_whitespace=ws)
        return updated

    def _compound(self, updated):
        updated = self._lead(updated)
        body = updated.body
        if isinstance(body, cst.IndentedBlock):
            if body.header.comment is None:
                body = body.with_changes(header=body.header.with_changes(
                    whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(self._next())))
            body = body.with_changes(footer=[*body.footer, cst.EmptyLine(indent=True, comment=cst.Comment(self._next()))])
            updated = updated.with_changes(body=body)
        return updated

    def leave_FunctionDef(self, original, updated):
        return self._compound(updated)

    def leave_ClassDef(self, original, updated):
        return self._compound(updated)

    def leave_For(self, original, updated):
        return self._compound(updated)

    def leave_While(self, original, updated):
        return self._compound(updated)

    def leave_If(self, original, updated):
        return self._compound(updated)

    def leave_With(self, original, updated):
        return self._compound(updated)

    def leave_Try(self, original, updated):
        return self._compound(updated)

    def leave_Module(self, original, updated):
        return updated.with_changes(footer=[*updated.footer, cst.EmptyLine(comment=cst.Comment(self._next()))])


def add_comments(source: str) -> str:
    """Comments with distributed words before and after every statement (and on block headers)."""
    return cst.parse_module(source).visit(_Commenter()).code


def names_of(text: str) -> Set[str]:
    return {t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.NAME}


class _MergeGuards(ast.NodeTransformer):
    """`if c: a` followed by `if c: b` reads as `if c: a; b`: whether distify guards two adjacent
    prints under one `if` or two is layout (a comment between them keeps them apart), not meaning."""

    def generic_visit(self, node):
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list) or not stmts or not isinstance(stmts[0], ast.stmt):
                continue
            merged: list = []
            for s in stmts:
                prev = merged[-1] if merged else None
                if (
                    isinstance(s, ast.If) and isinstance(prev, ast.If) and not s.orelse and not prev.orelse
                    and ast.dump(s.test) == ast.dump(prev.test)
                ):
                    prev.body = prev.body + s.body
                else:
                    merged.append(s)
            setattr(node, field, merged)
        return node


def canonical(text: str, known: Set[str]) -> str:
    """Layout and comments dropped; names not in `known` (distify's own) numbered by first use."""
    flat = ast.unparse(_MergeGuards().visit(ast.parse(text)))
    seen: Dict[str, str] = {}
    out = []
    def number(name: str) -> str:
        if name in known or keyword.iskeyword(name):
            return name
        return seen.setdefault(name, f"_new{len(seen) + 1}")

    for t in tokenize.generate_tokens(io.StringIO(flat).readline):
        s = t.string
        if t.type == tokenize.NAME:
            s = number(s)
        elif t.type == tokenize.STRING and re.match(r"[rRbBuU]*[fF]", s):
            # before Python 3.12 an f-string is one token: the names in its fields are numbered too
            s = re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda m: number(m.group(0)), s)
        out.append((t.type, s))
    return tokenize.untokenize(out)
