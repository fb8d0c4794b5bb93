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

from typing import Collection, FrozenSet, Optional

import libcst as cst

from distify.library import FILE_METHODS, SAVE_METHODS


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
