"""DST304 directories and files are managed by rank 0."""

from __future__ import annotations

from distify.anatomy import MAKEDIRS
import libcst as cst

from distify.anatomy import arg
from distify.rules.base import Context, Rule, call_statement

FILE_WRITES = {
    "numpy.save", "numpy.savetxt", "numpy.savez", "numpy.savez_compressed",
    "json.dump", "pickle.dump", "yaml.dump", "yaml.safe_dump", "matplotlib.pyplot.savefig",
}


class Rank0Filesystem(Rule):
    """Create, copy, remove and write files from the main process only.

    What it does:
        Puts ``os.makedirs``/``os.mkdir``, ``shutil`` copy/move/rmtree statements,
        ``Path(...).mkdir(...)``, result writers (``np.save``/``np.savetxt``, ``json.dump``,
        ``pickle.dump``, ``df.to_csv``, ``plt.savefig``) under the main-process guard, and makes
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
        for site in a.calls:
            is_fs = site.qualname in MAKEDIRS or (
                site.qualname is None
                and hasattr(site.call.func, "attr")
                and site.call.func.attr.value == "mkdir"
                and "Path" in ctx.code(site.call.func)
            )
            is_fs = is_fs or site.qualname in FILE_WRITES or (
                site.qualname is None
                and isinstance(site.call.func, cst.Attribute)
                and site.call.func.attr.value in ("to_csv", "to_json", "to_parquet", "savefig")
            )
            if not is_fs or not call_statement(site.stmt, site.call) or ctx.in_rank_guard(site.stmt):
                continue
            if ctx.guard_statement(site.stmt):
                ctx.report(self.code, site.call, f"{ctx.code(site.call.func)} runs on the main process only")
        for site in a.calls:
            if not (isinstance(site.call.func, cst.Name) and site.call.func.value == "open" and site.qualname is None):
                continue
            mode = arg(site.call, 1, "mode")
            path = arg(site.call, 0, "file")
            if mode is None or path is None or not isinstance(mode.value, cst.SimpleString):
                continue
            if not set(str(mode.value.evaluated_value)) & set("wax") or "devnull" in ctx.code(path.value):
                continue
            if ctx.in_rank_guard(site.stmt):
                continue
            os_name = ctx.imported("os", None, "os")
            cond = ctx.main_process
            ctx.edits.replace(
                path.value,
                lambda n, cond=cond, os_name=os_name: cst.IfExp(
                    test=cst.parse_expression(cond), body=n, orelse=cst.parse_expression(f"{os_name}.devnull")
                ),
            )
            ctx.report(self.code, site.call, "file written by the main process only (os.devnull elsewhere)")


RULE = Rank0Filesystem()
