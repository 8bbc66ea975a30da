"""Conditional appends (issue 22), as the pure state machine decides them: ``tiered.engine.streams.conditions``.

The order of checks is the documented one: closed, content type, a producer's duplicate (answered
before the condition: its own append moved the tail), producer errors, the expected offset, Stream-Seq.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.streams.test_state_machine import Harness
from tests.support.error_helpers import http_status
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET, format_offset
from tiered.engine.streams.conditions import EXPECTED_OFFSET, parse_expected_offset
from tiered.engine.streams.model import AppendRequest, Duplicate
from tiered.engine.streams.records import Appended

TEXT = "text/plain"


def decide(
    h: Harness,
    data: bytes,
    expected: int | None,
    *,
    content_type: str = TEXT,
    close: bool = False,
    producer: str | None = None,
    epoch: int = 0,
    seq: int = 0,
) -> Appended | Duplicate:
    req = AppendRequest(content_type, data, close, producer, epoch, seq, None, expected)
    decided = h.state.decide_append(DEFAULT_BUCKET, "s", req, 0)
    if isinstance(decided, Appended):
        h.commit([decided])
    return decided


def refusal(h: Harness, data: bytes, expected: int | None, **kw: Any) -> TieredError:
    with pytest.raises(TieredError) as exc:
        decide(h, data, expected, **kw)
    return exc.value


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.create("s", content_type=TEXT)
    return harness


def test_an_append_at_the_expected_tail_is_written_and_a_stale_one_is_412_with_the_tail(h: Harness) -> None:
    assert isinstance(decide(h, b"abc", 0), Appended)
    exc = refusal(h, b"zz", 0)
    assert exc.code is ErrorCode.TAIL_MISMATCH and http_status(exc) == 412
    assert exc.context["next_offset"] == format_offset(3)
    assert h.stream("s").tail == 3 and h.read("s") == b"abc"  # nothing written
    assert isinstance(decide(h, b"de", 3), Appended)
    assert isinstance(decide(h, b"f", None), Appended)  # unconditional appends are unchanged
    assert h.read("s") == b"abcdef"


def test_an_expected_offset_beyond_the_tail_is_412_too(h: Harness) -> None:
    assert refusal(h, b"x", 10).code is ErrorCode.TAIL_MISMATCH


def test_a_producer_retry_is_a_duplicate_not_a_412(h: Harness) -> None:
    first = decide(h, b"abc", 0, producer="p", epoch=0, seq=0)
    assert isinstance(first, Appended)
    # The same append again (a retry after a lost answer): its own append moved the tail.
    assert isinstance(decide(h, b"abc", 0, producer="p", epoch=0, seq=0), Duplicate)
    # The next sequence number with a stale expectation is refused, and may be retried later.
    assert refusal(h, b"d", 0, producer="p", epoch=0, seq=1).code is ErrorCode.TAIL_MISMATCH
    assert isinstance(decide(h, b"d", 3, producer="p", epoch=0, seq=1), Appended)
    assert h.read("s") == b"abcd"


def test_closed_and_content_type_come_before_the_condition(h: Harness) -> None:
    assert refusal(h, b"x", 5, content_type="application/json").code is ErrorCode.CONTENT_TYPE_MISMATCH
    decide(h, b"", 0, close=True)
    assert refusal(h, b"x", 5).code is ErrorCode.STREAM_CLOSED


def test_a_producer_gap_comes_before_the_condition(h: Harness) -> None:
    decide(h, b"a", 0, producer="p", epoch=0, seq=0)
    assert refusal(h, b"x", 0, producer="p", epoch=0, seq=5).code is ErrorCode.PRODUCER_SEQ_GAP


def test_the_header_parses_a_server_offset_only() -> None:
    assert parse_expected_offset({}) is None
    assert parse_expected_offset({EXPECTED_OFFSET: format_offset(12345)}) == 12345
    for bad in ("", "12", "-1", "now", format_offset(1) + "0"):
        with pytest.raises(TieredError) as exc:
            parse_expected_offset({EXPECTED_OFFSET: bad})
        assert exc.value.code is ErrorCode.BAD_REQUEST
