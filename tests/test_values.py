"""distify.values: the plain classes that stand for dataclasses on a run's path.

A ``Value`` must behave as the frozen dataclass it replaced: equal and hashed by its fields, not
assignable, copied by ``replace``, pickled (results travel to and from the worker processes); a
``Record`` is compared by identity. Every ``Value`` subclass keeps its ``__init__`` parameters in
the order of its ``__slots__``, which ``replace``, ``repr`` and pickling rely on.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import pickle
import pkgutil

import pytest

import distify
import distify.rules
from distify.engine import FileResult, Status
from distify.findings import Finding
from distify.options import Options
from distify.values import Record, Value


def _every_subclass(base: type) -> list:
    for package in (distify, distify.rules):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if info.name.startswith(("distify.runtime", "distify._probe")):
                continue  # torch's side: never imports the migration tool
            importlib.import_module(info.name)
    out, todo = [], [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            out.append(sub)
            todo.append(sub)
    return out


def test_every_value_takes_its_fields_in_slot_order():
    values = _every_subclass(Value)
    assert {Finding, Options, FileResult} <= set(values)
    for cls in values:
        params = list(inspect.signature(cls.__init__).parameters)[1:]
        assert tuple(params) == cls.__slots__, cls.__qualname__


def test_every_record_takes_its_first_fields_in_slot_order():
    records = _every_subclass(Record)
    assert len(records) > 10
    for cls in records:
        params = tuple(inspect.signature(cls.__init__).parameters)[1:]
        slots = vars(cls).get("__slots__", ())
        assert slots[:len(params)] == params and (not slots or slots[-1] == "__dict__"), cls.__qualname__


def test_a_value_is_equal_hashed_and_copied_by_its_fields():
    f = Finding("DST201", 3, 5, "sampler added")
    same = Finding("DST201", 3, 5, "sampler added", "fix")
    assert f == same and hash(f) == hash(same) and len({f, same}) == 1
    assert f != Finding("DST201", 3, 6, "sampler added") and f != ("DST201", 3, 5, "sampler added", "fix")
    moved = f.replace(line=4)
    assert (moved.line, moved.code, f.line) == (4, "DST201", 3)
    assert copy.copy(f) == f and copy.deepcopy(f) == f
    with pytest.raises(TypeError):
        f.replace(lines=4)
    assert repr(f) == "Finding(code='DST201', line=3, col=5, message='sampler added', kind='fix')"


def test_a_value_cannot_be_changed():
    options = Options()
    with pytest.raises(AttributeError):
        options.backend = "fsdp"
    with pytest.raises(AttributeError):
        del options.backend
    with pytest.raises(AttributeError):
        options.other = 1
    assert options.backend == "ddp" and options.replace(backend="fsdp").backend == "fsdp"


def test_values_travel_to_worker_processes():
    result = FileResult("a.py", Status.CHANGED, (Finding("DST101", 1, 1, "wrapped"),), output=b"x", pending=True)
    back = pickle.loads(pickle.dumps(result))
    assert back == result and back.findings[0].message == "wrapped" and back.pending
    assert pickle.loads(pickle.dumps(Options(select=("DST2",)))) == Options(select=("DST2",))


def test_a_record_is_compared_by_identity():
    class R(Record):
        __slots__ = ("x", "__dict__")

        def __init__(self, x):
            self._set(x)

    a, b = R(1), R(1)
    a.extra = 2  # a record may carry more than its fields
    assert a != b and a == a and len({a, b}) == 2
    assert repr(a) == "R(x=1, extra=2)" and repr(b) == "R(x=1)"
