"""DST002 device per local rank."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from distify.records import DEVICE
from distify.syntax import arg
from distify.meaning import device_name, device_param
from distify.rules.base import Context, Rule, binds_locally


class LocalRankDevice(Rule):
    """Use the local rank's device instead of a fixed one.

    What it does:
        Rewrites ``torch.device("cuda")``, ``torch.device("cuda:0")``,
        ``torch.device("cuda" if torch.cuda.is_available() else "cpu")`` to ``runtime.device()``,
        the same conditional as a plain string to ``runtime.device().type`` (still the string
        "cuda" or "cpu", now naming the local rank's GPU, which ``runtime.device()`` makes current),
        and ``x.cuda()`` to ``x.to(device)``.

    Why:
        With N processes on one machine every process must use its own GPU – ``cuda:<local_rank>``
        – or all of them pile onto GPU 0. ``runtime.device()`` also calls
        ``torch.cuda.set_device`` and falls back to the CPU when there is no GPU.

    Example:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

        becomes

        device = runtime.device()
    """

    code = "DST002"
    name = "local-rank-device"
    summary = "pick the local rank's device"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        entry_scope = entry_scope_of(a)
        # the entry's device variable, by what it is bound to; a variable spelled `device` bound to
        # something else (`args.device`) is still the name a new `device = ...` would collide with
        dev_name = device_name(a, entry_scope) or ("device" if binds_locally(a, entry_scope, "device") else None)
        device_bound_in_entry = dev_name is not None

        # torch.device(...) constructions and the "cuda if available" string idiom
        for site in a.calls:
            if site.qualname in DEVICE:
                cond = _device_condition(ctx, site.call)
                if cond is None:
                    continue
                new = f"{ctx.runtime}.device()" if cond == "" else f"{ctx.runtime}.device({cond})"
                ctx.edits.replace(site.call, lambda n, new=new: cst.parse_expression(new))
                ctx.report(self.code, site.call, f"device is now the local rank's: {new}")
        for node, stmt in _string_device_idioms(a):
            # the idiom is a str, and stays one: `torch.autocast(device_type=device)` and
            # `device == "cuda"` want "cuda"/"cpu". runtime.device() makes the local rank's GPU the
            # current one, so "cuda" means that GPU; "cuda:0" names it with its index
            if _string_value(node.body) == "cuda":
                new = f"{ctx.runtime}.device().type"
            else:
                new = f"str({ctx.runtime}.device())"
            ctx.edits.replace(node, lambda n, new=new: cst.parse_expression(new))
            ctx.report(self.code, node, f"device is now the local rank's: {new} (a string, as before)")

        # x.cuda() -> x.to(device)
        cuda_calls = [
            s
            for s in a.calls
            if isinstance(s.call.func, cst.Attribute)
            and s.call.func.attr.value == "cuda"
            and s.qualname is None
            and _cuda_args_ok(s.call)
        ]
        if not cuda_calls:
            return
        need_device_var = any(s.scope is entry_scope for s in cuda_calls) and not device_bound_in_entry
        if need_device_var and ctx.plan.setup_anchor is not None:
            ctx.edits.insert_before(ctx.plan.setup_anchor, ctx.stmts(f"device = {ctx.runtime}.device()"))
            dev_name, device_bound_in_entry = "device", True
        for s in cuda_calls:
            param = device_param(a, s.scope) if isinstance(s.scope, cst.FunctionDef) else None
            if device_bound_in_entry and _sees_entry_device(a, s.scope, entry_scope, dev_name):
                dev = dev_name
            elif param is not None:
                dev = param
            else:
                dev = f"{ctx.runtime}.device()"
            kwargs = [x for x in s.call.args if x.keyword is not None]

            def to_device(n: cst.Call, dev=dev, keep=len(kwargs)) -> cst.Call:
                func = n.func.with_changes(attr=cst.Name("to"))
                dev_arg = cst.Arg(value=cst.parse_expression(dev))
                rest = [x for x in n.args if x.keyword is not None]
                if rest:
                    dev_arg = dev_arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                return n.with_changes(func=func, args=[dev_arg, *rest])

            ctx.edits.replace(s.call, to_device)
            ctx.report(self.code, s.call, f".cuda() now moves to the local rank's device ({dev})")


def entry_scope_of(a) -> cst.CSTNode:
    owner = a.entry_owner
    if isinstance(owner, cst.FunctionDef):
        return owner
    return a.module


def _sees_entry_device(a, scope, entry_scope, name: str) -> bool:
    if scope is entry_scope:
        return True
    if isinstance(entry_scope, cst.Module) and isinstance(scope, cst.FunctionDef):
        return not binds_locally(a, scope, name)
    return False


def _is_cuda_available(ctx: Context, expr: cst.BaseExpression) -> bool:
    return (
        isinstance(expr, cst.Call)
        and ctx.anatomy.qualname(expr.func) == "torch.cuda.is_available"
        and not expr.args
    )


def _string_value(expr: cst.BaseExpression) -> Optional[str]:
    if isinstance(expr, cst.SimpleString):
        return expr.evaluated_value if isinstance(expr.evaluated_value, str) else None
    return None


def _device_condition(ctx: Context, call: cst.Call) -> Optional[str]:
    """'' for an unconditional cuda device, the condition's source for `"cuda" if c else "cpu"`,
    None when the call is something else (cpu, cuda:N with N > 0, a variable)."""
    if len(call.args) != 1 or call.args[0].keyword is not None:
        return None
    v = call.args[0].value
    s = _string_value(v)
    if s in ("cuda", "cuda:0"):
        return ""
    if isinstance(v, cst.IfExp) and _string_value(v.body) in ("cuda", "cuda:0") and _string_value(v.orelse) == "cpu":
        return "" if _is_cuda_available(ctx, v.test) else ctx.code(v.test)
    return None


def _string_device_idioms(a):
    """`"cuda" if torch.cuda.is_available() else "cpu"` outside torch.device(...)."""
    out = []
    device_args = {id(c.call.args[0].value) for c in a.calls if c.qualname in DEVICE and c.call.args}

    class V(cst.CSTVisitor):
        def visit_IfExp(self, node: cst.IfExp) -> None:
            if id(node) in device_args:
                return
            if (
                _string_value(node.body) in ("cuda", "cuda:0")
                and _string_value(node.orelse) == "cpu"
                and isinstance(node.test, cst.Call)
                and a.qualname(node.test.func) == "torch.cuda.is_available"
            ):
                out.append((node, None))

    visitor = V()
    for node in a.ifexps:
        visitor.visit_IfExp(node)
    return out


def _cuda_args_ok(call: cst.Call) -> bool:
    """`.cuda()`, `.cuda(0)`, `.cuda(non_blocking=True)` – not `.cuda(1)` or `.cuda(some_var)`."""
    positional = [x for x in call.args if x.keyword is None]
    if not positional:
        return True
    if len(positional) == 1 and isinstance(positional[0].value, cst.Integer) and positional[0].value.value == "0":
        return True
    return False


RULE = LocalRankDevice()
