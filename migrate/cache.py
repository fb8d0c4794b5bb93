"""Files already found clean are not parsed again (as black and ruff keep a cache).

What is cached: the result of a file that came out **unchanged** (its output is its input), with the
warnings and the note the engine reported for it, and whether distify refused it (exit 3). Replaying them gives exactly what a fresh run
prints, also under ``--verbose`` (the note) and ``--strict`` (exit 2 on a cached warning). A file
that would change, or that fails (syntax error, undecodable, internal error), is never stored: it is
parsed on every run.

The key of an entry:
- the file's bytes (sha256): the path, size and mtime do not matter, an edit that restores the
  content finds its entry again;
- the bytes of every module of the user's project the file reaches through its imports
  (``distify.project``: the results of a script depend on its helper modules): an entry records
  each one's path and sha256, and is a miss as soon as one of them differs or is gone;
- the settings (one directory per settings hash): every field of ``Options`` (backend, select,
  ignore, each flag, standalone, positions, the size limit), distify's version, a fingerprint of
  distify's own code (path, size and mtime of every ``.py`` file of the ``distify`` and
  ``distify.rules`` packages, so that an editable install whose rules change gets a new cache while
  its version string stays the same), libcst's files and the Python version (its compiler judges
  the syntax).

Where: ``$DISTIFY_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/distify``, else ``~/.cache/distify``.
Each entry is a small JSON file written to a temporary file and renamed into place, so concurrent
runs (pre-commit starts several) never see half an entry; a file that cannot be read or parsed, or
that does not describe the content it is named after, is a miss, never an error. Writing errors
(read-only or full disk) are ignored. ``--no-cache`` turns it off. Settings folders nothing was
stored in for 30 days are removed when a new one is made.

Import-light: no libcst, typer or rich.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional, Tuple

from distify.findings import Finding
from distify.values import Value

# CPython's own SHA-256, which hashlib falls back to without OpenSSL: importing hashlib loads
# OpenSSL's libcrypto, a few ms of every run, cached or not; the digests are the same
try:
    from _sha2 import sha256  # Python 3.12+
except ImportError:
    try:
        from _sha256 import sha256  # Python 3.11 and earlier
    except ImportError:  # another Python implementation
        from hashlib import sha256

FORMAT = 3  # bump when the entry layout changes
ENV_DIR = "DISTIFY_CACHE_DIR"


def cache_root() -> str:
    env = os.environ.get(ENV_DIR)
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "distify")


def _package_dirs() -> list:
    """The folders of distify's migration code: ``distify``, ``distify.rules`` and
    ``distify.runtime``, whose source ``--standalone`` writes into scripts (separate folders in an
    editable install), found without importing them (the rules import libcst, the runtime torch)."""
    import importlib.util

    import distify

    dirs = [os.path.dirname(os.path.abspath(distify.__file__))]
    for package in ("distify.rules", "distify.runtime"):
        spec = importlib.util.find_spec(package)
        for d in (spec.submodule_search_locations or []) if spec else []:
            d = os.path.abspath(d)
            if not any(d == p or d.startswith(p + os.sep) for p in dirs):
                dirs.append(d)
    return dirs


def code_fingerprint() -> str:
    """A hash of what produces distify's output besides the options; computed once per run."""
    import distify

    h = sha256()
    h.update(f"distify {distify.__version__}\0python {sys.version}\0format {FORMAT}\0".encode())
    for top in _package_dirs():
        _hash_files(h, top, "")
    try:  # libcst's parser decides what parses and how; an upgrade rewrites its files
        import importlib.util

        spec = importlib.util.find_spec("libcst")
        origin = spec.origin if spec else None
        if origin:
            for name in ("__init__.py", "_version.py"):
                path = os.path.join(os.path.dirname(origin), name)
                if os.path.exists(path):
                    st = os.stat(path)
                    h.update(f"libcst/{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    except (ImportError, ValueError, OSError):
        h.update(b"libcst ?")
    return h.hexdigest()


def _hash_files(h, folder: str, prefix: str) -> None:
    """Path (from the package folder), size and mtime of each ``.py`` file under `folder`, in
    ``os.walk``'s order (a folder's files by name, then its folders by name); ``__pycache__`` and
    links to folders are not entered. One ``scandir`` a folder: this runs on every run, cached or not."""
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        if e.name.endswith(".py") and not e.is_dir():
            st = e.stat()
            h.update(f"{prefix}{e.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    for e in entries:
        if e.is_dir() and not e.is_symlink() and e.name != "__pycache__":
            _hash_files(h, e.path, f"{prefix}{e.name}{os.sep}")


def settings_key(options) -> str:
    """Every field of the options (a field added later is in the key without anyone thinking of it)."""
    items = [(name, repr(getattr(options, name))) for name in options.__slots__]
    return sha256(repr((code_fingerprint(), items)).encode()).hexdigest()[:32]


class Entry(Value):
    """The stored result of a file that came out unchanged, replayed as a fresh run would say it."""

    __slots__ = ("findings", "note", "encoding", "refused")
    findings: Tuple[Finding, ...]
    note: str
    encoding: str
    refused: bool  # distify refused the file (exit 3): a replay must say so too

    def __init__(self, findings: Tuple[Finding, ...], note: str, encoding: str, refused: bool = False) -> None:
        self._set(findings, note, encoding, refused)


class Cache(Value):
    """The entries for one settings key. Picklable (a folder name), for the worker processes."""

    __slots__ = ("directory",)
    directory: str

    def __init__(self, directory: str) -> None:
        self._set(directory)

    @classmethod
    def for_options(cls, options, root: Optional[str] = None) -> "Cache":
        return cls(os.path.join(root or cache_root(), settings_key(options)))

    @staticmethod
    def digest(source: bytes) -> str:
        return sha256(source).hexdigest()

    def get(self, source: bytes) -> Optional[Entry]:
        digest = self.digest(source)
        try:
            with open(os.path.join(self.directory, digest), "rb") as f:
                data = json.loads(f.read())
            if data["format"] != FORMAT or data["sha256"] != digest or data["size"] != len(source):
                return None
            if not all(isinstance(p, str) and _file_digest(p) == d for p, d in data["depends"]):
                return None  # a module of the project it reads has changed since
            findings = tuple(_finding(x) for x in data["findings"])
            note, encoding, refused = data["note"], data["encoding"], data["refused"]
            if not isinstance(note, str) or not isinstance(encoding, str) or not isinstance(refused, bool):
                return None
            return Entry(findings, note, encoding, refused)
        except (OSError, ValueError, KeyError, TypeError):  # missing, truncated, corrupt: a miss
            return None

    def put(self, source: bytes, findings, note: str, encoding: str, refused: bool = False, depends=()) -> None:
        """Store the result of a file that came out unchanged (the caller's promise); `depends`: the
        files of the project it was computed from (not stored when one cannot be read)."""
        digest = self.digest(source)
        deps = [[p, _file_digest(p)] for p in depends]
        if any(d is None for _, d in deps):
            return
        data = {
            "format": FORMAT, "sha256": digest, "size": len(source), "note": note, "encoding": encoding, "refused": refused,
            "findings": [[f.code, f.line, f.col, f.message, f.kind] for f in findings], "depends": deps,
        }
        import tempfile

        tmp = None
        try:
            if not os.path.isdir(self.directory):
                os.makedirs(self.directory, exist_ok=True)
                prune(os.path.dirname(self.directory), keep=self.directory)
            fd, tmp = tempfile.mkstemp(prefix=f".{digest[:16]}.", suffix=".tmp", dir=self.directory)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, os.path.join(self.directory, digest))
            tmp = None
        except OSError:  # a cache that cannot be written is no cache, never an error
            pass
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


def _file_digest(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return sha256(f.read()).hexdigest()
    except OSError:
        return None


STALE_DAYS = 30


def prune(root: str, keep: str, days: float = STALE_DAYS) -> None:
    """Remove settings folders nothing was stored in for ``days`` (an old distify version, an
    editable install's earlier code): run when a new settings folder is made, so rarely."""
    import shutil
    import time

    limit = time.time() - days * 86400
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        path = os.path.join(root, name)
        if path == keep or len(name) != 32 or not all(c in "0123456789abcdef" for c in name):
            continue  # only our own folders: DISTIFY_CACHE_DIR may point anywhere
        try:
            if os.path.isdir(path) and os.stat(path).st_mtime < limit:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def _finding(x) -> Finding:
    code, line, col, message, kind = x
    if not (isinstance(code, str) and isinstance(message, str) and isinstance(kind, str)
            and type(line) is int and type(col) is int):
        raise TypeError("bad finding")
    return Finding(code, line, col, message, kind)
