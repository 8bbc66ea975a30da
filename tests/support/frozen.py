"""A check that an engine's parts are wired by their constructors only: nothing sets an attribute on a
part from outside it, during composition, after start, or while it serves.

``outside_assignments(classes)`` patches each class's ``__setattr__`` for the
duration of a ``with`` block: an assignment whose caller is not a method of
that very object (its frame's ``self``) is recorded as (class, attribute,
file:line). A part's own ``__init__``, its methods and its base classes'
methods set its attributes freely; another object doing it is the wiring by
attribute issue 19 removed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: Engine attributes that are state or data, not parts wired to each other.
NOT_PARTS = frozenset({"config", "clock", "state", "hooks", "extensions", "store", "claim"})


def part_classes(engine: Any) -> list[type]:
    """The classes of a composed engine's parts (its attributes whose class is tiered's)."""
    out: dict[str, type] = {}
    for name, value in vars(engine).items():
        if name.startswith("_") or name in NOT_PARTS:
            continue
        cls = type(value)
        if cls.__module__.startswith("tiered."):
            out[cls.__qualname__] = cls
    return sorted(out.values(), key=lambda c: c.__qualname__)


@contextmanager
def outside_assignments(classes: Iterable[type]) -> Iterator[list[str]]:
    seen: list[str] = []
    patched: list[tuple[type, Any]] = []
    for cls in classes:
        original = cls.__dict__.get("__setattr__")
        setter = cls.__setattr__

        def checked(self: Any, name: str, value: Any, _setter: Any = setter, _cls: type = cls) -> None:
            caller = sys._getframe(1)
            if caller.f_locals.get("self") is not self:
                where = f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}"
                seen.append(f"{_cls.__qualname__}.{name} set from {where}")
            _setter(self, name, value)

        patched.append((cls, original))
        cls.__setattr__ = checked  # type: ignore[method-assign,assignment]
    try:
        yield seen
    finally:
        for cls, original in reversed(patched):
            if original is None:
                del cls.__setattr__  # type: ignore[misc]
            else:
                cls.__setattr__ = original  # type: ignore[method-assign]
