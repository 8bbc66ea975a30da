"""JSON mode: message boundaries, one-level array flattening, validation, array reads.

Each test runs on one node and on a single-node cluster (every shard's engine behind
shard routing): the server fixture's deployments (``tests/support/deployments.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support import deployments
from tests.support.http_helpers import (
    append,
    close,
    create,
    error_message,
    head,
    new_stream,
    read,
    request,
    state_of,
    stream_url,
    unique,
)
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)

JSON = "application/json"


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(request, "json")


def messages(u: str, offset: str = "-1") -> list[object]:
    status, headers, body = read(u, offset)
    assert status == 200
    assert headers["Content-Type"].startswith(JSON)
    value = json.loads(body)
    assert isinstance(value, list)
    return value


def test_empty_stream_reads_as_empty_array(srv: ServerProcess) -> None:
    u = new_stream(srv, JSON)
    status, headers, body = read(u)
    assert (status, body) == (200, b"[]")
    assert headers["Content-Type"] == JSON
    assert headers["Stream-Up-To-Date"] == "true"
    assert read(u, "now")[2] == b"[]"
    assert read(u, head(u)[1]["Stream-Next-Offset"])[2] == b"[]"


def test_single_values_are_one_message_each(srv: ServerProcess) -> None:
    u = new_stream(srv, JSON)
    values = [{"event": "created"}, "text", 42, 1.5, True, False, None, {}]
    for v in values:
        assert append(u, json.dumps(v), JSON)[0] == 204
    assert messages(u) == values


@pytest.mark.parametrize(
    ("body", "stored"),
    [
        ('[{"event": "a"}, {"event": "b"}]', [{"event": "a"}, {"event": "b"}]),
        ("[[1,2], [3,4]]", [[1, 2], [3, 4]]),
        ("[[[1,2,3]]]", [[[1, 2, 3]]]),
        ("[[]]", [[]]),
        ('[1, "two", null, {"three": [3]}]', [1, "two", None, {"three": [3]}]),
    ],
)
def test_arrays_are_flattened_exactly_one_level(srv: ServerProcess, body: str, stored: list[object]) -> None:
    u = new_stream(srv, JSON)
    assert append(u, body, JSON)[0] == 204
    assert messages(u) == stored
    # The same on creation.
    u2 = new_stream(srv, JSON, body)
    assert messages(u2) == stored


def test_message_boundaries_follow_offsets(srv: ServerProcess) -> None:
    u = new_stream(srv, JSON)
    o1 = append(u, '{"n":1}', JSON)[1]["Stream-Next-Offset"]
    o2 = append(u, '[{"n":2},{"n":3}]', JSON)[1]["Stream-Next-Offset"]
    append(u, '{"n":4}', JSON)
    assert messages(u) == [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]
    assert messages(u, o1) == [{"n": 2}, {"n": 3}, {"n": 4}]
    assert messages(u, o2) == [{"n": 4}]


def test_strings_with_newlines_and_unicode_round_trip(srv: ServerProcess) -> None:
    tricky = [
        {"text": "line1\nline2\r\nline3\rend"},
        "\n",
        "\u2028\u2029 separators",
        "emoji 😀 and nul \u0000",
        {"nested": ["a\nb", {"c": "d\ne"}]},
        'quote " and backslash \\',
    ]
    u = new_stream(srv, JSON)
    assert append(u, json.dumps(tricky), JSON)[0] == 204
    assert messages(u) == tricky
    # Pretty-printed input (raw newlines between tokens) is the same messages.
    u2 = new_stream(srv, JSON)
    assert append(u2, json.dumps(tricky, indent=2), JSON)[0] == 204
    assert messages(u2) == tricky
    assert len(messages(u2)) == len(tricky)


def test_content_type_with_charset_is_json_mode(srv: ServerProcess) -> None:
    u = new_stream(srv, "application/json; charset=utf-8", "[1]")
    assert append(u, "[2, 3]", "application/json")[0] == 204
    assert messages(u) == [1, 2, 3]


def test_post_empty_array_is_400_and_stores_nothing(srv: ServerProcess) -> None:
    u = new_stream(srv, JSON, '{"a":1}')
    before = state_of(u)
    for body in ("[]", " [ ] ", "[\n]"):
        status, _, resp = append(u, body, JSON)
        assert status == 400, body
        assert error_message(resp)
    assert state_of(u) == before


def test_put_empty_array_creates_an_empty_stream(srv: ServerProcess) -> None:
    u = stream_url(srv.url, unique("json"))
    status, headers, _ = create(u, JSON, "[]")
    assert status == 201
    assert headers["Stream-Next-Offset"] == "0000000000000000_0000000000000000"
    assert messages(u) == []


@pytest.mark.parametrize(
    "body",
    [
        "{",
        "[1, 2",
        "{'single': 'quotes'}",
        "undefined",
        "NaN",
        "[1,]",
        '{"a":1} {"b":2}',
        '{"a":1}\n{"b":2}',
        "",
        "  ",
        b'"\xff\xfe invalid utf-8"',
        "1e999",
    ],
)
def test_invalid_json_is_400_and_stores_nothing(srv: ServerProcess, body: str | bytes) -> None:
    u = new_stream(srv, JSON, '{"kept": true}')
    before = state_of(u)
    status, _, resp = request("POST", u, {"Content-Type": JSON}, body)
    assert status == 400, resp
    assert error_message(resp)
    assert state_of(u) == before


@pytest.mark.parametrize("body", ["{", "[1,]", b"\xff"])
def test_put_with_invalid_json_is_400_and_creates_nothing(srv: ServerProcess, body: str | bytes) -> None:
    u = stream_url(srv.url, unique("json"))
    status, _, _ = request("PUT", u, {"Content-Type": JSON}, body)
    assert status == 400
    assert head(u)[0] == 404


def test_non_json_streams_store_json_bytes_verbatim(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    append(u, "[]", "text/plain")
    append(u, "[1, 2]", "text/plain")
    assert read(u)[2] == b"[][1, 2]"


def test_json_append_with_other_content_type_is_409(srv: ServerProcess) -> None:
    u = new_stream(srv, JSON, "[1]")
    status, _, _ = append(u, "2", "text/plain")
    assert status == 409
    assert messages(u) == [1]


def test_closed_json_stream(srv: ServerProcess) -> None:
    u = new_stream(srv, JSON, '[{"last": true}]')
    close(u)
    status, headers, body = read(u, head(u)[1]["Stream-Next-Offset"])
    assert (status, body) == (200, b"[]")
    assert headers["Stream-Closed"] == "true"
    # Closure is checked before JSON validity: a closed stream says so even for bad JSON.
    status, headers, _ = append(u, "{not json", JSON)
    assert status == 409
    assert headers["Stream-Closed"] == "true"


def test_append_and_close_json(srv: ServerProcess) -> None:
    u = new_stream(srv, JSON)
    status, headers, _ = append(u, '[{"a":1},{"b":2}]', JSON, Stream_Closed="true")
    assert status == 204
    assert headers["Stream-Closed"] == "true"
    assert messages(u) == [{"a": 1}, {"b": 2}]


def test_create_closed_json_with_messages(srv: ServerProcess) -> None:
    u = stream_url(srv.url, unique("json"))
    assert create(u, JSON, '["only", "these"]', Stream_Closed="true")[0] == 201
    status, headers, body = read(u)
    assert json.loads(body) == ["only", "these"]
    assert headers["Stream-Closed"] == "true"
