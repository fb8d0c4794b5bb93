"""Plain classes for the values and records a run builds, without the dataclass machinery.

``@dataclass`` writes each method it generates as source text and compiles it with ``exec`` when
the class is defined: 1.5 to 4 M instructions a class (a frozen one the most), about 110 M of a
cold one-file ``--check`` for the 36 classes its modules defined (bench P6). The classes of the
run's path are written out instead, on one of two bases:

* ``Value``: immutable, equal and hashed by its fields, as a frozen dataclass is. The fields are
  the class's ``__slots__``, in the order of its ``__init__``'s parameters (``replace``, ``repr``
  and pickling rely on that order; tests/test_values.py holds every subclass to it). ``__init__``
  stores them with ``_set``; assigning to a field afterwards raises ``AttributeError``.
* ``Record``: mutable, compared by identity (a dataclass with ``eq=False``): the records of one
  analysis, each held where it was found. Its ``__slots__`` name the fields its ``__init__``
  takes, in order (stored with ``_set``), then any it sets itself, and end with ``"__dict__"``:
  a record may carry more than its fields, as the dataclass could.

Import-light: nothing but the standard library.
"""

from __future__ import annotations

from typing import Any, Tuple, TypeVar

V = TypeVar("V", bound="Value")
_set_field = object.__setattr__


class Value:
    """An immutable value compared and hashed by its fields (its ``__slots__``)."""

    __slots__: Tuple[str, ...] = ()

    def _set(self, *values: Any) -> None:
        """Store `values` as the fields, in ``__slots__`` order (``__init__`` only)."""
        for name, value in zip(self.__slots__, values):
            _set_field(self, name, value)

    def _values(self) -> Tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self.__slots__])

    def replace(self: V, **changes: Any) -> V:
        """A copy with some fields changed (what ``dataclasses.replace`` does for a dataclass)."""
        for name in self.__slots__:
            if name not in changes:
                changes[name] = getattr(self, name)
        return self.__class__(**changes)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a {type(self).__name__}")

    def __reduce__(self):  # pickle and copy: the class and its fields, through __init__
        return self.__class__, self._values()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"


class Record:
    """A mutable record compared by identity; ``repr`` shows its fields."""

    __slots__ = ()

    def _set(self, *values: Any) -> None:
        """Store `values` as the first fields, in ``__slots__`` order (``__init__`` only)."""
        for name, value in zip(self.__slots__, values):
            setattr(self, name, value)

    def __repr__(self) -> str:
        fields = [(n, getattr(self, n)) for n in self.__slots__ if n != "__dict__" and hasattr(self, n)]
        fields += getattr(self, "__dict__", {}).items()
        return f"{type(self).__name__}({', '.join(f'{n}={v!r}' for n, v in fields)})"
