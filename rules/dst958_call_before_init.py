"""DST958 Horovod or torch.distributed used before the process group exists."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import Anatomy
from distify.records import INIT_PG
from distify.rules.base import AuditCheck, Context

HVD_INIT = {"horovod.torch.init"}
# torch.distributed calls that are fine before init_process_group
SAFE = {"is_available", "is_initialized", "is_torchelastic_launched", "get_default_backend_for_device", "Backend"}


class CallBeforeInit(AuditCheck):
    """Nothing calls ``hvd.*`` (or a ``torch.distributed`` collective) before the group exists.

    What it does:
        Part of the output audit (and of ``distify lint``). Reports a ``horovod.torch`` call made
        before ``hvd.init()`` – earlier in the same function, or at module level when ``hvd.init()``
        runs inside a function – and likewise a
        ``torch.distributed`` call (other than ``is_available``/``is_initialized``) before
        ``init_process_group``. A script that initialises elsewhere (no init call in the file)
        and calls under an ``is_initialized()`` test are not reported.

    Why:
        ``hvd.rank()``, ``hvd.size()`` and every collective raise "Horovod has not been
        initialized" (``dist.get_rank()``: "Default process group has not been initialized") –
        or, at module level, fail at import on every rank before training starts.

    Example:
        device = torch.device("cuda", hvd.local_rank())   # DST958
        hvd.init()

        fix: call hvd.init() first, at the start of the entry point
    """

    code = "DST958"
    name = "call-before-init"
    summary = "audit: hvd.* or torch.distributed used before init"

    def check(self, ctx: Context, a: Anatomy) -> None:
        for prefix, inits, label in (
            ("horovod.torch.", HVD_INIT, "hvd.init()"),
            ("torch.distributed.", INIT_PG, "init_process_group()"),
        ):
            init_sites = a.calls_to(inits)
            for c in a.calls:
                q = c.qualname or ""
                if not q.startswith(prefix) or q in inits or q.count(".") != prefix.count("."):
                    continue
                if q.rsplit(".", 1)[-1] in SAFE:
                    continue
                if _before(a, c, init_sites):
                    ctx.warn(
                        self.code,
                        c.call,
                        f"{ctx.code(c.call.func)}() runs before {label}: it fails there; call {label} first, "
                        "at the start of the entry point",
                    )


def _before(a: Anatomy, c, inits) -> bool:
    if not inits or _checks_initialized(a, c):
        return False  # initialised elsewhere (another module), or tested at run time
    for i in inits:
        if i.scope is c.scope:
            return a.is_before(c.stmt, i.stmt) and c.stmt is not i.stmt
    # module-level code runs at import, before any function that initialises
    return isinstance(c.scope, cst.Module) and c.cls is None and all(isinstance(i.scope, cst.FunctionDef) for i in inits) and not _in_main_guard(a, c)


def _checks_initialized(a: Anatomy, c) -> bool:
    """The call runs only once the script has asked `is_initialized()` (around it, or in an early
    return of its function)."""
    scope = c.scope
    tests = [p.test for p in c.parents if isinstance(p, (cst.If, cst.While))]
    if isinstance(scope, cst.FunctionDef):
        tests += [s.test for s in scope.body.body if isinstance(s, cst.If) and a.is_before(s, c.stmt)]
    return any("is_initialized" in a.module.code_for_node(t) for t in tests)


def _in_main_guard(a: Anatomy, c) -> bool:
    return any(
        isinstance(p, cst.If) and "__name__" in a.module.code_for_node(p.test) for p in (*c.parents, c.stmt)
    )


RULE = CallBeforeInit()
