"""What a rule reports; import-light (no libcst), so that results replayed from the cache
(``distify.cache``) are reported without parsing anything."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One line of the report: a change made (``fix``) or a problem left alone (``warning``)."""

    code: str
    line: int
    col: int
    message: str
    # fix | warning | info | note (why a file is left as it is: printed without -v, never an error)
    kind: str = "fix"

    def format(self, path: str) -> str:
        return f"{path}:{self.line}:{self.col}: {self.code} {self.message}"
