"""Idempotent producers (Producer-Id / Producer-Epoch / Producer-Seq).

Each test runs on one node, on a single-node cluster (every shard's engine behind shard
routing) and on one in object-store durability (every acknowledgement after a WAL commit):
the server fixture's deployments (``tests/support/deployments.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support import deployments
from tests.support.http_helpers import (
    append,
    error_message,
    head,
    new_stream,
    read,
    request,
    state_of,
)
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)

MAX_SAFE = 2**53 - 1


@pytest.fixture(
    scope="module", params=(deployments.SINGLE_NODE, deployments.CLUSTER_NODE, deployments.CLUSTER_NODE_WAL)
)
def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(request, "producers")


def produce(
    u: str,
    body: str | bytes,
    pid: str = "p1",
    epoch: int | str = 0,
    seq: int | str = 0,
    content_type: str = "text/plain",
    **extra: str,
) -> tuple[int, object, bytes]:
    headers = {
        "Content-Type": content_type,
        "Producer-Id": pid,
        "Producer-Epoch": str(epoch),
        "Producer-Seq": str(seq),
        **{k.replace("_", "-"): v for k, v in extra.items()},
    }
    return request("POST", u, headers, body)


def test_new_data_is_200_with_producer_echo(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    status, headers, body = produce(u, "a", seq=0)
    assert (status, body) == (200, b"")
    assert headers["Producer-Epoch"] == "0"
    assert headers["Producer-Seq"] == "0"
    assert headers["Stream-Next-Offset"] == head(u)[1]["Stream-Next-Offset"]
    status, headers, _ = produce(u, "b", seq=1)
    assert status == 200
    assert headers["Producer-Seq"] == "1"
    assert read(u)[2] == b"ab"


def test_retries_are_204_duplicates_and_store_nothing(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    produce(u, "a", seq=0)
    tail = produce(u, "b", seq=1)[1]["Stream-Next-Offset"]
    for seq in (1, 0):
        status, headers, body = produce(u, "ignored", seq=seq)
        assert (status, body) == (204, b"")
        assert headers["Producer-Epoch"] == "0"
        assert headers["Producer-Seq"] == "1"  # the highest accepted, not the retried one
        assert headers["Stream-Next-Offset"] == tail
    assert read(u)[2] == b"ab"
    assert produce(u, "c", seq=2)[0] == 200
    assert read(u)[2] == b"abc"


def test_sequence_gap_is_409_with_expected_and_received(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    produce(u, "a", seq=0)
    produce(u, "b", seq=1)
    before = state_of(u)
    status, headers, body = produce(u, "x", seq=5)
    assert status == 409
    assert headers["Producer-Expected-Seq"] == "2"
    assert headers["Producer-Received-Seq"] == "5"
    assert error_message(body)
    assert state_of(u) == before
    # The gap request left the producer where it was.
    assert produce(u, "c", seq=2)[0] == 200


def test_stale_epoch_is_403_with_current_epoch(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    produce(u, "a", epoch=0, seq=0)
    produce(u, "b", epoch=0, seq=1)
    status, headers, _ = produce(u, "c", epoch=1, seq=0)
    assert status == 200
    assert headers["Producer-Epoch"] == "1"
    assert headers["Producer-Seq"] == "0"
    before = state_of(u)
    # The zombie from epoch 0 is fenced, with new or retried sequence numbers.
    for seq in (2, 1, 0):
        status, headers, body = produce(u, "zombie", epoch=0, seq=seq)
        assert status == 403
        assert headers["Producer-Epoch"] == "1"
        assert error_message(body)
    assert state_of(u) == before
    assert read(u)[2] == b"abc"


def test_auto_claim_by_bumping_past_the_reported_epoch(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    produce(u, "a", epoch=5, seq=0)
    status, headers, _ = produce(u, "b", epoch=0, seq=0)
    assert status == 403
    claimed = int(headers["Producer-Epoch"]) + 1
    assert produce(u, "b", epoch=claimed, seq=0)[0] == 200
    assert read(u)[2] == b"ab"


def test_epoch_bump_must_start_at_seq_zero(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    produce(u, "a", epoch=0, seq=0)
    before = state_of(u)
    status, _, body = produce(u, "b", epoch=1, seq=1)
    assert status == 400
    assert error_message(body)
    assert state_of(u) == before
    # Epoch 0 is still current.
    assert produce(u, "b", epoch=0, seq=1)[0] == 200


def test_new_producer_must_start_at_seq_zero(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    before = state_of(u)
    status, _, body = produce(u, "a", pid="fresh", epoch=0, seq=3)
    assert status == 400
    assert error_message(body) == (
        "this stream has no state for this producer (a new one, or its state expired or was evicted): "
        "a new producer starts at Producer-Seq 0"
    )
    assert state_of(u) == before
    assert produce(u, "a", pid="fresh", epoch=0, seq=0)[0] == 200


def test_producers_are_independent(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    assert produce(u, "1", pid="A", seq=0)[0] == 200
    assert produce(u, "2", pid="B", seq=0)[0] == 200
    assert produce(u, "3", pid="A", seq=1)[0] == 200
    assert produce(u, "x", pid="B", seq=0)[0] == 204
    assert produce(u, "4", pid="B", epoch=3, seq=0)[0] == 200
    assert produce(u, "5", pid="A", seq=2)[0] == 200  # B's epoch does not fence A
    assert read(u)[2] == b"12345"


def test_producer_state_is_per_stream(srv: ServerProcess) -> None:
    u1, u2 = new_stream(srv, "text/plain"), new_stream(srv, "text/plain")
    produce(u1, "a", epoch=2, seq=0)
    produce(u1, "b", epoch=2, seq=1)
    assert produce(u2, "c", epoch=0, seq=0)[0] == 200


def test_plain_appends_mix_with_producer_appends(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    produce(u, "a", seq=0)
    append(u, "-", "text/plain")
    produce(u, "b", seq=1)
    assert produce(u, "b", seq=1)[0] == 204
    assert read(u)[2] == b"a-b"


@pytest.mark.parametrize(
    "headers",
    [
        {"Producer-Id": "p"},
        {"Producer-Epoch": "0"},
        {"Producer-Seq": "0"},
        {"Producer-Id": "p", "Producer-Epoch": "0"},
        {"Producer-Id": "p", "Producer-Seq": "0"},
        {"Producer-Epoch": "0", "Producer-Seq": "0"},
    ],
)
def test_partial_producer_headers_are_400(srv: ServerProcess, headers: dict[str, str]) -> None:
    u = new_stream(srv, "text/plain")
    before = state_of(u)
    status, _, body = request("POST", u, {"Content-Type": "text/plain", **headers}, "x")
    assert status == 400
    assert error_message(body)
    assert state_of(u) == before


@pytest.mark.parametrize("bad", ["-1", "1.0", "01", "+1", "1e3", "abc", "", "0x1", str(MAX_SAFE + 1)])
@pytest.mark.parametrize("which", ["epoch", "seq"])
def test_bad_producer_integers_are_400(srv: ServerProcess, which: str, bad: str) -> None:
    u = new_stream(srv, "text/plain")
    before = state_of(u)
    kwargs = {"epoch": 0, "seq": 0, which: bad}
    status, _, body = produce(u, "x", **kwargs)
    assert status == 400, (which, bad)
    assert error_message(body)
    assert state_of(u) == before


def test_largest_safe_integers_are_accepted(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    status, headers, _ = produce(u, "x", epoch=MAX_SAFE, seq=0)
    assert status == 200
    assert headers["Producer-Epoch"] == str(MAX_SAFE)


def test_empty_producer_id_is_400(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    status, _, _ = produce(u, "x", pid="")
    assert status == 400
    assert read(u)[2] == b""


def test_failed_stream_seq_check_does_not_advance_the_producer(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    produce(u, "a", seq=0, Stream_Seq="5")
    status, _, _ = produce(u, "b", seq=1, Stream_Seq="4")
    assert status == 409
    # seq 1 was not consumed: retrying it with a valid Stream-Seq is new data.
    assert produce(u, "b", seq=1, Stream_Seq="6")[0] == 200
    assert read(u)[2] == b"ab"


def test_content_type_mismatch_does_not_advance_the_producer(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    produce(u, "a", seq=0)
    assert produce(u, "{}", seq=1, content_type="application/json")[0] == 409
    assert produce(u, "b", seq=1)[0] == 200


def test_json_batches_are_deduplicated_as_a_unit(srv: ServerProcess) -> None:
    u = new_stream(srv, "application/json")
    assert produce(u, "[1, 2, 3]", seq=0, content_type="application/json")[0] == 200
    assert produce(u, "[1, 2, 3]", seq=0, content_type="application/json")[0] == 204
    assert json.loads(read(u)[2]) == [1, 2, 3]


# ------------------------------------------------------------ with closure


def test_append_and_close_then_retry_is_a_duplicate(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    produce(u, "a", seq=0)
    status, headers, _ = produce(u, "z", seq=1, Stream_Closed="true")
    assert status == 200
    assert headers["Stream-Closed"] == "true"
    assert headers["Producer-Seq"] == "1"
    final = headers["Stream-Next-Offset"]
    # The retry of the closing request succeeds without appending.
    status, headers, _ = produce(u, "z", seq=1, Stream_Closed="true")
    assert status == 204
    assert headers["Stream-Closed"] == "true"
    assert headers["Stream-Next-Offset"] == final
    assert read(u)[2] == b"az"
    # Anything else from the producer is refused: the stream is closed.
    for seq in (2, 0):
        status, headers, _ = produce(u, "more", seq=seq)
        assert status == 409
        assert headers["Stream-Closed"] == "true"
        assert headers["Stream-Next-Offset"] == final
    assert read(u)[2] == b"az"


def test_close_only_with_producer_headers_and_duplicate_close(srv: ServerProcess) -> None:
    u = new_stream(srv, "text/plain")
    produce(u, "a", seq=0)
    headers = {"Producer-Id": "p1", "Producer-Epoch": "0", "Producer-Seq": "1", "Stream-Closed": "true"}
    status, h, _ = request("POST", u, headers, b"")
    assert status == 204
    assert h["Stream-Closed"] == "true"
    assert h["Producer-Epoch"] == "0"
    assert h["Producer-Seq"] == "1"
    tail = h["Stream-Next-Offset"]
    # Same tuple again: duplicate close.
    status, h, _ = request("POST", u, headers, b"")
    assert status == 204
    assert h["Stream-Closed"] == "true"
    assert h["Stream-Next-Offset"] == tail
    # A plain close-only is idempotent too.
    status, h, _ = request("POST", u, {"Stream-Closed": "true"}, b"")
    assert status == 204
    assert h["Stream-Closed"] == "true"
    assert read(u)[2] == b"a"
