"""Mutation fuzzing of the distify engine over the fixture corpus.

    python bench/fuzz.py --cases 10000 [--jobs 2] [--seed 0] [--out fuzz-failures] [--cli-every 40]

Each case takes one ``fixtures/**/*.in.py`` file, applies one to three source mutations (libcst
or plain text) and checks, for both backends (ddp, horovod):

* ``migrate_source`` returns or raises ``distify.engine.InputError``; nothing else escapes;
* ``InputError`` only for input that CPython cannot compile (or cannot decode);
* an uncompilable input is never accepted and rewritten (it may come back unchanged only when it
  has no ``torch`` text at all: the documented quick skip);
* every changed output compiles;
* migrating the output again returns it unchanged (idempotence);
* an input without ``.backward(`` comes back byte-for-byte unchanged.

A sample of cases (every ``--cli-every``-th) is also run through the real CLI in a subprocess, in
batches (one directory per batch, rewritten in place, per backend): the exit code is never 123,
stderr never holds a traceback, and each file on disk ends up equal to ``migrate_source``'s output.

Mutations (``MUTATIONS``): consistent renaming of local/global variables and functions, shuffling
of top-level defs/classes, extra nesting of ``main``'s body or of the module's code (``if True:``,
``for _ in range(1):``, ``with contextlib.nullcontext():``), comments, extra parentheses,
backslash continuations, semicolons, re-indentation with tabs or two spaces, and random deletion of
statements or raw lines (deleting lines may break the syntax: that is intended and must give
``InputError``).

Prints the number of (case, backend) checks per outcome -- ok-changed, ok-unchanged,
input-error, FAILED:<property> -- and the failures deduplicated by cause; each failing input is
written to ``--out`` (one folder per cause) with a ``.txt`` describing it. Exit 1 if any failed.
The module is importable (tests/test_fuzz.py drives the same mutations and checks with
hypothesis).
"""

from __future__ import annotations

import argparse
import collections
import glob
import hashlib
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import libcst as cst
from libcst.metadata import FunctionScope, GlobalScope, MetadataWrapper, ScopeProvider

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("ddp", "horovod")


def corpus(root: str = REPO) -> List[Tuple[str, bytes]]:
    """(relative path, bytes) of every fixture input, sorted."""
    paths = sorted(glob.glob(os.path.join(root, "fixtures", "**", "*.in.py"), recursive=True))
    out = []
    for p in paths:
        with open(p, "rb") as fh:
            out.append((os.path.relpath(p, root), fh.read()))
    return out


# ------------------------------------------------------------------------------ mutations
# Each mutation: (rng, source text) -> new source text. It raises Skip when it does not apply.


class Skip(Exception):
    pass


def _parse(text: str) -> cst.Module:
    try:
        return cst.parse_module(text)
    except Exception:  # an earlier mutation broke the syntax: libcst mutations do not apply
        raise Skip()


class _Renamer(cst.CSTTransformer):
    def __init__(self, ids: Dict[int, str]):
        self.ids = ids

    def leave_Name(self, original, updated):
        new = self.ids.get(id(original))
        return updated.with_changes(value=new) if new else updated


def m_rename(rng: random.Random, text: str) -> str:
    """Rename some variables and functions of the global and function scopes, consistently."""
    module = _parse(text)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scopes = list(dict.fromkeys(wrapper.resolve(ScopeProvider).values()))  # traversal order: reproducible
    candidates = []
    for scope in scopes:
        if not isinstance(scope, (GlobalScope, FunctionScope)):
            continue
        by_name = collections.defaultdict(list)
        for a in scope.assignments:
            by_name[a.name].append(a)
        for name, assigns in by_name.items():
            if name.startswith("__") or name == "_":
                continue
            ok = True
            nodes = []
            for a in assigns:
                n = a.node
                if isinstance(n, cst.Name):
                    nodes.append(n)
                elif isinstance(n, (cst.FunctionDef, cst.ClassDef)):
                    nodes.append(n.name)
                elif isinstance(n, cst.Param):
                    ok = False  # keyword call sites would need renaming too
                else:  # imports, global/nonlocal statements, ...
                    ok = False
                for ref in a.references:
                    if isinstance(ref.node, cst.Name):
                        nodes.append(ref.node)
                    else:
                        ok = False
            if ok and nodes:
                candidates.append((name, nodes))
    if not candidates:
        raise Skip()
    candidates.sort(key=lambda c: (c[0], len(c[1])))
    chosen = rng.sample(candidates, k=min(len(candidates), rng.randint(1, 6)))
    ids = {}
    for name, nodes in chosen:
        new = rng.choice(["{}_r{}", "r{}_{}", "x{1}{0}"]).format(name, rng.randint(0, 999))
        for n in nodes:
            ids[id(n)] = new
    return wrapper.module.visit(_Renamer(ids)).code


