"""DST304 directories and files are managed by rank 0."""

from __future__ import annotations

from distify.library import FILE_WRITES
from distify.records import MAKEDIRS
import libcst as cst

from distify.syntax import arg, dotted, all_nodes
from distify.rules.base import HOROVOD_BACKEND, Context, Rule, call_statement
from distify.rank import follows_barrier
from distify.walk import walk
from distify.writes import file_path_use, per_rank_file, scripted_save



class Rank0Filesystem(Rule):
    """Create, copy, remove and write files from the main process only.

    What it does:
        Puts ``os.makedirs``/``os.mkdir``, ``shutil`` copy/move/rmtree statements,
        ``Path(...).mkdir(...)``, result writers (``np.save``/``np.savetxt``, ``json.dump``,
        ``pickle.dump``, ``df.to_csv``, ``plt.savefig``, ``fig.savefig``, torchvision's
        ``save_image``, ``imageio``/``cv2`` image writes, ``Path.write_text``) under the main-process guard, and makes
        ``open(path, "w"/"a")`` write to ``os.devnull`` on the other ranks – so a ``csv.writer``
        or a ``with`` block around it runs unchanged everywhere and only rank 0 writes the file.

    Why:
        N processes racing to create or delete the same directory fail with ``FileExistsError``
        (``os.mkdir``) or delete each other's work (``shutil.rmtree``), and N writers of one
        results file leave it garbled.

    Example:
        os.makedirs(args.out_dir, exist_ok=True)

        becomes

        if runtime.is_main_process():
            os.makedirs(args.out_dir, exist_ok=True)
    """

    code = "DST304"
    name = "rank0-filesystem"
    summary = "create directories on rank 0 only"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        if a.entry_owner is None:
            return
        made = []  # directories created on rank 0 only, from here on
        for site in a.calls:
            is_fs = site.qualname in MAKEDIRS or (
                site.qualname is None
                and hasattr(site.call.func, "attr")
                and site.call.func.attr.value == "mkdir"
                and _pathlib_object(a, site.call.func.value)
            )
            is_fs = is_fs or site.qualname in FILE_WRITES or (
                site.qualname is None
                and isinstance(site.call.func, cst.Attribute)
                and (site.call.func.attr.value in ("to_csv", "to_json", "to_parquet", "savefig", "write_text", "write_bytes")
                     or scripted_save(a, site))
            )
            if not is_fs or not call_statement(site.stmt, site.call) or ctx.in_rank_guard(site.stmt):
                continue
            if per_rank_file(a, site):
                continue  # a per-rank file (`f"samples_rank{rank}.png"`): each rank writes its own
            if ctx.guard_statement(site.stmt):
                ctx.report(self.code, site.call, f"{ctx.code(site.call.func)} runs on the main process only")
                if site.qualname in ("os.makedirs", "os.mkdir") or getattr(site.call.func, "attr", None) is not None and site.call.func.attr.value == "mkdir":
                    made.append(site)
        devnulled = []
        for site in a.calls:
            if not (isinstance(site.call.func, cst.Name) and site.call.func.value == "open" and site.qualname is None):
                continue
            mode = arg(site.call, 1, "mode")
            path = arg(site.call, 0, "file")
            if mode is None or path is None or not isinstance(mode.value, cst.SimpleString):
                continue
            if not set(str(mode.value.evaluated_value)) & set("wax") or _devnull(a, path.value):
                continue
            if ctx.in_rank_guard(site.stmt) or per_rank_file(a, site, path.value):
                continue  # already on some ranks, or a per-rank file each rank writes itself
            os_name = ctx.imported("os", None, "os")
            cond = ctx.main_process
            ctx.edits.replace(
                path.value,
                lambda n, cond=cond, os_name=os_name: cst.IfExp(
                    test=cst.parse_expression(cond), body=n, orelse=cst.parse_expression(f"{os_name}.devnull")
                ),
            )
            ctx.report(self.code, site.call, "file written by the main process only (os.devnull elsewhere)")
            devnulled.append(site.call)
        for site in made:
            self._wait_for(ctx, site, devnulled)

    def _wait_for(self, ctx: Context, made, devnulled) -> None:
        """Code of every rank that uses a directory rank 0 creates waits for it: a barrier before
        the first such statement, where its and the creation's code paths meet. Writes into the
        directory that run on rank 0 only (guarded, or opened on os.devnull elsewhere) and plain
        path building (``path = os.path.join(out_dir, "x.csv")``) need no wait; anything else
        (``os.listdir(out_dir)``, ``open(path)`` to read, a ``FileHandler``) does."""
        a = ctx.anatomy
        target = arg(made.call, 0, "name") or arg(made.call, 0, "path")
        if target is None and isinstance(made.call.func, cst.Attribute):
            keys = {_key(made.call.func.value)}  # Path(x).mkdir()
        else:
            keys = {_key(target.value)} if target is not None else set()
        keys.discard(None)
        if not keys:
            return
        rank0 = lambda st: any(x in ctx.edits.guards for x in (*a.stmt_parent.get(st, ()), st)) or ctx.in_rank_guard(st)
        made_chain = (*a.stmt_parent.get(made.stmt, ()), made.stmt)
        for stmt in a.stmt_parent:
            if a.stmt_scope.get(stmt) is not made.scope or not a.is_before(made.stmt, stmt):
                continue
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue  # compound statements: their own statements are visited
            mentioned = _mentions(ctx, stmt, keys)
            if not mentioned or rank0(stmt):
                continue
            small = stmt.body[0] if len(stmt.body) == 1 else None
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and _path_building(a, small.value):
                name = _key(small.targets[0].target)
                if name:
                    keys.add(name)
                continue
            if all(_inside_any(ctx, node, devnulled) for node in mentioned):
                continue
            if any(c.stmt is stmt and (file_path_use(a, c) or (True,))[0] is False for c in a.calls):
                continue  # a read of a file (torch.load, np.load, open): DST306 waits for what rank 0 wrote
            chain = (*a.stmt_parent.get(stmt, ()), stmt)
            k = 0
            while k < min(len(chain), len(made_chain)) and chain[k] is made_chain[k]:
                k += 1
            if k >= len(chain):
                return
            anchor = chain[k]
            if follows_barrier(chain[k - 1] if k else made.scope, anchor):
                return
            call = f"{ctx.hvd}.barrier()" if ctx.backend == HOROVOD_BACKEND else f"{ctx.dist}.barrier()"
            ctx.edits.insert_before(anchor, ctx.stmts(f"{call}  # every rank waits for the directory rank 0 creates"))
            ctx.report(
                self.code,
                stmt,
                f"{call} before this statement: it uses {ctx.code(made.call.args[0].value) if made.call.args else 'the directory'}, "
                "which rank 0 creates",
            )
            return


