"""What a rule reports; import-light (no libcst), so that results replayed from the cache
(``distify.cache``) are reported without parsing anything."""

from __future__ import annotations

from distify.values import Value


class Finding(Value):
    """One line of the report: a change made (``fix``) or a problem left alone (``warning``)."""

    __slots__ = ("code", "line", "col", "message", "kind")
    code: str
    line: int
    col: int
    message: str
    kind: str  # fix | warning | info | note (why a file is left as it is: printed without -v, never an error)

    def __init__(self, code: str, line: int, col: int, message: str, kind: str = "fix") -> None:
        self._set(code, line, col, message, kind)

    def format(self, path: str) -> str:
        return f"{path}:{self.line}:{self.col}: {self.code} {self.message}"