def m_reorder(rng: random.Random, text: str) -> str:
    """Shuffle runs of consecutive top-level function and class definitions."""
    module = _parse(text)
    body = list(module.body)
    runs, cur = [], []
    for i, stmt in enumerate(body):
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            cur.append(i)
        else:
            if len(cur) > 1:
                runs.append(cur)
            cur = []
    if len(cur) > 1:
        runs.append(cur)
    if not runs:
        raise Skip()
    run = rng.choice(runs)
    stmts = [body[i] for i in run]
    before = list(stmts)
    while stmts == before:
        rng.shuffle(stmts)
    for i, s in zip(run, stmts):
        body[i] = s
    return module.with_changes(body=body).code


_WRAPPERS = ("if True:", "for _ in range(1):", "with contextlib.nullcontext():")


def _wrap(stmts: Sequence[cst.BaseStatement], header: str) -> cst.BaseCompoundStatement:
    shell = cst.parse_statement(header + "\n    pass\n")
    return shell.with_changes(body=cst.IndentedBlock(body=list(stmts)))


def _add_import(module: cst.Module) -> cst.Module:
    """`import contextlib` after any docstring / __future__ imports."""
    body = list(module.body)
    i = 0
    while i < len(body):
        s = body[i]
        if isinstance(s, cst.SimpleStatementLine) and all(
            isinstance(x, cst.Expr) and isinstance(x.value, (cst.SimpleString, cst.ConcatenatedString))
            or isinstance(x, cst.ImportFrom) and isinstance(x.module, cst.Name) and x.module.value == "__future__"
            for x in s.body
        ):
            i += 1
        else:
            break
    body.insert(i, cst.parse_statement("import contextlib\n"))
    return module.with_changes(body=body)


def m_nest(rng: random.Random, text: str) -> str:
    """Wrap main()'s body -- or, without a main, the module's code after its imports -- in a block."""
    module = _parse(text)
    header = rng.choice(_WRAPPERS)
    body = list(module.body)
    funcs = [i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value in ("main", "train")]
    if funcs and rng.random() < 0.7:
        i = rng.choice(funcs)
        fn = body[i]
        if not isinstance(fn.body, cst.IndentedBlock):
            raise Skip()
        inner = list(fn.body.body)
        keep = []
        if inner and isinstance(inner[0], cst.SimpleStatementLine) and isinstance(inner[0].body[0], cst.Expr) \
                and isinstance(inner[0].body[0].value, cst.SimpleString):
            keep, inner = inner[:1], inner[1:]  # the docstring stays a docstring
        if not inner:
            raise Skip()
        body[i] = fn.with_changes(body=fn.body.with_changes(body=keep + [_wrap(inner, header)]))
    else:
        last_import = -1
        for j, s in enumerate(body):
            if isinstance(s, cst.SimpleStatementLine) and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body):
                last_import = j
        rest = body[last_import + 1:]
        if not rest:
            raise Skip()
        # wrap all of it, or just the `if __name__ == "__main__":` statement, or a random slice
        choice = rng.random()
        if choice < 0.4:
            lo, hi = last_import + 1, len(body)
        else:
            lo = rng.randrange(last_import + 1, len(body))
            hi = rng.randrange(lo + 1, len(body) + 1)
        body[lo:hi] = [_wrap(body[lo:hi], header)]
    module = module.with_changes(body=body)
    if "contextlib" in header:
        module = _add_import(module)
    return module.code


