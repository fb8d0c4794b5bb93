"""Run a script as ``__main__`` in a process just forked from a warm parent (torch already imported).

One definition, used by the goldens runner (run_scripts.py) and by the warm launcher (warm_ranks.py):
the child becomes what ``python SCRIPT ARGS`` would be, as far as the script can tell, except that
the modules the parent imported are already loaded:

- its working directory, environment (replaced whole when ``env`` is given), ``sys.argv`` and
  ``sys.path[0]`` (the script's folder) are those of a fresh interpreter started there;
- when an environment is given, its ``PYTHONPATH`` entries go on ``sys.path`` after the script's
  folder, and a ``sitecustomize`` found there is imported first, as the interpreter's ``site`` module
  does (the tests' spies are such files);
- stdout and stderr are the given files, unbuffered (``PYTHONUNBUFFERED=1``), stdin is /dev/null;
- ``tempfile`` finds its folder again from the new environment (TMPDIR), as a new interpreter would;
- the RNGs a fresh process seeds from the OS (torch's default generator, numpy's global state;
  Python's ``random`` reseeds itself on fork) are reseeded, so ranks do not share a stream a real
  launch would not share (an unseeded model initialisation differs between ranks, as it does there);
- the script runs in a ``__main__`` module that lives until the process ends (its globals are
  still there when atexit handlers run, as at a real interpreter's exit);
- at the end, non-daemon threads are joined and atexit handlers run, as at interpreter exit; then
  the process ends with the script's exit status without running C++ static destructors.

Standard library only; nothing here knows about distify.
"""
from __future__ import annotations

import io
import os
import signal
import sys
import traceback


def _redirect(fd: int, path: str) -> None:
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _text_stream(fd: int):
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                            write_through=True, line_buffering=True)


def _reseed_from_os() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()  # a fresh interpreter seeds torch's default generator from the OS at start
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed(int.from_bytes(os.urandom(4), "little"))
        except Exception:  # noqa: BLE001 - an odd numpy: leave it as it is
            pass


def _load_sitecustomize(pythonpath: list) -> None:
    for folder in pythonpath:
        if os.path.isfile(os.path.join(folder, "sitecustomize.py")):
            sys.modules.pop("sitecustomize", None)
            import importlib

            importlib.import_module("sitecustomize")
            return


def _exec_as_main(script: str) -> None:
    """The script's code run in a module that is ``sys.modules["__main__"]`` for the rest of the
    process, as the interpreter runs it: its globals (the model, the optimizer) are still alive when
    the atexit handlers run (``runpy.run_path`` would drop its temporary module first)."""
    import builtins
    import importlib.machinery
    import types

    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    main.__spec__ = None
    main.__cached__ = None
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    with open(script, "rb") as fh:
        code = compile(fh.read(), script, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def run_as_main(script: str, argv=(), cwd: str = None, stdout: str = None, stderr: str = None,
                env: dict = None, syspath: str = None) -> None:
    """Never returns: runs ``script`` with ``argv`` as ``__main__`` and ends the process."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    if cwd:
        os.chdir(cwd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if stdout:
        _redirect(1, stdout)
    if stderr or stdout:
        _redirect(2, stderr or stdout)
    sys.stdout = sys.__stdout__ = _text_stream(1)
    sys.stderr = sys.__stderr__ = _text_stream(2)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
        if "tempfile" in sys.modules:
            sys.modules["tempfile"].tempdir = None  # a new interpreter reads TMPDIR from its environment
    sys.argv = [script, *map(str, argv)]
    # A new environment is a new interpreter's: its PYTHONPATH and sitecustomize are taken here. Without
    # one, the parent's own start-up already took them.
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] if env is not None else []
    sys.path[:] = [syspath or os.path.dirname(os.path.abspath(script))] + extra + [
        p for p in sys.path[1:] if p not in extra]
    _reseed_from_os()
    code = 0
    try:
        _load_sitecustomize(extra)
        _exec_as_main(script)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)  # as the interpreter does for sys.exit("message")
    except BaseException:  # noqa: BLE001 - reported through the exit status, as the interpreter does
        traceback.print_exc()
        code = 1
    try:
        import threading

        threading._shutdown()  # join non-daemon threads, as interpreter exit does
    except Exception:  # noqa: BLE001
        pass
    try:
        import atexit

        atexit._run_exitfuncs()  # the runtime's process-group cleanup runs as at a real exit
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF if code >= 0 else 1)
