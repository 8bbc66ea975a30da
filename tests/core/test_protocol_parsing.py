"""Pure parsing rules: protocol headers, cursors, offsets, names and JSON mode.

Nothing here touches a socket or a disk; every function under test is a pure
string/bytes transformation, so the tests are table-driven plus a few
Hypothesis properties for the round-trip and ordering rules.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.core.content import (
    DEFAULT_CONTENT_TYPE,
    count_json_messages,
    encode_json_messages,
    is_json,
    is_text_like,
    json_messages_to_array,
    media_type,
    valid_media_type,
)
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import (
    DEFAULT_BUCKET,
    MAX_STREAM_PATH,
    format_offset,
    parse_offset,
    validate_bucket,
    validate_stream_path,
)
from tiered.core.parsing import MAX_SAFE_INTEGER, parse_uint
from tiered.engine.streams.protocol import (
    CURSOR_EPOCH_S,
    CURSOR_INTERVAL_S,
    next_cursor,
    parse_closed,
    parse_expires_at,
)

# Every malformed value is the same refusal: a 400 that changes nothing.
BadRequest = InvalidName = InvalidJson = TieredError

# --------------------------------------------------------------------------- parse_uint


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1", 1),
        ("10", 10),
        ("3600", 3600),
        (str(MAX_SAFE_INTEGER), MAX_SAFE_INTEGER),
    ],
)
def test_parse_uint_accepts_plain_decimals(text: str, value: int) -> None:
    assert parse_uint(text, "Stream-TTL") == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-1",
        "+1",
        "01",
        "00",
        "03600",
        "1.0",
        "3600.0",
        "1e3",
        "3.6e3",
        " 1",
        "1 ",
        "0x10",
        "1_000",
        "abc",
        "\u0661",  # ARABIC-INDIC DIGIT ONE: a Unicode digit, not an ASCII one
        "\uff11",  # FULLWIDTH DIGIT ONE
        "1\n",
    ],
)
def test_parse_uint_rejects_malformed(text: str) -> None:
    with pytest.raises(BadRequest) as exc:
        parse_uint(text, "Stream-TTL")
    assert "Stream-TTL" in str(exc.value)


def test_parse_uint_enforces_maximum() -> None:
    with pytest.raises(BadRequest, match="at most"):
        parse_uint(str(MAX_SAFE_INTEGER + 1), "Producer-Seq")
    assert parse_uint("10", "x", maximum=10) == 10
    with pytest.raises(BadRequest, match="at most 10"):
        parse_uint("11", "x", maximum=10)
    # A huge but well-formed number is a range error, not a crash.
    with pytest.raises(BadRequest):
        parse_uint("9" * 400, "x")


def test_malformed_numbers_are_bad_request() -> None:
    with pytest.raises(TieredError) as exc:
        parse_uint("x", "y")
    assert exc.value.code is ErrorCode.BAD_REQUEST


@given(st.integers(min_value=0, max_value=MAX_SAFE_INTEGER))
def test_parse_uint_round_trips_str(n: int) -> None:
    assert parse_uint(str(n), "n") == n


# --------------------------------------------------------------------------- parse_closed


@pytest.mark.parametrize("value", ["true", "TRUE", "True", "tRuE"])
def test_parse_closed_true(value: str) -> None:
    assert parse_closed(value) is True


@pytest.mark.parametrize(
    "value", [None, "", "false", "FALSE", "1", "yes", "on", "truee", "t", " true", "true "]
)
def test_parse_closed_false(value: str | None) -> None:
    assert parse_closed(value) is False


# --------------------------------------------------------------------------- parse_expires_at

_2024 = 1704067200000  # 2024-01-01T00:00:00Z in epoch ms


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2024-01-01T00:00:00Z", _2024),
        ("2024-01-01T00:00:00z", _2024),
        ("2024-01-01t00:00:00Z", _2024),
        ("2024-01-01 00:00:00Z", _2024),
        ("2024-01-01T00:00:00+00:00", _2024),
        ("2024-01-01T00:00:00-00:00", _2024),
        ("2024-01-01T02:00:00+02:00", _2024),
        ("2023-12-31T19:00:00-05:00", _2024),
        ("2024-01-01T05:30:00+05:30", _2024),
        ("2024-01-01T00:00:00.5Z", _2024 + 500),
        ("2024-01-01T00:00:00.250Z", _2024 + 250),
        ("2024-01-01T00:00:00.123456Z", _2024 + 123),
        ("  2024-01-01T00:00:00Z  ", _2024),
        ("1970-01-01T00:00:00Z", 0),
        ("2099-12-31T23:59:59Z", 4102444799000),
    ],
)
def test_parse_expires_at_valid(text: str, ms: int) -> None:
    assert parse_expires_at(text) == ms


@pytest.mark.parametrize(
    "text",
    [
        "",
        "tomorrow",
        "1704067200",
        "2024-01-01",
        "2024-01-01T00:00:00",  # no time zone
        "2024-01-01T00:00Z",  # no seconds
        "2024-01-01T00:00:00+0200",  # offset without colon
        "2024-01-01T00:00:00+02",
        "2024-01-01T00:00:00 Z",
        "2024-01-01T00:00:00.Z",
        "2024-1-01T00:00:00Z",
        "24-01-01T00:00:00Z",
        "2024-01-01X00:00:00Z",
        "2024-13-01T00:00:00Z",  # shape ok, month invalid
        "2024-02-30T00:00:00Z",  # shape ok, day invalid
        "2024-01-01T25:00:00Z",
        "2024-01-01T00:00:60Z",
        "2024-01-01T00:00:00+24:00",
        "2024-01-01T00:00:00Z trailing",
        "\uff12\uff10\uff12\uff14-01-01T00:00:00Z",  # fullwidth digits
    ],
)
def test_parse_expires_at_invalid(text: str) -> None:
    with pytest.raises(BadRequest, match="Stream-Expires-At"):
        parse_expires_at(text)


@given(st.integers(min_value=0, max_value=4102444799), st.sampled_from(["Z", "+00:00", "+01:00", "-07:30"]))
def test_parse_expires_at_whole_seconds_property(epoch_s: int, zone: str) -> None:
    tz_minutes = 0 if zone in ("Z", "+00:00") else (60 if zone == "+01:00" else -(7 * 60 + 30))
    local = datetime.fromtimestamp(epoch_s + tz_minutes * 60, UTC)
    text = local.strftime("%Y-%m-%dT%H:%M:%S") + zone
    assert parse_expires_at(text) == epoch_s * 1000


def test_parse_expires_at_exact_milliseconds() -> None:
    # 2004-03-15T07:55:47.472Z is exactly 1079337347472 ms after the epoch.
    assert parse_expires_at("2004-03-15T07:55:47.472Z") == 1079337347472


# --------------------------------------------------------------------------- next_cursor

_NOW = CURSOR_EPOCH_S + 1_000_000.0
_CURRENT = int((_NOW - CURSOR_EPOCH_S) // CURSOR_INTERVAL_S)


def test_next_cursor_without_client_cursor_is_the_current_interval() -> None:
    assert next_cursor(_NOW, None, random.Random(1)) == str(_CURRENT)
    # Same interval for every instant inside it.
    start = CURSOR_EPOCH_S + _CURRENT * CURSOR_INTERVAL_S
    assert next_cursor(start, None) == str(_CURRENT)
    assert next_cursor(start + CURSOR_INTERVAL_S - 0.001, None) == str(_CURRENT)
    assert next_cursor(start + CURSOR_INTERVAL_S, None) == str(_CURRENT + 1)


def test_next_cursor_older_client_cursor_gets_the_current_interval() -> None:
    rng = random.Random(7)
    assert next_cursor(_NOW, "0", rng) == str(_CURRENT)
    assert next_cursor(_NOW, str(_CURRENT - 1), rng) == str(_CURRENT)


@pytest.mark.parametrize("delta", [0, 1, 5000])
def test_next_cursor_at_or_ahead_of_current_moves_strictly_forward(delta: int) -> None:
    theirs = _CURRENT + delta
    rng = random.Random(1234)
    out = int(next_cursor(_NOW, str(theirs), rng))
    assert theirs < out <= theirs + 3600 // CURSOR_INTERVAL_S


def test_next_cursor_is_deterministic_for_a_seeded_rng() -> None:
    a = [next_cursor(_NOW, str(_CURRENT), random.Random(99)) for _ in range(3)]
    assert len(set(a)) == 1
    rng1, rng2 = random.Random(5), random.Random(5)
    seq1 = [next_cursor(_NOW, str(_CURRENT + i), rng1) for i in range(20)]
    seq2 = [next_cursor(_NOW, str(_CURRENT + i), rng2) for i in range(20)]
    assert seq1 == seq2


@pytest.mark.parametrize("cursor", ["", "abc", "-1", "+5", "01", "1.5", "9" * 20, " 5"])
def test_next_cursor_ignores_malformed_client_cursors(cursor: str) -> None:
    assert next_cursor(_NOW, cursor, random.Random(3)) == str(_CURRENT)


@settings(max_examples=200)
@given(
    now_offset=st.floats(min_value=0, max_value=10**9, allow_nan=False, allow_infinity=False),
    client=st.one_of(st.none(), st.integers(min_value=0, max_value=10**19 - 1)),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_next_cursor_monotonic_rule(now_offset: float, client: int | None, seed: int) -> None:
    now = CURSOR_EPOCH_S + now_offset
    current = int((now - CURSOR_EPOCH_S) // CURSOR_INTERVAL_S)
    out = next_cursor(now, None if client is None else str(client), random.Random(seed))
    assert out.isdigit() and (out == "0" or not out.startswith("0"))
    n = int(out)
    # Never behind the clock, and never at or below what the client sent.
    assert n >= current
    if client is not None:
        assert n > client


# --------------------------------------------------------------------------- offsets


def test_format_offset_shape() -> None:
    assert format_offset(0) == "0000000000000000_0000000000000000"
    assert format_offset(1) == "0000000000000000_0000000000000001"
    assert format_offset(10**16 - 1) == "0000000000000000_9999999999999999"
    assert format_offset(10**16) == "0000000000000001_0000000000000000"
    assert format_offset(12345 * 10**16 + 678) == "0000000000012345_0000000000000678"
    assert len(format_offset(10**32 - 1)) == 33


@given(st.integers(min_value=0, max_value=10**32 - 1))
def test_offset_round_trip(pos: int) -> None:
    token = format_offset(pos)
    assert len(token) == 33
    assert parse_offset(token) == pos


@given(st.integers(min_value=0, max_value=10**32 - 1), st.integers(min_value=0, max_value=10**32 - 1))
def test_offsets_sort_like_positions(a: int, b: int) -> None:
    assert (format_offset(a) < format_offset(b)) == (a < b)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "-1",
        "now",
        "0",
        "00000000000000000000000000000000",  # 32 digits, no separator
        "0000000000000000-0000000000000000",
        "0000000000000000_000000000000000",  # 16_15
        "000000000000000_0000000000000000",  # 15_16
        "0000000000000000_00000000000000000",  # 16_17
        "00000000000000000_0000000000000000",  # 17_16
        "000000000000000a_0000000000000000",
        "0000000000000000_000000000000000x",
        "0000000000000000_ 000000000000000",
        " 0000000000000000_000000000000000",
        "+000000000000000_0000000000000000",
        "0000000000000000_-000000000000000",
        "0000000000000000_0000000000000000\n",
        "0000000000000000__000000000000000",
        "0000000000000000_0000000000000000_0",
    ],
)
def test_parse_offset_rejects_malformed(token: str) -> None:
    assert parse_offset(token) is None


@pytest.mark.parametrize(
    "token",
    [
        "\u0660" * 16 + "_" + "0" * 16,  # ARABIC-INDIC DIGIT ZERO
        "0" * 16 + "_" + "\uff10" * 15 + "\uff11",  # FULLWIDTH digits
    ],
)
def test_parse_offset_rejects_non_ascii_digits(token: str) -> None:
    assert len(token) == 33
    assert parse_offset(token) is None


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["abc", "a-b", "a1b", "123", DEFAULT_BUCKET, "a" * 63, "a" + "-" * 61 + "b"])
def test_validate_bucket_accepts(name: str) -> None:
    assert validate_bucket(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a",
        "ab",
        "a" * 64,
        "-ab",
        "ab-",
        "ABC",
        "aBc",
        "a_b",
        "a.b",
        "a b",
        "a/b",
        "ab\n",
        "\u00e9ab",
        "a--",
    ],
)
def test_validate_bucket_rejects(name: str) -> None:
    with pytest.raises(InvalidName):
        validate_bucket(name)


@pytest.mark.parametrize(
    "path",
    [
        "a",
        "a/b/c",
        "orders-2024",
        "with space",
        "dots.in.name",
        "...",
        ".hidden",
        "a/..b/c..",
        "\u00fcn\u00efc\u00f8de/\u6d41",
        "emoji/\U0001f600",
        "x" * MAX_STREAM_PATH,
    ],
)
def test_validate_stream_path_accepts(path: str) -> None:
    assert validate_stream_path(path) == path


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/",
        "/a",
        "a/",
        "a//b",
        ".",
        "..",
        "a/.",
        "a/./b",
        "../a",
        "a/../b",
        "a/..",
        "a\x00b",
        "a\nb",
        "a\rb",
        "a\tb",
        "a\x1fb",
        "a\x7fb",
        "a\\b",
        "..\\a",
        "x" * (MAX_STREAM_PATH + 1),
        "\u00e9" * (MAX_STREAM_PATH // 2 + 1),  # 513 chars but 1026 UTF-8 bytes
    ],
)
def test_validate_stream_path_rejects(path: str) -> None:
    with pytest.raises(InvalidName):
        validate_stream_path(path)


def test_stream_path_length_is_counted_in_utf8_bytes() -> None:
    ok = "\u00e9" * (MAX_STREAM_PATH // 2)  # exactly 1024 bytes
    assert len(ok.encode()) == MAX_STREAM_PATH
    assert validate_stream_path(ok) == ok


@pytest.mark.parametrize("ch", ["\x80", "\x85", "\x9b", "\x9f"])
def test_validate_stream_path_rejects_c1_controls(ch: str) -> None:
    with pytest.raises(InvalidName):
        validate_stream_path(f"a{ch}b")


# --------------------------------------------------------------------------- content types


@pytest.mark.parametrize(
    ("ct", "mt"),
    [
        ("application/json", "application/json"),
        ("Application/JSON; charset=utf-8", "application/json"),
        ("  text/plain ;charset=x", "text/plain"),
        ("text/plain", "text/plain"),
    ],
)
def test_media_type(ct: str, mt: str) -> None:
    assert media_type(ct) == mt


def test_content_type_predicates() -> None:
    assert is_json("application/json; charset=utf-8")
    assert not is_json("application/jsonl")
    assert not is_json(DEFAULT_CONTENT_TYPE)
    assert is_text_like("text/plain")
    assert is_text_like("TEXT/HTML; charset=latin-1")
    assert is_text_like("application/json")
    assert not is_text_like("application/octet-stream")
    assert not is_text_like("image/png")


@pytest.mark.parametrize(
    "ct", ["application/json", "text/plain; charset=utf-8", "a/b", "Application/X-Foo+json"]
)
def test_valid_media_type_accepts(ct: str) -> None:
    assert valid_media_type(ct)


@pytest.mark.parametrize("ct", ["", "json", "/json", "application/", "application", "text /plain", "a/ b"])
def test_valid_media_type_rejects(ct: str) -> None:
    assert not valid_media_type(ct)


# --------------------------------------------------------------------------- JSON mode


def test_json_single_value_becomes_one_compact_message() -> None:
    assert (
        encode_json_messages(b'  { "a" : 1 ,\n "b": [1, 2] }  ', allow_empty_array=False)
        == b'{"a":1,"b":[1,2]}\n'
    )
    assert encode_json_messages(b'"x"', allow_empty_array=False) == b'"x"\n'
    assert encode_json_messages(b"null", allow_empty_array=False) == b"null\n"
    assert encode_json_messages(b"0", allow_empty_array=False) == b"0\n"


def test_json_array_is_flattened_one_level() -> None:
    stored = encode_json_messages(b'[1, {"x": 2}, [3, 4], "s"]', allow_empty_array=False)
    assert stored == b'1\n{"x":2}\n[3,4]\n"s"\n'
    assert count_json_messages(stored) == 4
    assert json_messages_to_array(stored) == b'[1,{"x":2},[3,4],"s"]'


def test_json_nested_arrays_are_not_flattened_further() -> None:
    stored = encode_json_messages(b"[[1, 2], [3]]", allow_empty_array=False)
    assert count_json_messages(stored) == 2
    assert json_messages_to_array(stored) == b"[[1,2],[3]]"


def test_json_newlines_in_strings_are_escaped_so_newline_is_a_boundary() -> None:
    stored = encode_json_messages(b'["a\\nb", "c\\r\\nd"]', allow_empty_array=False)
    assert stored.count(b"\n") == 2
    assert json_messages_to_array(stored) == b'["a\\nb","c\\r\\nd"]'
    assert msgspec.json.decode(json_messages_to_array(stored)) == ["a\nb", "c\r\nd"]


def test_json_empty_array_only_where_allowed() -> None:
    with pytest.raises(InvalidJson, match="empty JSON array"):
        encode_json_messages(b"[]", allow_empty_array=False)
    assert encode_json_messages(b"[]", allow_empty_array=True) == b""
    assert encode_json_messages(b" [ ] ", allow_empty_array=True) == b""
    # A nested empty array is a message, not an empty append.
    assert encode_json_messages(b"[[]]", allow_empty_array=False) == b"[]\n"


@pytest.mark.parametrize(
    "body", [b"", b"{", b"[1,]", b"NaN", b"Infinity", b"1e400", b"{'a': 1}", b"[1] [2]", b"\xff"]
)
def test_json_invalid_bodies_are_rejected(body: bytes) -> None:
    with pytest.raises(InvalidJson):
        encode_json_messages(body, allow_empty_array=True)


def test_json_array_rendering_and_count() -> None:
    assert json_messages_to_array(b"") == b"[]"
    assert count_json_messages(b"") == 0
    assert json_messages_to_array(b"1\n") == b"[1]"
    assert json_messages_to_array(b'1\n"two"\n{"3":3}\n') == b'[1,"two",{"3":3}]'
    # Concatenated appends render as one array.
    a = encode_json_messages(b"[1,2]", allow_empty_array=False)
    b = encode_json_messages(b'{"k":"v"}', allow_empty_array=False)
    assert json_messages_to_array(a + b) == b'[1,2,{"k":"v"}]'
    assert count_json_messages(a + b) == 3


def test_json_big_integers_survive() -> None:
    stored = encode_json_messages(
        b"[12345678901234567890123, -98765432109876543210]", allow_empty_array=False
    )
    assert stored == b"12345678901234567890123\n-98765432109876543210\n"


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=150)
@given(st.lists(_json_values, max_size=6))
def test_json_flatten_render_round_trip(messages: list[object]) -> None:
    body = msgspec.json.encode(messages)
    stored = encode_json_messages(body, allow_empty_array=True)
    assert count_json_messages(stored) == len(messages)
    assert stored == b"".join(msgspec.json.encode(m) + b"\n" for m in messages)
    assert msgspec.json.decode(json_messages_to_array(stored)) == messages
