"""Conditional appends over HTTP (issue 22): ``Stream-Expected-Offset``, 412 ``TAIL_MISMATCH`` with the tail.

Each test runs on one node and on a single-node cluster of 4 shards (the header forwarded to the shard).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from tests.support import deployments
from tests.support.http_helpers import Headers, create, head, read, request, stream_url, unique
from tests.support.server_process import ServerProcess
from tiered.core.ids import format_offset, parse_offset

pytestmark = pytest.mark.timeout(180)

WRITERS = 16
ROUNDS = 8


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(request, "conditional")


def post(url: str, body: bytes, ct: str, expected: int | None, **extra: str) -> tuple[int, Headers, bytes]:
    headers = {"Content-Type": ct, **extra}
    if expected is not None:
        headers["Stream-Expected-Offset"] = format_offset(expected)
    status, h, out = request("POST", url, headers, body)
    return status, h, out


def race(url: str, ct: str, bodies: list[bytes], expected: int) -> list[tuple[int, Headers, bytes]]:
    """Every body appended at once, each expecting ``expected``; the answers in writer order."""
    answers: list[tuple[int, Headers, bytes] | None] = [None] * len(bodies)
    start = threading.Barrier(len(bodies))

    def writer(i: int) -> None:
        start.wait(30)
        answers[i] = post(url, bodies[i], ct, expected)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


@pytest.mark.parametrize("ct", ["application/octet-stream", "application/json"])
def test_sixteen_writers_exactly_one_wins_each_offset_and_the_stream_is_the_winners(
    srv: ServerProcess, ct: str
) -> None:
    url = stream_url(srv.url, unique("race"))
    assert create(url, ct)[0] == 201
    json_mode = ct == "application/json"
    winners: list[bytes] = []
    tail = 0
    for r in range(ROUNDS):
        if json_mode:  # JSON batches: each writer appends two messages at once
            bodies = [
                json.dumps([{"r": r, "w": w, "i": 0}, {"r": r, "w": w, "i": 1}]).encode()
                for w in range(WRITERS)
            ]
        else:
            bodies = [f"<round {r} writer {w}>".encode() for w in range(WRITERS)]
        answers = race(url, ct, bodies, tail)
        won = [i for i, (status, _, _) in enumerate(answers) if status == 204]
        assert len(won) == 1, [a[0] for a in answers]
        new_tail = parse_offset(answers[won[0]][1]["Stream-Next-Offset"])
        assert new_tail is not None and new_tail > tail
        for i, (status, headers, out) in enumerate(answers):
            if i in won:
                continue
            assert status == 412, (status, out)
            assert json.loads(out)["error"]["code"] == "TAIL_MISMATCH"
            # The current tail: the winner's (every loser decided after it was applied).
            assert parse_offset(headers["Stream-Next-Offset"]) == new_tail
        winners.append(bodies[won[0]])
        tail = new_tail
        assert parse_offset(head(url)[1]["Stream-Next-Offset"]) == tail
    status, _, content = read(url, "-1")
    assert status == 200
    if json_mode:
        expected = [m for body in winners for m in json.loads(body)]
        assert json.loads(content) == expected
    else:
        assert content == b"".join(winners)


def test_a_mismatch_writes_nothing_and_names_the_tail(srv: ServerProcess) -> None:
    url = stream_url(srv.url, unique("cond"))
    create(url, "text/plain")
    assert post(url, b"abc", "text/plain", 0)[0] == 204
    status, headers, out = post(url, b"zzz", "text/plain", 0)
    assert status == 412
    assert headers["Stream-Next-Offset"] == format_offset(3)
    body = json.loads(out)["error"]
    assert body["next_offset"] == format_offset(3) and body["expected_offset"] == format_offset(0)
    assert read(url, "-1")[2] == b"abc"
    # A malformed expectation is a 400, before anything is decided.
    status, _, out = request("POST", url, {"Content-Type": "text/plain", "Stream-Expected-Offset": "3"}, b"x")
    assert status == 400 and json.loads(out)["error"]["code"] == "BAD_REQUEST"
    # Close, conditionally.
    status, headers, _ = post(url, b"", "text/plain", 3, **{"Stream-Closed": "true"})
    assert status == 204 and headers["Stream-Closed"] == "true"


def test_a_producer_retry_after_its_append_won_is_still_a_duplicate(srv: ServerProcess) -> None:
    url = stream_url(srv.url, unique("condp"))
    create(url, "text/plain")
    ident = {"Producer-Id": "p1", "Producer-Epoch": "0", "Producer-Seq": "0"}
    assert post(url, b"one", "text/plain", 0, **ident)[0] == 200
    # The retry (its answer was lost): 204, nothing written, though the tail is no longer 0.
    status, headers, _ = post(url, b"one", "text/plain", 0, **ident)
    assert status == 204 and headers["Producer-Seq"] == "0"
    assert read(url, "-1")[2] == b"one"
