"""The one way untrusted text becomes numbers, flags and JSON: strict, bounded, 400 otherwise.

Every header, query parameter and JSON body field goes through here, so
"``²``", "``①``", "``٣``" or "``３``" are never numbers (``str.isdigit`` and
``int()`` accept them), an integer never exceeds the range its field documents
(and never reaches the journal's 64-bit encoding), nesting a JSON body 100,000
levels deep is a 400, and an unknown flag value is refused rather than taken
for "false".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import msgspec

from tiered.core.errors import ErrorCode, TieredError

MAX_SAFE_INTEGER = 2**53 - 1  # what every JSON client can represent exactly
UINT_RE = re.compile(r"0|[1-9][0-9]*")  # [0-9], not \d: no other scripts' digits

# Body fields: non-negative integers no larger than JSON clients represent exactly.
UInt = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INTEGER)]

T = TypeVar("T")


def parse_uint(
    value: str, name: str, *, maximum: int = MAX_SAFE_INTEGER, code: ErrorCode = ErrorCode.BAD_REQUEST
) -> int:
    """A non-negative decimal integer: ASCII digits, no sign, no leading zeros, at most ``maximum``."""
    if len(value) > 20 or not UINT_RE.fullmatch(value):
        raise TieredError(code, f"{name} must be a non-negative decimal integer, got {value[:40]!r}")
    n = int(value)
    if n > maximum:
        raise TieredError(code, f"{name} must be at most {maximum}")
    return n


def query_uint(
    query: Mapping[str, str],
    name: str,
    *,
    maximum: int = MAX_SAFE_INTEGER,
    code: ErrorCode = ErrorCode.BAD_REQUEST,
) -> int | None:
    raw = query.get(name)
    return None if raw is None else parse_uint(raw, f"query parameter {name}", maximum=maximum, code=code)


def query_flag(query: Mapping[str, str], name: str) -> bool:
    """``true``/``1`` or ``false``/``0`` (absent: false); anything else is refused, never guessed."""
    raw = query.get(name)
    if raw is None:
        return False
    lowered = raw.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise TieredError(
        ErrorCode.BAD_REQUEST, f"query parameter {name} must be true or false, got {raw[:40]!r}"
    )


def decode_json(raw: bytes, *, code: ErrorCode = ErrorCode.BAD_REQUEST) -> Any:
    """Untyped JSON (nesting bounded by the decoder's recursion limit)."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise TieredError(code, f"invalid JSON body: {exc}") from None


def decode_body(raw: bytes, kind: type[T], *, code: ErrorCode = ErrorCode.BAD_REQUEST) -> T:
    """A JSON body of a known shape: unknown fields, wrong types and out-of-range numbers are 400."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise TieredError(code, f"invalid request body: {exc}") from None


def int_field(
    value: object,
    name: str,
    *,
    minimum: int = 0,
    maximum: int = MAX_SAFE_INTEGER,
    code: ErrorCode = ErrorCode.BAD_REQUEST,
) -> int:
    """A JSON integer field (an integral float like ``5.0`` counts; booleans do not)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise TieredError(code, f"{name} must be an integer from {minimum} to {maximum}")
    return value
