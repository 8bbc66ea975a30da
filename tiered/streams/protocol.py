"""Durable Streams header parsing and the small protocol rules around it.

Everything here is pure: it turns header strings into values or raises a
``BAD_REQUEST`` ``TieredError`` with a message a client developer can act on.
Integers go through ``tiered.parsing.parse_uint`` (ASCII digits only).
"""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta

from tiered.errors import ErrorCode, TieredError
from tiered.parsing import UINT_RE

# Cursor intervals (protocol section 10.1): 20 s buckets since 2024-10-09.
CURSOR_EPOCH_S = 1728432000
CURSOR_INTERVAL_S = 20


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