class _Collect(cst.CSTVisitor):
    def __init__(self):
        self.stmts: List[cst.CSTNode] = []
        self.simple_lines: List[cst.SimpleStatementLine] = []
        self.exprs: List[cst.CSTNode] = []
        self.assigns: List[cst.Assign] = []
        self.depth_import = 0

    def visit_SimpleStatementLine(self, node):
        self.stmts.append(node)
        self.simple_lines.append(node)

    def visit_Import(self, node):
        return False

    def visit_ImportFrom(self, node):
        return False

    def visit_Assign(self, node):
        self.assigns.append(node)

    def visit_Call(self, node):
        self.exprs.append(node)

    def visit_BinaryOperation(self, node):
        self.exprs.append(node)

    def visit_Subscript(self, node):
        self.exprs.append(node)

    def visit_Attribute(self, node):
        self.exprs.append(node)

    def visit_Decorator(self, node):
        return False  # keep decorators simple (`@(x)` needs 3.9, fine, but keep it boring)

    def _compound(self, node):
        self.stmts.append(node)

    visit_FunctionDef = visit_ClassDef = visit_If = visit_For = visit_While = visit_With = visit_Try = _compound


class _Replace(cst.CSTTransformer):
    def __init__(self, repl: Dict[int, Callable[[cst.CSTNode], cst.CSTNode]]):
        self.repl = repl

    def on_leave(self, original, updated):
        f = self.repl.get(id(original))
        return f(updated) if f else updated


def _collect(module: cst.Module) -> _Collect:
    c = _Collect()
    module.visit(c)
    return c


_COMMENTS = ["# fuzz", "#", "# TODO: .backward( in a comment", "# distify: ignore?", "#\tépoch ünicode", "# type: ignore"]


def m_comments(rng: random.Random, text: str) -> str:
    """Comment lines before random statements and trailing comments on random simple lines."""
    module = _parse(text)
    c = _collect(module)
    if not c.stmts:
        raise Skip()
    repl = {}
    for node in rng.sample(c.stmts, k=min(len(c.stmts), rng.randint(1, 8))):
        comment = rng.choice(_COMMENTS)
        if isinstance(node, cst.SimpleStatementLine) and rng.random() < 0.5 and node.trailing_whitespace.comment is None:
            repl[id(node)] = lambda n, comment=comment: n.with_changes(
                trailing_whitespace=cst.TrailingWhitespace(
                    whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(comment), newline=n.trailing_whitespace.newline
                )
            )
        else:
            repl[id(node)] = lambda n, comment=comment: n.with_changes(
                leading_lines=[*n.leading_lines, cst.EmptyLine(comment=cst.Comment(comment))]
            )
    return module.visit(_Replace(repl)).code


def m_parens(rng: random.Random, text: str) -> str:
    """Wrap random calls, attributes, subscripts and binary operations in (extra) parentheses."""
    module = _parse(text)
    c = _collect(module)
    if not c.exprs:
        raise Skip()

    def paren(n):
        times = 1 if rng.random() < 0.8 else 2
        return n.with_changes(
            lpar=[*n.lpar, *[cst.LeftParen()] * times], rpar=[*[cst.RightParen()] * times, *n.rpar]
        )

    repl = {id(n): paren for n in rng.sample(c.exprs, k=min(len(c.exprs), rng.randint(1, 12)))}
    return module.visit(_Replace(repl)).code


def m_backslash(rng: random.Random, text: str) -> str:
    """Backslash continuations after `=` of random assignments."""
    module = _parse(text)
    c = _collect(module)
    if not c.assigns:
        raise Skip()

    def cont(n: cst.Assign):
        targets = list(n.targets)
        targets[-1] = targets[-1].with_changes(whitespace_after_equal=cst.SimpleWhitespace(" \\\n        "))
        return n.with_changes(targets=targets)

    repl = {id(n): cont for n in rng.sample(c.assigns, k=min(len(c.assigns), rng.randint(1, 6)))}
    return module.visit(_Replace(repl)).code


