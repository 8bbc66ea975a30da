"""Conditional appends: an append that succeeds only while the stream's tail is where the writer expects (pure).

Optimistic concurrency without a lock, as S2's ``match_seq_num`` and
Ursula's ``Stream-Record-Match``: a writer that read the tail (``HEAD``, a
read's or its last append's ``Stream-Next-Offset``) appends with
``Stream-Expected-Offset: <that offset>``. If another append got there first
the tail moved, and this one is refused with 412 ``TAIL_MISMATCH`` carrying
the current tail (``Stream-Next-Offset``), having written nothing. Of any
number of writers that expect one offset, exactly one wins: the decide step
reads the tail the state has *applied* (in-flight appends included) and the
commit follows it with no ``await`` in between (``StreamService.append``).

The order of checks (``appends.check_append``), so that a retry is answered
as a retry and a refusal names the first thing wrong:

1. the stream is closed: 409 ``STREAM_CLOSED`` (the protocol puts it first);
   a retry of the closing append is still a 204;
2. the content type differs: 409;
3. the idempotent producer: a duplicate (``Producer-Seq`` already accepted)
   is answered 204 with nothing written, *before* the expected offset is
   looked at (the tail moved because of that very append); a stale epoch is
   403, a sequence gap 409;
4. the expected offset (and, with record ordinals, ``Stream-Record-Match``):
   412 ``TAIL_MISMATCH``;
5. ``Stream-Seq`` must increase: 409.

A JSON batch (an array body) is one append: the condition holds for the
whole batch, which is written entirely or not at all.
"""

from __future__ import annotations

from collections.abc import Mapping

from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.ids import format_offset, parse_offset

__all__ = ["EXPECTED_OFFSET", "check_expected_offset", "parse_expected_offset"]

EXPECTED_OFFSET = "Stream-Expected-Offset"


def parse_expected_offset(headers: Mapping[str, str]) -> int | None:
    """The offset ``Stream-Expected-Offset`` names (a server-minted offset), None without one; 400 if malformed."""
    raw = headers.get(EXPECTED_OFFSET)
    if raw is None:
        return None
    offset = parse_offset(raw)
    if offset is None:
        raise bad_request(f"malformed {EXPECTED_OFFSET} {raw[:40]!r}: send an offset the server returned")
    return offset


def check_expected_offset(tail: int, expected: int | None) -> None:
    """Refuse (412, the current tail in ``next_offset``) unless the tail is at ``expected``."""
    if expected is not None and expected != tail:
        raise TieredError(
            ErrorCode.TAIL_MISMATCH,
            f"the stream's tail is not at {EXPECTED_OFFSET}: another append came first; "
            "Stream-Next-Offset is the current tail",
            next_offset=format_offset(tail),
            expected_offset=format_offset(expected),
        )