def _key(expr) -> str:
    """A comparable spelling of a path expression: a dotted name, or a string literal."""
    if isinstance(expr, cst.SimpleString):
        v = expr.evaluated_value
        return f"str:{v.rstrip('/')}" if isinstance(v, str) and v else None
    return dotted(expr)


def _mentions(ctx: Context, stmt, keys) -> list:
    """The expressions in `stmt` that spell one of `keys`."""
    found = []

    class V(cst.CSTVisitor):
        def visit_Attribute(self, node):
            if dotted(node) in keys:
                found.append(node)
                return False
            return True

        def visit_Name(self, node):
            if node.value in keys:
                found.append(node)

        def visit_SimpleString(self, node):
            v = node.evaluated_value
            if isinstance(v, str) and any(k.startswith("str:") and (v == k[4:] or v.startswith(k[4:] + "/")) for k in keys):
                found.append(node)

    walk(stmt, V())
    return found


PATH_CALLS = {"os.path.join", "os.path.abspath", "os.path.expanduser", "pathlib.Path", "str"}


def _path_building(a, expr) -> bool:
    """An expression that only spells a path (joins, f-strings, `/`, `+`): it touches no file."""
    ok = True

    class V(cst.CSTVisitor):
        def visit_Call(self, node):
            nonlocal ok
            q = a.qualname(node.func) or dotted(node.func)
            if q not in PATH_CALLS:
                ok = False

    walk(expr, V())
    return ok


def _inside_any(ctx: Context, node, calls) -> bool:
    """`node` sits in the arguments of one of `calls` (the writes opened on os.devnull elsewhere)."""
    for call in calls:
        found = []

        class V(cst.CSTVisitor):
            def on_visit(self, n):
                if n is node:
                    found.append(n)
                return not found

        walk(call, V())
        if found:
            return True
    return False


RULE = Rank0Filesystem()


def _pathlib_object(a, expr: cst.BaseExpression) -> bool:
    """`Path(out)`, `(Path(out) / "x")`, or a name bound to one: pathlib's object (its `mkdir` makes
    a directory), known by what `Path` resolves to, not by how the source spells it."""
    made = {id(c.call) for c in a.calls if (c.qualname or "").startswith("pathlib.")}

    def builds(e: cst.CSTNode) -> bool:
        return any(id(n) in made for n in all_nodes(e))

    if builds(expr):
        return True
    names = {dotted(n) for n in all_nodes(expr) if isinstance(n, (cst.Name, cst.Attribute))} - {None}
    return any(
        len(asg.targets) == 1 and dotted(asg.targets[0].target) in names and builds(asg.value)
        for asg, _stmt, _scope, _cls in a.facts.assigns
    )


def _devnull(a, expr: cst.BaseExpression) -> bool:
    """The path is `os.devnull` (distify's own `open(path if main else os.devnull, "w")`)."""
    return any(isinstance(n, cst.Attribute) and a.qualname(n) == "os.devnull" for n in all_nodes(expr))
