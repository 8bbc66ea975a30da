"""Record ordinals over HTTP (issue 22): ``?record=N``, ``Stream-Record``, HEAD's counts, ``Stream-Record-Match``.

Each test runs on one node and on a single-node cluster of 4 shards; the SIGKILL test on one node.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import deployments
from tests.support.http_helpers import Headers, create, head, request, stream_url, unique
from tests.support.server_process import ServerProcess
from tiered.cluster.membership.shards import shard_of
from tiered.core.ids import DEFAULT_BUCKET, format_offset

pytestmark = pytest.mark.timeout(180)

BIN = "application/octet-stream"
JSON = "application/json"


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(request, "records")


def post(url: str, body: bytes, ct: str = BIN, **extra: str) -> tuple[int, Headers, bytes]:
    return request("POST", url, {"Content-Type": ct, **extra}, body)


def get(url: str, query: str) -> tuple[int, Headers, bytes]:
    return request("GET", f"{url}?{query}")


def counts(url: str) -> tuple[int, int, int]:
    status, h, _ = head(url)
    assert status == 200
    return int(h["Stream-Record-First"]), int(h["Stream-Record-Next"]), int(h["Stream-Record-Count"])


def test_byte_stream_each_append_is_a_record(srv: ServerProcess) -> None:
    url = stream_url(srv.url, unique("rec"))
    assert create(url, BIN, b"a")[0] == 201  # the create's body is record 0
    status, h, _ = post(url, b"bc")
    assert status == 204 and h["Stream-Record-Next"] == "2"
    assert post(url, b"def")[1]["Stream-Record-Next"] == "3"
    assert counts(url) == (0, 3, 3)
    status, h, body = get(url, "record=1")
    assert (status, body, h["Stream-Record"]) == (200, b"bcdef", "1")
    assert h["Stream-Next-Offset"] == format_offset(6)
    status, h, body = get(url, "record=0")
    assert (body, h["Stream-Record"]) == (b"abcdef", "0")
    # At the next ordinal: an empty, up-to-date read; beyond it: 400.
    status, h, body = get(url, "record=3")
    assert (status, body, h["Stream-Record"], h["Stream-Up-To-Date"]) == (200, b"", "3", "true")
    status, _, body = get(url, "record=4")
    assert status == 400 and json.loads(body)["error"]["code"] == "OFFSET_BEYOND_TAIL"
    # A read from an offset inside a record names the record its first byte belongs to.
    status, h, body = get(url, f"offset={format_offset(4)}")
    assert (body, h["Stream-Record"]) == (b"ef", "2")
    assert get(url, f"offset={format_offset(3)}")[1]["Stream-Record"] == "2"
    assert get(url, "offset=now")[1]["Stream-Record"] == "3"
    for bad in ("record=x", "record=-1", f"record=1&offset={format_offset(0)}"):
        assert get(url, bad)[0] == 400, bad


def test_json_stream_each_message_is_a_record(srv: ServerProcess) -> None:
    url = stream_url(srv.url, unique("recj"))
    assert create(url, JSON)[0] == 201
    status, h, _ = post(url, b'[{"n": 0}, {"n": 1}, {"n": 2}]', JSON)
    assert status == 204 and h["Stream-Record-Next"] == "3"
    assert post(url, b'{"n": 3}', JSON)[1]["Stream-Record-Next"] == "4"
    assert counts(url) == (0, 4, 4)
    for n in range(5):
        status, h, body = get(url, f"record={n}")
        assert status == 200 and h["Stream-Record"] == str(n)
        assert json.loads(body) == [{"n": i} for i in range(n, 4)]


def test_retention_reports_the_first_retained_record_and_410s_below_it(srv: ServerProcess) -> None:
    name = unique("recr")
    url = stream_url(srv.url, name)
    create(url, BIN)
    for part in (b"aa", b"bbb", b"c", b"dddd"):
        post(url, part)
    status, _, _ = request(
        "POST",
        f"{srv.url}/v1/admin/retain/default/{name}",
        {"Content-Type": "application/json"},
        json.dumps({"offset": format_offset(5)}).encode(),
    )
    assert status == 204
    assert counts(url) == (2, 4, 2)
    status, h, body = get(url, "record=1")
    assert status == 410 and json.loads(body)["error"]["first_record"] == 2
    assert h["Stream-Next-Offset"] == format_offset(5)
    status, h, body = get(url, "record=2")
    assert (status, body, h["Stream-Record"]) == (200, b"cdddd", "2")
    assert get(url, "offset=-1")[1]["Stream-Record"] == "2"


def test_record_match_appends_only_at_the_expected_record(srv: ServerProcess) -> None:
    url = stream_url(srv.url, unique("recm"))
    create(url, JSON)
    assert post(url, b"[1, 2]", JSON, **{"Stream-Record-Match": "0"})[0] == 204
    status, h, body = post(url, b"[3]", JSON, **{"Stream-Record-Match": "0"})
    assert status == 412 and h["Stream-Record-Next"] == "2"
    assert json.loads(body)["error"] == {
        "code": "TAIL_MISMATCH",
        "message": json.loads(body)["error"]["message"],
        "next_offset": h["Stream-Next-Offset"],
        "record_next": 2,
    }
    assert post(url, b"[3]", JSON, **{"Stream-Record-Match": "2"})[0] == 204
    assert json.loads(get(url, "record=0")[2]) == [1, 2, 3]
    assert post(url, b"[4]", JSON, **{"Stream-Record-Match": "x"})[0] == 400


def test_a_fork_continues_its_sources_numbering(srv: ServerProcess) -> None:
    """In one engine (a cluster's fork in another shard copies the bytes and numbers them from 0: docs)."""
    src_name = unique("recsrc")
    src = stream_url(srv.url, src_name)
    create(src, BIN, b"a")
    post(src, b"bc")
    post(src, b"def")
    shard = shard_of(DEFAULT_BUCKET, src_name, deployments.CLUSTER_SHARDS)
    fork_name = next(
        n
        for n in (unique("recfork") for _ in range(1000))
        if shard_of(DEFAULT_BUCKET, n, deployments.CLUSTER_SHARDS) == shard
    )
    fork = stream_url(srv.url, fork_name)
    status = request(
        "PUT",
        fork,
        {
            "Content-Type": BIN,
            "Stream-Forked-From": src.split(srv.url)[1],
            "Stream-Fork-Offset": format_offset(3),
        },
    )[0]
    assert status == 201
    assert post(fork, b"X")[1]["Stream-Record-Next"] == "3"
    assert counts(fork) == (0, 3, 3)
    assert get(fork, "record=1")[2] == b"bcX"
    assert get(fork, "record=2")[1]["Stream-Record"] == "2"
    assert get(fork, "record=2")[2] == b"X"


def test_a_stream_created_again_at_its_path_starts_again_at_zero(srv: ServerProcess) -> None:
    url = stream_url(srv.url, unique("recinc"))
    create(url, BIN, b"old")
    post(url, b"older")
    assert request("DELETE", url)[0] == 204
    create(url, BIN, b"new")
    assert counts(url) == (0, 1, 1)
    status, h, body = get(url, "record=0")
    assert (body, h["Stream-Record"]) == (b"new", "0")


def test_sigkill_loses_no_acknowledged_record_and_ordinals_stay_dense(tmp_path: Path) -> None:
    """Concurrent appenders, SIGKILL at an arbitrary point; after restart every acknowledged append
    is the record its answer named, ordinals are dense, and numbering continues where it stopped."""
    srv = ServerProcess(tmp_path / "data", "--long-poll-timeout-s", "2").start()
    url = stream_url(srv.url, "kill/records")
    acked: dict[int, bytes] = {}  # the record an append's answer named -> its body
    lock = threading.Lock()
    try:
        assert create(url, BIN)[0] == 201

        def writer(w: int) -> None:
            for i in range(200):  # bounded
                body = f"<w{w} i{i}>".encode()
                try:
                    status, h, _ = post(url, body)
                except OSError:
                    return  # the server went away mid-request: not acknowledged
                if status != 204:
                    return
                with lock:
                    acked[int(h["Stream-Record-Next"]) - 1] = body

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        while True:  # kill once some appends are acknowledged, with the writers still going
            with lock:
                if len(acked) >= 150 or not any(t.is_alive() for t in threads):
                    break
            threading.Event().wait(0.01)
        srv.kill()
        for t in threads:
            t.join(60)
    finally:
        srv.kill()
    again = ServerProcess(srv.data_dir, "--long-poll-timeout-s", "2")
    again.port = srv.port
    again.start()
    try:
        first, next_, count = counts(url)
        assert first == 0 and count == next_ >= len(acked) > 0
        assert max(acked) < next_
        for ordinal, body in sorted(acked.items()):
            status, h, data = get(url, f"record={ordinal}")
            assert status == 200 and h["Stream-Record"] == str(ordinal)
            assert data.startswith(body), (ordinal, data[:40])
        # Dense: reading every record from 0 walks the stream exactly.
        whole = get(url, "record=0")[2]
        assert sum(1 for ordinal in range(next_) if get(url, f"record={ordinal}")[2]) == next_
        assert whole.count(b"<w") == next_
        # Numbering continues after the restart.
        assert post(url, b"after")[1]["Stream-Record-Next"] == str(next_ + 1)
    finally:
        again.stop()