class _Semicolons(cst.CSTTransformer):
    def __init__(self, rng: random.Random, p: float):
        self.rng, self.p = rng, p

    def _merge(self, body):
        out = []
        for stmt in body:
            prev = out[-1] if out else None
            if (
                isinstance(stmt, cst.SimpleStatementLine)
                and isinstance(prev, cst.SimpleStatementLine)
                and prev.trailing_whitespace.comment is None
                and self.rng.random() < self.p
            ):
                first = list(prev.body)
                first[-1] = first[-1].with_changes(
                    semicolon=cst.Semicolon(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(" "))
                )
                out[-1] = prev.with_changes(body=first + list(stmt.body), trailing_whitespace=stmt.trailing_whitespace)
            else:
                out.append(stmt)
        return out

    def leave_IndentedBlock(self, original, updated):
        return updated.with_changes(body=self._merge(updated.body))

    def leave_Module(self, original, updated):
        return updated.with_changes(body=self._merge(updated.body))


def m_semicolons(rng: random.Random, text: str) -> str:
    """Join random runs of simple statements into one line with semicolons."""
    out = _parse(text).visit(_Semicolons(rng, rng.choice([0.2, 0.5, 1.0]))).code
    if out == text:
        raise Skip()
    return out


class _Reindent(cst.CSTTransformer):
    def leave_IndentedBlock(self, original, updated):
        return updated.with_changes(indent=None)


def m_reindent(rng: random.Random, text: str) -> str:
    """Re-indent every block consistently: tabs, two spaces or eight spaces."""
    module = _parse(text).visit(_Reindent())
    return module.with_changes(default_indent=rng.choice(["\t", "  ", "        "])).code


class _Delete(cst.CSTTransformer):
    def __init__(self, ids):
        self.ids = ids

    def on_leave(self, original, updated):
        if id(original) in self.ids:
            return cst.RemoveFromParent()
        return updated

    def leave_IndentedBlock(self, original, updated):
        if not updated.body:  # keep the block valid
            return updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated


def m_delete_stmts(rng: random.Random, text: str) -> str:
    """Delete random statements (simple or compound), the training step among them sometimes."""
    module = _parse(text)
    c = _collect(module)
    if not c.stmts:
        raise Skip()
    if rng.random() < 0.3:
        code = module.code_for_node
        victims = [s for s in c.simple_lines if ".backward(" in code(s)] or rng.sample(c.stmts, 1)
    else:
        victims = rng.sample(c.stmts, k=min(len(c.stmts), rng.randint(1, 4)))
    return module.visit(_Delete({id(v) for v in victims})).code


def m_delete_lines(rng: random.Random, text: str) -> str:
    """Delete random raw lines (may well break the syntax)."""
    lines = text.splitlines(keepends=True)
    if len(lines) < 2:
        raise Skip()
    if rng.random() < 0.3:
        idx = [i for i, l in enumerate(lines) if ".backward(" in l]
        if idx:
            del lines[rng.choice(idx)]
            return "".join(lines)
    for _ in range(rng.randint(1, 3)):
        if lines:
            i = rng.randrange(len(lines))
            del lines[i:i + rng.choice([1, 1, 1, 2, 5])]
    return "".join(lines)


MUTATIONS: Dict[str, Callable[[random.Random, str], str]] = {
    "rename": m_rename,
    "reorder": m_reorder,
    "nest": m_nest,
    "comments": m_comments,
    "parens": m_parens,
    "backslash": m_backslash,
    "semicolons": m_semicolons,
    "reindent": m_reindent,
    "delete_stmts": m_delete_stmts,
    "delete_lines": m_delete_lines,
}
_WEIGHTS = {"delete_lines": 0.6, "delete_stmts": 1.0}


def mutate(rng: random.Random, source: bytes, names: Optional[Sequence[str]] = None) -> Tuple[bytes, Tuple[str, ...]]:
    """Apply `names` (or 1-3 random mutations) in order; returns the bytes and the ones applied."""
    text = source.decode("utf-8")
    if names is None:
        pool = list(MUTATIONS)
        weights = [_WEIGHTS.get(n, 1.0) for n in pool]
        names = rng.choices(pool, weights, k=rng.randint(1, 3))
    applied = []
    for name in names:
        try:
            text = MUTATIONS[name](rng, text)
            applied.append(name)
        except Skip:
            pass
    return text.encode("utf-8"), tuple(applied)


