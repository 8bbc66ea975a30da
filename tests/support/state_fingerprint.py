"""A plain-value view of a whole ``StreamState``, extensions included, for tests that compare states.

Derived from the objects' own fields, not from a list written here: a field
added to any class later is compared without anyone remembering to add it.
Classes name what is not journal state in ``SOFT_STATE`` (a TTL-touch throttle,
member liveness, the shell's bookkeeping); those fields are left out, as are
callables.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from array import array
from typing import Any

import msgspec

from tiered.engine.streams.state import StreamState


def fingerprint(state: StreamState) -> Any:
    """Everything the state (and every extension state machine) means, as plain values."""
    return _plain(state)


def _fields(obj: Any) -> list[str]:
    if isinstance(obj, msgspec.Struct):
        return list(obj.__struct_fields__)
    if dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj)]
    names: list[str] = []
    for cls in type(obj).__mro__:
        names.extend(getattr(cls, "__slots__", ()))
    names.extend(getattr(obj, "__dict__", {}))
    return list(dict.fromkeys(names))


def _plain(obj: Any) -> Any:
    if obj is None or isinstance(obj, bool | int | float | str | bytes):
        return obj
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, array):
        return list(obj)
    if isinstance(obj, re.Pattern):
        return obj.pattern
    if isinstance(obj, dict):
        return {repr(_plain(k)): _plain(v) for k, v in sorted(obj.items(), key=lambda kv: repr(kv[0]))}
    if isinstance(obj, list | tuple):
        return [_plain(x) for x in obj]
    if isinstance(obj, set | frozenset):
        return sorted((_plain(x) for x in obj), key=repr)
    if callable(obj) and not (dataclasses.is_dataclass(obj) or isinstance(obj, msgspec.Struct)):
        return None
    soft = set(getattr(type(obj), "SOFT_STATE", ()))
    out = {"__type__": type(obj).__name__}
    for name in _fields(obj):
        if name in soft or name.startswith("__"):
            continue
        value = getattr(obj, name, None)
        if callable(value) and not (dataclasses.is_dataclass(value) or isinstance(value, msgspec.Struct)):
            continue
        out[name] = _plain(value)
    return out
