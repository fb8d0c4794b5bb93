"""The options every ``distify`` command shares, defined once so that they are spelled, shown and
meant alike in ``distify``, ``distify lint`` and ``distify verify``.

- ``--backend/-b [ddp|horovod|fsdp]``: the backend the scripts are (to be) distributed with; the
  default is ``backend`` in ``[tool.distify]``, then each command's own (ddp, or for ``lint`` the
  backend the script itself uses).
- ``--select`` / ``--ignore CODES``: rule and check codes by prefix, comma-separated or repeated;
  the default is ``select`` / ``ignore`` in ``[tool.distify]``.
- ``-q/--quiet``: report errors only. ``-v/--verbose``: also report what had nothing to report.
- ``--json``: the report as one JSON document on stdout, for CI.

The choices and value names are given here as metavars (typer 0.29 would show raw type names such
as ``<list[str]>``); the values themselves are checked by the commands, with the same message
whichever parser read them (``distify.runner`` parses a plain run without typer).
"""

from __future__ import annotations

import typer

from distify.options import BACKENDS

BACKEND_METAVAR = "[" + "|".join(BACKENDS) + "]"
CODES = "CODES"


def backend(default_is: str):
    return typer.Option(None, "--backend", "-b", metavar=BACKEND_METAVAR,
                        help=f"DDP, Horovod or FSDP2 (fully_shard). Default: [tool.distify] backend, else {default_is}.")


def select():
    return typer.Option(None, "--select", metavar=CODES,
                        help="Only the rules and checks whose code starts with one of these prefixes (comma-separated). Default: [tool.distify] select.")


def ignore():
    return typer.Option(None, "--ignore", metavar=CODES,
                        help="Skip the rules and checks whose code starts with one of these prefixes (comma-separated). Default: [tool.distify] ignore.")


def quiet():
    return typer.Option(False, "--quiet", "-q", help="Report errors only.")


def verbose():
    return typer.Option(False, "--verbose", "-v", help="Also report the files with nothing to report, and why.")


def as_json():
    return typer.Option(False, "--json", help="Print the report as one JSON document on stdout (for CI).")