# ------------------------------------------------------------------------------ properties


@dataclass
class Check:
    backend: str
    outcome: str  # ok-changed | ok-unchanged | input-error | FAILED:<property>
    detail: str = ""
    output: bytes = b""

    @property
    def failed(self) -> bool:
        return self.outcome.startswith("FAILED")


def _compiles(data: bytes) -> Optional[str]:
    try:
        compile(data, "<fuzz>", "exec", dont_inherit=True)
        return None
    except SyntaxError as e:
        return f"{type(e).__name__}: {e.msg} (line {e.lineno})"
    except (ValueError, RecursionError, MemoryError) as e:
        return f"{type(e).__name__}: {e}"


def _exc(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = next(
        (f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(tb) if "distify" in f.filename or "/migrate/" in f.filename or "/rules/" in f.filename),
        f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else "?",
    )
    return f"{type(e).__name__} at {where}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def has_backward_call(source: bytes) -> bool:
    """True when the input calls some ``<expr>.backward(...)`` (also ``(loss.backward)()``, which a
    text search for ".backward(" misses: extra parentheses are one of the mutations)."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return b".backward(" in source
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
        for n in ast.walk(tree)
    )


def check_source(source: bytes, backend: str) -> Check:
    """Run migrate_source on `source` for `backend` and check every property."""
    from distify.engine import InputError, migrate_source
    from distify.rules.base import Options

    opts = Options(backend=backend)
    compile_error = _compiles(source)
    try:
        result = migrate_source(source, opts)
    except InputError as e:
        if compile_error is None:
            return Check(backend, "FAILED:input-error-on-valid-input", str(e))
        return Check(backend, "input-error", str(e))
    except BaseException as e:  # noqa: BLE001 - that is the point
        if isinstance(e, KeyboardInterrupt):
            raise
        return Check(backend, "FAILED:raised", _exc(e))
    out = result.output
    if compile_error is not None and (out != source or b"torch" in source):
        return Check(backend, "FAILED:accepted-invalid-input", compile_error, out)
    if out != source:
        err = _compiles(out)
        if err is not None:
            return Check(backend, "FAILED:output-does-not-compile", err, out)
    if out != source and not has_backward_call(source):
        return Check(backend, "FAILED:changed-without-training", "no .backward( call in the input, output differs", out)
    try:
        again = migrate_source(out, opts)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        return Check(backend, "FAILED:second-run-raised", _exc(e), out)
    if again.output != out:
        return Check(backend, "FAILED:not-idempotent", _first_diff(out, again.output), out)
    return Check(backend, "ok-changed" if out != source else "ok-unchanged", output=out)


def _first_diff(a: bytes, b: bytes) -> str:
    import difflib

    lines = list(difflib.unified_diff(a.decode("utf-8", "replace").splitlines(), b.decode("utf-8", "replace").splitlines(), lineterm="", n=0))
    changed = [l for l in lines[2:] if l[:1] in "+-" and not l.startswith(("+++", "---"))]
    return " | ".join(l.strip() for l in changed[:4])[:300]


# ------------------------------------------------------------------------------ CLI sample


def cli_check(sources: Sequence[Tuple[str, bytes]], backend: str, workdir: str) -> List[Tuple[str, str, str]]:
    """Rewrite copies of `sources` in place with the real CLI; return (case, property, detail)
    for each violation: exit 123 / traceback on stderr / a file that differs from migrate_source."""
    from distify.engine import InputError, migrate_source
    from distify.rules.base import Options

    d = tempfile.mkdtemp(prefix=f"cli-{backend}-", dir=workdir)
    try:
        for name, data in sources:
            with open(os.path.join(d, name + ".py"), "wb") as fh:
                fh.write(data)
        proc = subprocess.run(
            [sys.executable, "-m", "distify", d, "--backend", backend, "--quiet"],
            capture_output=True, timeout=600, cwd=d,
            env={**os.environ, "PYTHONHASHSEED": "0", "NO_COLOR": "1"},
        )
        bad = []
        err = proc.stderr.decode("utf-8", "replace")
        if proc.returncode not in (0, 1, 2, 3):  # 3: a file distify refuses
            bad.append(("*", f"cli-exit-{proc.returncode}", err[-500:]))
        if "Traceback (most recent call last)" in err:
            bad.append(("*", "cli-traceback", err[-800:]))
        for name, data in sources:
            with open(os.path.join(d, name + ".py"), "rb") as fh:
                on_disk = fh.read()
            try:
                want = migrate_source(data, Options(backend=backend)).output
            except InputError:
                want = data
            except Exception:  # reported by check_source already
                continue
            if on_disk != want:
                bad.append((name, "cli-output-differs", f"{len(on_disk)} bytes on disk, {len(want)} expected"))
        if proc.returncode == 123 or "internal error" in err:
            for line in err.splitlines():
                if "internal error" in line:
                    bad.append((line.split(":", 1)[0].rsplit("/", 1)[-1].replace(".py", ""), "cli-internal-error", line[-300:]))
        return bad
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------ driver

_CORPUS: List[Tuple[str, bytes]] = []


def _init(root: str) -> None:
    global _CORPUS
    _CORPUS = corpus(root)
    import distify.engine  # noqa: F401 - warm the imports once per worker


def make_case(seed: int, index: int) -> Tuple[str, bytes, Tuple[str, ...]]:
    rng = random.Random(f"{seed}:{index}")
    path, src = _CORPUS[rng.randrange(len(_CORPUS))]
    data, applied = mutate(rng, src)
    return path, data, applied


def run_case(args) -> dict:
    seed, index = args
    try:
        path, data, applied = make_case(seed, index)
    except Exception as e:  # a bug in the fuzzer itself, not in distify
        return {"index": index, "fuzzer_error": _exc(e)}
    checks = [check_source(data, b) for b in BACKENDS]
    return {
        "index": index,
        "path": path,
        "applied": applied,
        "data": data if any(c.failed for c in checks) else None,
        "checks": [(c.backend, c.outcome, c.detail) for c in checks],
        "sha": hashlib.sha1(data).hexdigest()[:12],
    }


def _cause_key(prop: str, detail: str) -> str:
    norm = re.sub(r"\d+", "N", detail)
    norm = re.sub(r"'[^']*'", "'…'", norm)
    return f"{prop} | {norm[:160]}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000, help="number of mutated inputs (each checked for both backends)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "distify-fuzz-failures"), help="folder for failing inputs (emptied first)")
    ap.add_argument("--cli-every", type=int, default=40, help="run every N-th case through the CLI too (0: never)")
    ap.add_argument("--cli-batch", type=int, default=60, help="CLI cases per distify invocation")
    args = ap.parse_args(argv)

    import multiprocessing as mp

    t0 = time.time()
    outcomes = collections.Counter()
    per_mutation = collections.Counter()
    causes: Dict[str, List[Tuple[int, str, str, Tuple[str, ...]]]] = collections.defaultdict(list)
    fuzzer_errors = collections.Counter()
    cli_sample: List[Tuple[str, bytes]] = []
    failing_data: Dict[int, bytes] = {}
    if os.path.isdir(args.out):
        shutil.rmtree(args.out)
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ctx.Pool(args.jobs, initializer=_init, initargs=(REPO,)) as pool:
        it = pool.imap_unordered(run_case, ((args.seed, i) for i in range(args.cases)), chunksize=8)
        for done, res in enumerate(it, 1):
            if "fuzzer_error" in res:
                fuzzer_errors[res["fuzzer_error"]] += 1
                continue
            for m in res["applied"]:
                per_mutation[m] += 1
            for backend, outcome, detail in res["checks"]:
                outcomes[outcome] += 1
                if outcome.startswith("FAILED"):
                    causes[_cause_key(outcome, detail)].append((res["index"], backend, res["path"], res["applied"]))
                    failing_data[res["index"]] = res["data"]
            if done % 1000 == 0:
                print(f"  {done}/{args.cases} cases, {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    _init(REPO)

    cli_failures: Dict[str, List[Tuple[str, str]]] = collections.defaultdict(list)
    cli_cases = 0
    if args.cli_every:
        work = tempfile.mkdtemp(prefix="distify-fuzz-cli-")
        try:
            sample = [i for i in range(args.cases) if i % args.cli_every == 0]
            batch: List[Tuple[str, bytes]] = []
            jobs = []
            for i in sample:
                _, data, _ = make_case(args.seed, i)
                batch.append((f"case{i}", data))
                if len(batch) == args.cli_batch:
                    jobs.append(batch)
                    batch = []
            if batch:
                jobs.append(batch)
            cli_cases = len(sample)
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max(1, args.jobs // 2)) as ex:
                futs = [ex.submit(cli_check, b, backend, work) for b in jobs for backend in BACKENDS]
                for f in futs:
                    for name, prop, detail in f.result():
                        cli_failures[_cause_key(prop, detail)].append((name, detail))
                        if name.startswith("case"):
                            i = int(name[4:])
                            failing_data.setdefault(i, make_case(args.seed, i)[1])
        finally:
            shutil.rmtree(work, ignore_errors=True)

    # ---- report
    elapsed = time.time() - t0
    total_checks = sum(outcomes.values())
    print(f"distify fuzz: {args.cases} cases x {len(BACKENDS)} backends = {total_checks} checks in {elapsed:.0f}s "
          f"(seed {args.seed}, {args.jobs} jobs)")
    for key in ("ok-changed", "ok-unchanged", "input-error"):
        print(f"  {key:<40} {outcomes.get(key, 0)}")
    for key in sorted(k for k in outcomes if k.startswith("FAILED")):
        print(f"  {key:<40} {outcomes[key]}")
    print("  mutations applied: " + ", ".join(f"{k}={v}" for k, v in sorted(per_mutation.items())))
    if args.cli_every:
        print(f"  CLI sample: {cli_cases} cases x {len(BACKENDS)} backends, {sum(len(v) for v in cli_failures.values())} violations")
    if fuzzer_errors:
        print(f"  fuzzer errors (bugs in bench/fuzz.py, not distify): {sum(fuzzer_errors.values())}")
        for k, v in fuzzer_errors.most_common(5):
            print(f"    {v}x {k}")
    n_fail = sum(len(v) for v in causes.values()) + sum(len(v) for v in cli_failures.values())
    if causes or cli_failures:
        os.makedirs(args.out, exist_ok=True)
        print(f"\nFAILURES by cause ({len(causes) + len(cli_failures)} causes), inputs in {args.out}:")
        for n, (key, hits) in enumerate(sorted(causes.items(), key=lambda kv: -len(kv[1])), 1):
            folder = os.path.join(args.out, f"{n:02d}-" + re.sub(r"[^A-Za-z0-9]+", "-", key)[:60].strip("-"))
            os.makedirs(folder, exist_ok=True)
            idx, backend, path, applied = hits[0]
            print(f"  [{n}] {len(hits)}x {key}\n      e.g. case {idx} ({backend}) from {path} via {', '.join(applied) or 'nothing'}")
            for idx, backend, path, applied in hits[:20]:
                with open(os.path.join(folder, f"case{idx}.py"), "wb") as fh:
                    fh.write(failing_data[idx])
                with open(os.path.join(folder, f"case{idx}.txt"), "w") as fh:
                    fh.write(f"{key}\nbackend: {backend}\nfrom: {path}\nmutations: {applied}\nseed: {args.seed} index: {idx}\n")
        for key, hits in cli_failures.items():
            print(f"  [cli] {len(hits)}x {key}")
            folder = os.path.join(args.out, "cli-" + re.sub(r"[^A-Za-z0-9]+", "-", key)[:60].strip("-"))
            os.makedirs(folder, exist_ok=True)
            for name, detail in hits[:20]:
                if name.startswith("case"):
                    with open(os.path.join(folder, name + ".py"), "wb") as fh:
                        fh.write(failing_data[int(name[4:])])
    print(f"\n{'FAILED' if n_fail else 'OK'}: {n_fail} failing checks")
    return 1 if n_fail or fuzzer_errors else 0


if __name__ == "__main__":
    sys.exit(main())
