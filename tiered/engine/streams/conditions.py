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
4. the expected offset: 412 ``TAIL_MISMATCH``;
5. ``Stream-Seq`` must increase: 409;
6. ``Stream-Record-Match`` (the next record ordinal, ``ordinals``): 412
   ``TAIL_MISMATCH`` (``record_next`` in the body, ``Stream-Record-Next``);
   checked by the service right after the rules above, in the same step.

A JSON batch (an array body) is one append: the condition holds for the
whole batch, which is written entirely or not at all.
"""

from __future__ import annotations

from collections.abc import Mapping

from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.ids import format_offset, parse_offset
from tiered.core.parsing import parse_uint

__all__ = [
    "EXPECTED_OFFSET",
    "RECORD_MATCH",
    "check_expected_offset",
    "check_record_match",
    "parse_expected_offset",
    "parse_record_match",
]

EXPECTED_OFFSET = "Stream-Expected-Offset"
RECORD_MATCH = "Stream-Record-Match"  # Ursula's: the next record ordinal expected (``ordinals``)


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


def parse_record_match(headers: Mapping[str, str]) -> int | None:
    """The record ordinal ``Stream-Record-Match`` names, None without one; 400 if not a number."""
    raw = headers.get(RECORD_MATCH)
    return None if raw is None else parse_uint(raw, RECORD_MATCH)


def check_record_match(next_record: int | None, tail: int, expected: int | None) -> None:
    """Refuse (412) unless the stream's next record ordinal is ``expected``; 400 on a stream without ordinals."""
    if expected is None:
        return
    if next_record is None:
        raise bad_request(
            f"{RECORD_MATCH} needs record ordinals, which this stream (created before them) lacks"
        )
    if next_record != expected:
        raise TieredError(
            ErrorCode.TAIL_MISMATCH,
            f"the stream's next record is {next_record}, not {expected} ({RECORD_MATCH}): another append "
            "came first; Stream-Next-Offset is the current tail",
            next_offset=format_offset(tail),
            record_next=next_record,
        )
