"""Which calls write files through a method of another library's object (part of the facts).

``model.save_pretrained(dir)`` writes a Hugging Face checkpoint, ``fig.savefig(path)`` an image:
distify knows those methods as the libraries' (``library.SAVE_METHODS``, ``library.FILE_METHODS``),
but a call ``x.m(...)`` reaches the library's ``m`` only when ``x`` is the library's object. When a
class of the script itself defines a method ``m`` (a local model class with its own
``save_pretrained``), the call may run the script's code: its writes are facts of their own, found
where they are (``torch.save``, ``open(..., "w")``) inside that method, and the call itself is not
taken for the library's write whatever the method is spelled.
"""

from __future__ import annotations

from typing import Collection, FrozenSet, Optional, Tuple

import libcst as cst

from distify.constructed import made_by
from distify.library import FILE_METHODS, FILE_PATHS, SAVE_METHODS, SCRIPTED_MODULES, names_of
from distify.names import qualname_or_builtin
from distify.records import SAVE
from distify.syntax import arg

PRINT_LIKE = names_of("print")  # tqdm.write, sys.stdout.write, pprint...: a print by another route


def per_rank_file(a, site, where: Optional[cst.BaseExpression] = None) -> bool:
    """The write `site` (a CallSite; `a` its Anatomy) goes to a file of this process's own: where it
    writes (`where`, the path, when the caller knows it; else every argument but the object
    ``torch.save`` pickles) names a rank or a value made from one, this process's device or id
    (``torch.save(state, f"ckpt_rank{rank}.pt")``). Each process then writes its own file: no
    duplicate, nothing to put on rank 0. The one notion the rules (DST301, DST304) and the audit
    (DST955) ask; data flow from the rank sources (``Anatomy.mentions_rank``), never spelling."""
    if where is not None:
        return a.mentions_rank(where)
    args = site.call.args[1:] if site.qualname in SAVE else site.call.args
    return any(a.mentions_rank(x.value) for x in args)


def own_method_names(methods: Collection[cst.FunctionDef]) -> FrozenSet[str]:
    """The names of the methods the script's classes define."""
    return frozenset(m.name.value for m in methods)


def library_method_write(call: cst.Call, own: Collection[str], checkpoints_only: bool = True) -> Optional[str]:
    """The library method ``call`` writes a file through (``save_pretrained``), else None: a method of
    a library object that writes a checkpoint (``checkpoints_only``) or any file, which no class of the
    script overrides."""
    f = call.func
    if not isinstance(f, cst.Attribute):
        return None
    m = f.attr.value
    known = SAVE_METHODS if checkpoints_only else SAVE_METHODS | FILE_METHODS
    return m if m in known and m not in own else None


def file_write(site, own: Collection[str]) -> Optional[str]:
    """What file write the call `site` (a CallSite) is, as a reader names it (``save()``,
    ``.savefig()``, ``open(..., 'w')``), else None: a library save (``distify.audit.SAVES``), a
    library object's file-writing method no class of the module overrides, or ``open`` for writing."""
    from distify.audit import SAVES  # here: distify.audit imports this module

    call = site.call
    if site.qualname in SAVES:
        return site.qualname.rsplit(".", 1)[-1] + "()"
    f = call.func
    method = library_method_write(call, own, checkpoints_only=False) if site.qualname is None else None
    if method is not None:
        return f".{method}()"
    if isinstance(f, cst.Name) and f.value == "open" and site.qualname is None:
        mode = arg(call, 1, "mode")
        if mode is not None and isinstance(mode.value, cst.SimpleString):
            m = mode.value.evaluated_value
            if isinstance(m, str) and any(k in m for k in "wax"):
                return "open(..., " + repr(m) + ")"
    return None


def terminal_print(site) -> bool:
    """The call `site` prints to the terminal: the builtin ``print`` or another route to it."""
    q = site.qualname
    return (q is None and isinstance(site.call.func, cst.Name) and site.call.func.value == "print") or q in PRINT_LIKE



def file_path_use(a, site) -> Optional[Tuple[bool, cst.Arg]]:
    """(whether it writes, the argument naming the file) of a call `site` (a CallSite; `a` its
    Anatomy) that writes or reads one file: a library call (``library.FILE_PATHS``, by qualified
    name) or the builtin ``open`` with a literal mode (none: it reads). None for any other call, and
    for an ``open`` whose mode is computed."""
    call = site.call
    q = qualname_or_builtin(a, call.func)
    row = FILE_PATHS.get(q) if q is not None else None
    if row is not None:
        where = arg(call, row.position, row.keyword)
        return None if where is None or where.star else (row.writes, where)
    if scripted_save(a, site):
        where = arg(call, 0, "f")
        return None if where is None or where.star else (True, where)
    if q != "builtins.open":
        return None
    where, mode = arg(call, 0, "file"), arg(call, 1, "mode")
    if where is None or where.star:
        return None
    if mode is None:
        return False, where
    m = mode.value.evaluated_value if isinstance(mode.value, cst.SimpleString) else None
    if not isinstance(m, str):
        return None
    return bool(set(m) & set("wax")), where


def scripted_save(a, site) -> bool:
    """The call `site` is ``m.save(path)`` on a TorchScript module (``m = torch.jit.trace(...)``,
    ``torch.jit.script``, ``torch.jit.load``: ``library.SCRIPTED_MODULES``), which writes the file."""
    f = site.call.func
    return (site.qualname is None and isinstance(f, cst.Attribute) and f.attr.value == "save"
            and made_by(a.facts, site.scope, f.value, SCRIPTED_MODULES) is not None)
