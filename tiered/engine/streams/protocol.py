"""Durable Streams header parsing and the small protocol rules around it.

Everything here is pure: it turns header strings into values or raises a
``BAD_REQUEST`` ``TieredError`` with a message a client developer can act on.
Integers go through ``tiered.core.parsing.parse_uint`` (ASCII digits only).

Headers whose values the server keeps (in the journal, snapshots and memory)
or sends back have a length limit, in UTF-8 bytes (``HEADER_LIMITS``; README,
"Limits"): a value beyond it is a 400 naming the header and its limit, before
anything else reads it. The numeric headers (``Stream-TTL``,
``Producer-Epoch``, ``Producer-Seq``, ``Stream-Fork-Sub-Offset``) are bounded by
``parse_uint`` (20 digits), ``Stream-Fork-Offset`` by the offset format (33
characters); ``Stream-Closed`` is only compared, never kept.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from tiered.core.errors import ErrorCode, TieredError
from tiered.core.parsing import UINT_RE

# Cursor intervals (protocol section 10.1): 20 s buckets since 2024-10-09.
CURSOR_EPOCH_S = 1728432000
CURSOR_INTERVAL_S = 20


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: The longest value, in UTF-8 bytes, of each protocol header whose value is stored or echoed.
#: ``Producer-Id`` is kept per producer (a UUID is 36); ``Content-Type`` is stored with the
#: stream and sent with every read (RFC 6838 names are at most 127 + 1 + 127); ``Stream-Seq``
#: is kept per stream; ``Stream-Expires-At`` is echoed verbatim (RFC 3339 needs 35 at most,
#: the rest is room for fractional digits); ``Stream-Forked-From`` is a stream URL whose path
#: (1,024 bytes at most) may be percent-encoded three bytes a byte.
HEADER_LIMITS: dict[str, int] = {
    "Producer-Id": 256,
    "Content-Type": 256,
    "Stream-Seq": 256,
    "Stream-Expires-At": 64,
    "Stream-Forked-From": 4096,
}


def check_header_lengths(headers: Mapping[str, str]) -> None:
    """Refuse (400) a stored or echoed protocol header longer than its limit (``HEADER_LIMITS``).

    Runs before any other check reads the value, so an oversized one costs one
    length comparison (a character is at least one UTF-8 byte: only values
    with non-ASCII characters within the limit are encoded to count them).
    """
    check_value_lengths({name: headers.get(name) for name in HEADER_LIMITS})


def check_value_lengths(values: Mapping[str, str | None]) -> None:
    """``check_header_lengths`` over values already looked up (by name; None: absent), so a caller that
    checks the same headers for something else looks each up once."""
    for name, limit in HEADER_LIMITS.items():
        value = values[name]
        if value is None:
            continue
        if len(value) > limit or (
            not value.isascii() and len(value.encode("utf-8", "surrogatepass")) > limit
        ):
            raise TieredError(
                ErrorCode.BAD_REQUEST,
                f"{name} is longer than its limit of {limit} bytes",
                header=name,
                limit=limit,
            )


def parse_closed(value: str | None) -> bool:
    """``Stream-Closed`` counts only when it is exactly ``true`` (any case)."""
    return value is not None and value.lower() == "true"


def parse_expires_at(value: str) -> int:
    """An RFC 3339 timestamp with a time zone, as epoch milliseconds."""
    text = value.strip()
    if not re.fullmatch(
        r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", text, re.ASCII
    ):
        raise TieredError(
            ErrorCode.BAD_REQUEST, f"Stream-Expires-At must be an RFC 3339 timestamp, got {value!r}"
        )
    try:
        dt = datetime.fromisoformat(text.replace("z", "Z").replace("t", "T"))
    except ValueError:
        raise TieredError(
            ErrorCode.BAD_REQUEST, f"Stream-Expires-At is not a valid timestamp: {value!r}"
        ) from None
    # Integer arithmetic: float timestamps are off by a millisecond now and then.
    return (dt - _EPOCH) // timedelta(milliseconds=1)


def next_cursor(now_s: float, client_cursor: str | None, rng: random.Random | None = None) -> str:
    """The cursor for a live response: never at or below what the client sent."""
    current = int((now_s - CURSOR_EPOCH_S) // CURSOR_INTERVAL_S)
    if client_cursor is not None and UINT_RE.fullmatch(client_cursor) and len(client_cursor) < 20:
        theirs = int(client_cursor)
        if theirs >= current:
            jitter_s = (rng or random).randint(1, 3600)
            return str(theirs + max(1, jitter_s // CURSOR_INTERVAL_S))
    return str(current)
