"""Header-derived state is bounded and charged (issue 18, defect 4).

Every distinct ``Producer-Id`` used to be kept forever (memory, journal,
snapshots) and charged to nothing: 1,500 one-byte appends with 65 KB ids
added 91 MB of RSS and 94 MB on disk against a 5,000-byte quota, and
``Content-Type`` (60 KB, echoed back) or ``Stream-Seq`` (400 KB) were accepted.

1. Protocol headers whose values are stored or echoed have documented length
   limits (``HEADER_LIMITS``, README "Limits"): beyond one, a 400 naming the
   header and the limit, and nothing changes.
2. Producer state per stream expires ``--producer-ttl-s`` after the producer's
   last accepted append and is capped at ``--max-producers-per-stream`` (a new
   producer at the cap evicts the longest idle one); either producer is then
   treated as new (protocol 5.2.1). All on a virtual clock, in the pure state
   machine: replay and snapshots rebuild the same producers in the same order.
3. Producer state counts towards the bucket's retained bytes (usage, and the
   ``max_retained_bytes`` quota: 507, exact, nothing written), after a restart too.
4. A soak of distinct producer ids against a quota on a real server: RSS and
   disk stay bounded, refusals are exact, after a SIGKILL and restart too.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.gc_support import HttpHarness, VirtualClock, make_config
from tests.support.server_process import ServerProcess
from tests.support.state_fingerprint import fingerprint
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.codec import decode_record, encode_record
from tiered.engine.streams.model import AppendRequest, CreateRequest, Duplicate
from tiered.engine.streams.records import Appended
from tiered.engine.streams.state import StreamState

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent.parent.parent
OCTET = {"Content-Type": "application/octet-stream"}
LIMITS = {
    "Producer-Id": 256,
    "Content-Type": 256,
    "Stream-Seq": 256,
    "Stream-Expires-At": 64,
    "Stream-Forked-From": 4096,
}
OVERHEAD = 24  # what a producer state costs beyond its id (README, "Idempotent producers")


# --------------------------------------------------------------------------- 1. header limits (pure)


def test_header_limits_are_the_documented_ones() -> None:
    from tiered.engine.streams.protocol import HEADER_LIMITS

    assert HEADER_LIMITS == LIMITS
    readme = (ROOT / "README.md").read_text()
    for name, limit in LIMITS.items():
        assert f"| `{name}` | {limit:,} bytes |" in readme, name


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_header_length_boundary_in_utf8_bytes(name: str) -> None:
    from tiered.engine.streams.protocol import check_header_lengths

    limit = LIMITS[name]
    check_header_lengths({name: "a" * limit})
    check_header_lengths({name: "é" * (limit // 2)})  # two bytes each: exactly the limit
    for value in ("a" * (limit + 1), "é" * (limit // 2) + "a", "a" * 500_000):
        with pytest.raises(TieredError) as err:
            check_header_lengths({"Other": "x", name: value})
        assert err.value.code is ErrorCode.BAD_REQUEST
        assert err.value.context == {"header": name, "limit": limit}
        assert name in err.value.message and f"{limit} bytes" in err.value.message


# --------------------------------------------------------------------------- 1. header limits over HTTP


def on_harness(
    **config: Any,
) -> Callable[[Callable[[HttpHarness], Awaitable[None]]], Callable[[Path], None]]:
    """A test running its body against a fresh in-process server (virtual clock) with bucket ``acme``."""

    def wrap(body: Callable[[HttpHarness], Awaitable[None]]) -> Callable[[Path], None]:
        def test(tmp_path: Path) -> None:
            async def main() -> None:
                h = HttpHarness(make_config(tmp_path / "data", **config), clock=VirtualClock())
                await h.start()
                try:
                    await h.bucket("acme")
                    await body(h)
                finally:
                    await h.stop()

            asyncio.run(main())

        test.__name__ = body.__name__
        test.__doc__ = body.__doc__
        return test

    return wrap


def url(path: str) -> str:
    return "/v1/buckets/acme/stream/" + path


def producer(pid: str, epoch: int = 0, seq: int = 0) -> dict[str, str]:
    return {**OCTET, "Producer-Id": pid, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


async def too_long(h: HttpHarness, method: str, path: str, headers: dict[str, str], name: str) -> None:
    """The request is a 400 naming ``name`` and its limit, and the state did not change."""
    before = fingerprint(h.s.state)
    status, _, body = await h.http(method, path, body=b"x", headers=headers)
    assert status == 400, body
    error = json.loads(body)["error"]
    assert (error["code"], error["header"], error["limit"]) == ("BAD_REQUEST", name, LIMITS[name])
    assert name in error["message"] and str(LIMITS[name]) in error["message"]
    assert fingerprint(h.s.state) == before


@on_harness()
async def test_stored_and_echoed_headers_are_limited(h: HttpHarness) -> None:
    assert (await h.http("PUT", url("s"), headers=OCTET))[0] == 201
    # Producer-Id: at the limit accepted, one byte more refused.
    assert (await h.http("POST", url("s"), body=b"a", headers=producer("p" * 256)))[0] == 200
    await too_long(h, "POST", url("s"), producer("p" * 257), "Producer-Id")
    await too_long(h, "POST", url("s"), producer("é" * 129), "Producer-Id")  # 258 bytes
    # Stream-Seq.
    assert (await h.http("POST", url("s"), body=b"b", headers={**OCTET, "Stream-Seq": "0" * 256}))[0] == 204
    await too_long(h, "POST", url("s"), {**OCTET, "Stream-Seq": "1" * 257}, "Stream-Seq")
    # Content-Type: stored by a create and echoed by every read.
    long_type = "application/octet-stream; x=" + "a" * (256 - 28)
    assert len(long_type) == 256
    assert (await h.http("PUT", url("t"), headers={"Content-Type": long_type}))[0] == 201
    assert (await h.http("GET", url("t") + "?offset=-1"))[1]["Content-Type"] == long_type
    await too_long(h, "PUT", url("u"), {"Content-Type": long_type + "a"}, "Content-Type")
    await too_long(h, "POST", url("t"), {"Content-Type": long_type + "a"}, "Content-Type")
    # Stream-Expires-At: echoed verbatim (RFC 3339 allows any number of fractional digits).
    stamp = "2099-01-01T00:00:00." + "0" * 43 + "Z"
    assert len(stamp) == 64
    assert (await h.http("PUT", url("e"), headers={**OCTET, "Stream-Expires-At": stamp}))[0] == 201
    assert (await h.http("HEAD", url("e")))[1]["Stream-Expires-At"] == stamp
    over = stamp[:-1] + "0Z"
    await too_long(h, "PUT", url("e2"), {**OCTET, "Stream-Expires-At": over}, "Stream-Expires-At")
    # Stream-Forked-From: a 1,024-byte stream name percent-encoded fits (3,096 bytes).
    name = "n" * 1024
    assert (await h.http("PUT", url(name), headers=OCTET))[0] == 201
    source = "/v1/buckets/acme/stream/" + "%6E" * 1024
    assert (await h.http("PUT", url("f"), headers={"Stream-Forked-From": source}))[0] == 201
    padded = source + "?" + "q" * (4096 - len(source))
    await too_long(h, "PUT", url("f2"), {"Stream-Forked-From": padded}, "Stream-Forked-From")


# --------------------------------------------------------------------------- 2. the state machine


class Machine:
    """A ``StreamState`` with producer limits, a journal of applied records and one stream ``s``."""

    def __init__(self, ttl_ms: int = 10_000, cap: int = 3) -> None:
        from tiered.engine.streams.producers import ProducerLimits

        self.limits = ProducerLimits(ttl_ms=ttl_ms, max_per_stream=cap)
        self.state = StreamState(producer_limits=self.limits)
        self.journal: list[tuple[Any, tuple[int, int] | None]] = []
        self.pos = 0
        create = CreateRequest(None, None, None, None, False, b"")
        self.commit(self.state.decide_create(DEFAULT_BUCKET, "s", create, 0)[0])

    def commit(self, records: list[Any]) -> None:
        for r in records:
            loc = None
            if getattr(r, "data", b""):
                loc, self.pos = (1, self.pos), self.pos + len(r.data) + 16
            self.state.apply(r, loc)
            self.journal.append((r, loc))

    @property
    def s(self) -> Any:
        return self.state.lookup(DEFAULT_BUCKET, "s", 0)

    def append(
        self, now: int, pid: str | None = None, epoch: int = 0, seq: int = 0, data: bytes = b"x"
    ) -> Appended | Duplicate:
        decided = self.state.decide_append(
            DEFAULT_BUCKET, "s", AppendRequest(None, data, False, pid, epoch, seq), now
        )
        if isinstance(decided, Appended):
            self.commit([decided])
        return decided

    def refused(self, now: int, pid: str, epoch: int = 0, seq: int = 0) -> TieredError:
        before = fingerprint(self.state)
        with pytest.raises(TieredError) as err:
            self.append(now, pid, epoch, seq)
        assert fingerprint(self.state) == before
        return err.value

    def replay(self) -> StreamState:
        fresh = StreamState(producer_limits=self.limits)
        for r, loc in self.journal:
            fresh.apply(decode_record(encode_record(r)), loc)
        return fresh


def cost(pid: str) -> int:
    return len(pid.encode()) + OVERHEAD


def test_idle_producer_state_expires_after_the_ttl() -> None:
    m = Machine(ttl_ms=10_000)
    assert isinstance(m.append(0, "p"), Appended)
    assert isinstance(m.append(5_000, "p", seq=1), Appended)
    # One millisecond before expiry: a retry is still a duplicate.
    dup = m.append(14_999, "p", seq=1)
    assert isinstance(dup, Duplicate) and (dup.epoch, dup.seq) == (0, 1)
    # Expired: the producer is new. A sequence past 0 is refused (its session is gone), seq 0 starts
    # afresh in whatever epoch it names (no stale-epoch fencing against forgotten state).
    err = m.refused(15_000, "p", seq=2)
    assert err.code is ErrorCode.BAD_REQUEST and "no state for this producer" in err.message
    assert isinstance(m.append(15_000, "p", epoch=0, seq=0), Appended)
    assert (m.s.producers["p"].epoch, m.s.producers["p"].last_seq, m.s.producers["p"].last_ms) == (
        0,
        0,
        15_000,
    )
    assert m.s.producer_bytes == cost("p")


def test_an_expired_producer_may_restart_in_any_epoch() -> None:
    m = Machine(ttl_ms=1_000)
    m.append(0, "p", epoch=5)
    assert m.refused(999, "p", epoch=4).code is ErrorCode.STALE_PRODUCER_EPOCH
    assert isinstance(m.append(1_000, "p", epoch=0), Appended)


def test_appends_drop_every_expired_state_of_their_stream() -> None:
    m = Machine(ttl_ms=1_000, cap=10)
    m.append(0, "a")
    m.append(1, "b")
    m.append(600, "c")
    assert m.s.producer_bytes == 3 * cost("a")
    m.append(1_001, None)  # a plain append at b's expiry
    assert list(m.s.producers) == ["c"] and m.s.producer_bytes == cost("c")


def test_a_new_producer_at_the_cap_evicts_the_longest_idle() -> None:
    m = Machine(ttl_ms=1_000_000, cap=3)
    for t, pid in enumerate("abc"):
        m.append(t, pid)
    m.append(3, "a", seq=1)  # a is now the most recently used
    assert list(m.s.producers) == ["b", "c", "a"]
    m.append(4, "d")
    assert list(m.s.producers) == ["c", "a", "d"] and m.s.producer_bytes == 3 * cost("a")
    # b is new again: its next sequence is refused, a restart at 0 is accepted (a new session).
    assert m.refused(5, "b", seq=1).code is ErrorCode.BAD_REQUEST
    assert isinstance(m.append(5, "b"), Appended)
    assert list(m.s.producers) == ["a", "d", "b"]
    # Producers with state keep exactly-once: a's retry is still a duplicate.
    assert isinstance(m.append(6, "a", seq=1), Duplicate)


def test_times_never_go_back_so_the_order_stays_by_time() -> None:
    m = Machine(ttl_ms=1_000, cap=5)
    m.append(500, "a")
    m.append(100, "b")  # the clock stepped back
    assert [p.last_ms for p in m.s.producers.values()] == [500, 500]
    m.append(1_500, None)
    assert list(m.s.producers) == []


def test_gc_sweep_releases_idle_streams_producers() -> None:
    from tiered.engine.streams.appends import decide_producers_expired
    from tiered.engine.streams.records import ProducersExpired

    m = Machine(ttl_ms=1_000, cap=5)
    m.append(0, "a")
    m.append(500, "b")
    assert decide_producers_expired(m.state, 999, 100) is None
    record = decide_producers_expired(m.state, 1_000, 100)
    assert record == ProducersExpired(ts_ms=1_000, uids=(m.s.uid,))
    m.commit([record])
    assert list(m.s.producers) == ["b"] and m.s.producer_bytes == cost("b")
    m.commit([ProducersExpired(ts_ms=2_000, uids=(m.s.uid, 999))])  # a uid gone meanwhile: ignored
    assert m.s.producers == {} and m.s.producer_bytes == 0


def test_a_soft_deleted_stream_keeps_no_producer_state() -> None:
    from tiered.engine.streams.model import ForkRequest

    m = Machine()
    m.append(0, "a")
    fork = CreateRequest(None, None, None, None, False, b"", ForkRequest(m.s.uid, 1, "s@1"))
    m.commit(m.state.decide_create(DEFAULT_BUCKET, "fork", fork, 1)[0])
    assert m.state.lookup(DEFAULT_BUCKET, "fork", 1).producers == {}  # forks never inherit them
    uid = m.s.uid
    m.commit([m.state.decide_delete(DEFAULT_BUCKET, "s", 2)])
    gone = m.state.streams[uid]
    assert gone.soft_deleted and gone.producers == {} and gone.producer_bytes == 0


ops = st.lists(
    st.tuples(
        st.sampled_from([None, "a", "b", "c", "d", "e", "ééé"]),
        st.integers(0, 700),  # ms since the previous append (the TTL is 1,000)
        st.integers(0, 2),  # epoch
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(history=ops, cap=st.integers(1, 4))
def test_plan_charges_exactly_what_apply_changes_and_replay_rebuilds_it(
    history: list[tuple[str | None, int, int]], cap: int
) -> None:
    from tiered.engine.snapshot import decode_snapshot, encode_snapshot
    from tiered.engine.streams import producers
    from tiered.engine.streams.appends import producer_change
    from tiered.hot.log import LogPosition

    m = Machine(ttl_ms=1_000, cap=cap)
    now = 0
    for pid, dt, epoch in history:
        now += dt
        s = m.s
        p = producers.live_state(s.producers, pid, now, m.limits) if pid is not None else None
        seq = 0 if p is None or epoch != p.epoch else p.last_seq + 1
        try:
            decided = m.state.decide_append(
                DEFAULT_BUCKET, "s", AppendRequest(None, b"x", False, pid, epoch, seq), now
            )
        except TieredError as exc:
            assert exc.code is ErrorCode.STALE_PRODUCER_EPOCH
            continue
        assert isinstance(decided, Appended)
        before = s.producer_bytes
        change = producer_change(m.state, s, decided)
        m.commit([decided])
        assert s.producer_bytes == before + change.bytes_delta == producers.total_bytes(s.producers)
        assert len(s.producers) <= cap
        times = [q.last_ms for q in s.producers.values()]
        assert times == sorted(times)
        assert all(now - t < 1_000 for t in times)  # nothing expired is kept past an append
    live = fingerprint(m.state)
    replayed = m.replay()
    assert fingerprint(replayed) == live
    assert list(replayed.streams[m.s.uid].producers) == list(m.s.producers)  # the order is state too
    restored, _ = decode_snapshot(
        encode_snapshot(m.state, LogPosition(1, 0)), lambda: StreamState(producer_limits=m.limits)
    )
    assert fingerprint(restored) == live
    assert list(restored.streams[m.s.uid].producers) == list(m.s.producers)


def test_snapshots_written_before_producer_expiry_still_load() -> None:
    """Their producers were (epoch, seq) pairs: they count as last seen at the stream's last access."""
    from tiered.engine import snapshot as snap
    from tiered.engine.journal.snapshot import HEADER, MAGIC
    from tiered.hot.log import LogPosition
    from tiered.hot.segment import crc32c

    m = Machine()
    m.append(7, "a", epoch=2)
    m.append(9, None)
    data = snap.encode_snapshot(m.state, LogPosition(1, 0))
    body = snap.decode_body(data[HEADER.size :])
    for n in body.streams:
        n.producers = {k: (v.epoch, v.last_seq) for k, v in n.producers.items()}  # pairs, as they were
    old_body = snap.encode_body(body)
    old = HEADER.pack(MAGIC, snap.SNAPSHOT_VERSION, crc32c(old_body)) + old_body
    restored, _ = snap.decode_snapshot(old)
    s = restored.streams[m.s.uid]
    assert (s.producers["a"].epoch, s.producers["a"].last_seq, s.producers["a"].last_ms) == (2, 0, 9)
    assert s.producer_bytes == cost("a")


# --------------------------------------------------------------------------- 3. charged to the bucket


async def usage(h: HttpHarness) -> dict[str, int]:
    status, _, body = await h.http("GET", "/v1/admin/usage?bucket=acme")
    assert status == 200, body
    retained: dict[str, int] = json.loads(body)["buckets"][0]["retained_bytes"]
    return retained


async def refused_by_quota(h: HttpHarness, path: str, headers: dict[str, str], body: bytes = b"x") -> None:
    before = fingerprint(h.s.state)
    status, _, raw = await h.http("POST", path, body=body, headers=headers)
    assert status == 507, raw
    error = json.loads(raw)["error"]
    assert (error["code"], error["quota"], error["limit"]) == ("QUOTA_EXCEEDED", "max_retained_bytes", 1_000)
    assert fingerprint(h.s.state) == before


@on_harness(producer_ttl_s=60.0)
async def test_producer_state_counts_towards_retained_bytes_exactly(h: HttpHarness) -> None:
    assert (await h.http("PUT", "/v1/admin/quotas/acme", json_body={"max_retained_bytes": 1_000}))[0] == 200
    assert (await h.http("PUT", url("s"), headers=OCTET))[0] == 201
    ids = [f"{i:0100d}" for i in range(20)]  # 100 bytes: 124 of state, plus 1 byte of data = 125
    for pid in ids[:8]:
        assert (await h.http("POST", url("s"), body=b"x", headers=producer(pid)))[0] == 200
    assert await usage(h) == {
        "hot": 8,
        "cold": 0,
        "producers": 8 * 124,
        "snapshots": 0,
        "key_index": 0,
    }  # exactly the quota
    await refused_by_quota(h, url("s"), producer(ids[8]))  # a new producer's state does not fit
    await refused_by_quota(h, url("s"), {**OCTET, "Stream-Closed": "true", **producer(ids[8])}, b"")
    await refused_by_quota(h, url("s"), producer(ids[0], seq=1))  # its byte of data does not fit either
    assert (await h.http("POST", url("s"), body=b"x", headers=producer(ids[0])))[0] == 204  # a retry
    # The state expires: the next append drops it (its own state charged, the others released).
    h.clock.advance(60_000)
    assert (await h.http("POST", url("s"), body=b"x", headers=producer(ids[9])))[0] == 200
    assert await usage(h) == {"hot": 9, "cold": 0, "producers": 124, "snapshots": 0, "key_index": 0}
    await h.restart(crash=True)
    assert await usage(h) == {"hot": 9, "cold": 0, "producers": 124, "snapshots": 0, "key_index": 0}
    for pid in ids[10:17]:  # 9 + 124 + 7 * 125 = 1,008 > 1,000: six fit, the seventh is refused
        status = (await h.http("POST", url("s"), body=b"x", headers=producer(pid)))[0]
        if pid == ids[16]:
            assert status == 507
        else:
            assert status == 200
    assert await usage(h) == {"hot": 15, "cold": 0, "producers": 7 * 124, "snapshots": 0, "key_index": 0}
    # A stream nobody writes to any more lets go at the next GC pass.
    h.clock.advance(60_000)
    report = await h.gc(h.clock.ms)
    assert report.producer_states_expired == 7
    assert await usage(h) == {"hot": 15, "cold": 0, "producers": 0, "snapshots": 0, "key_index": 0}
    await h.restart(crash=True)
    assert await usage(h) == {"hot": 15, "cold": 0, "producers": 0, "snapshots": 0, "key_index": 0}


@on_harness(max_producers_per_stream=4)
async def test_the_cap_per_stream_over_http(h: HttpHarness) -> None:
    assert (await h.http("PUT", url("s"), headers=OCTET))[0] == 201
    for i in range(10):
        assert (await h.http("POST", url("s"), body=b"x", headers=producer(f"p{i}")))[0] == 200
    assert await usage(h) == {
        "hot": 10,
        "cold": 0,
        "producers": 4 * (2 + OVERHEAD),
        "snapshots": 0,
        "key_index": 0,
    }
    status, _, body = await h.http("POST", url("s"), body=b"x", headers=producer("p0", seq=1))
    assert status == 400 and "evicted" in json.loads(body)["error"]["message"]
    assert (await h.http("POST", url("s"), body=b"x", headers=producer("p9", seq=1)))[0] == 200
    metrics = (await h.http("GET", "/metrics"))[2].decode()
    assert 'tiered_producer_states_dropped_total{reason="cap"} 6.0' in metrics
    assert "tiered_producer_states 4.0" in metrics
    assert 'tiered_bucket_retained_bytes{bucket="acme",tier="producers"} 104.0' in metrics


# --------------------------------------------------------------------------- 4. the soak


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def disk_bytes(root: Path) -> int:
    """Bytes the data dir takes on disk (allocated blocks: a preallocated segment counts as written)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


class Client:
    """A keep-alive HTTP/1.1 connection (thousands of requests, little connection churn).

    A request refused before its body was read (a 400 from a header) may end
    its connection after the answer: the next request then finds it closed
    before anything was sent, and goes again on a new connection, once.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def send(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, bytes]:
        for attempt in (1, 2):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                resp = self.conn.getresponse()
                return resp.status, resp.read()
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


QUOTA = 50_000
ID_BYTES = 200
PER_APPEND = ID_BYTES + OVERHEAD + 1  # a new producer's state and one byte of data: 225
FITS = QUOTA // PER_APPEND  # 222 appends (49,950 bytes); the 223rd would reach 50,175


def test_soak_distinct_producer_ids_against_a_quota(tmp_path: Path) -> None:
    data = tmp_path / "data"
    args = ("--quota-max-retained-bytes", str(QUOTA), "--long-poll-timeout-s", "2")
    srv = ServerProcess(data, *args).start()
    deadline = time.monotonic() + 240  # bounded in time as well as in count
    try:
        assert srv.proc is not None
        c = Client(srv.port)
        assert c.send("PUT", "/v1/stream/soak", OCTET)[0] == 201
        for i in range(200):  # warm up the paths the soak takes (each refused, nothing kept)
            c.send("POST", "/v1/stream/soak", producer("w" * 300), b"x")
            c.send("POST", "/v1/stream/soak", producer(f"w{i}", seq=3), b"x")
        rss0, disk0 = rss_kib(srv.proc.pid), disk_bytes(data)
        # The issue's reproduction: 64 KB producer ids are refused before anything keeps them.
        big = 0
        for i in range(500):
            status, body = c.send("POST", "/v1/stream/soak", producer(f"{i:065536d}"), b"x")
            assert status == 400 and json.loads(body)["error"]["header"] == "Producer-Id", (i, body[:200])
            big += 1
        assert time.monotonic() < deadline
        # Distinct ids within the limit: exactly what the quota holds is accepted, every other append 507.
        outcomes: dict[int, int] = {}
        for i in range(3_000):
            status, body = c.send("POST", "/v1/stream/soak", producer(f"{i:0{ID_BYTES}d}"), b"x")
            outcomes[status] = outcomes.get(status, 0) + 1
            if i < FITS:
                assert status == 200, (i, body)
            else:
                assert status == 507 and json.loads(body)["error"]["quota"] == "max_retained_bytes", (i, body)
            assert time.monotonic() < deadline
        assert outcomes == {200: FITS, 507: 3_000 - FITS}
        rss1, disk1 = rss_kib(srv.proc.pid), disk_bytes(data)
        # At the quota, more distinct ids keep nothing at all (the first flush above loaded pyarrow).
        for i in range(3_000, 5_000):
            assert c.send("POST", "/v1/stream/soak", producer(f"{i:0{ID_BYTES}d}"), b"x")[0] == 507
            assert time.monotonic() < deadline
        rss2, disk2 = rss_kib(srv.proc.pid), disk_bytes(data)
        status, body = c.send("GET", "/v1/admin/usage?bucket=default", {})
        row = json.loads(body)["buckets"][0]
        retained = row["retained_bytes"]
        assert retained["hot"] + retained["cold"] == FITS and retained["producers"] == FITS * (
            ID_BYTES + OVERHEAD
        )
        metrics = c.send("GET", "/metrics", {})[1].decode()
        line = 'tiered_bucket_quota_refusals_total{bucket="default",quota="max_retained_bytes"}'
        assert f"{line} {5_000 - FITS}.0" in metrics
        c.close()
        # 500 x 64 KB ids used to add 32 MB to memory and to the journal; 222 small states are ~60 KB.
        print(
            f"soak: RSS {rss0} -> {rss1} -> {rss2} KiB, disk {disk0} -> {disk1} -> {disk2} bytes, "
            f"{big} ids of 64 KB refused, {FITS} accepted, {5_000 - FITS} refused by the quota"
        )
        assert rss1 - rss0 < 16 * 1024, (rss0, rss1)
        assert rss2 - rss1 < 2 * 1024, (rss1, rss2)
        # (the usage recorder journals a small record every 10 s: a block or two, never one per request)
        assert disk1 - disk0 < 1024 * 1024 and disk2 - disk1 < 64 * 1024, (disk0, disk1, disk2)
        # SIGKILL, restart: the same usage, the same exact boundary.
        srv.kill()
        srv = ServerProcess(data, *args).start()
        assert srv.proc is not None
        c = Client(srv.port)
        row2 = json.loads(c.send("GET", "/v1/admin/usage?bucket=default", {})[1])["buckets"][0]
        assert row2["retained_bytes"] == retained
        assert c.send("POST", "/v1/stream/soak", producer("n" * ID_BYTES), b"x")[0] == 507
        room = QUOTA - FITS * PER_APPEND  # 50 bytes: producers with state may still append data
        assert c.send("POST", "/v1/stream/soak", producer(f"{0:0{ID_BYTES}d}", seq=1), b"y" * room)[0] == 200
        assert c.send("POST", "/v1/stream/soak", producer(f"{1:0{ID_BYTES}d}", seq=1), b"z")[0] == 507
        c.close()
        print(
            f"soak: after SIGKILL and restart RSS {rss_kib(srv.proc.pid)} KiB, disk {disk_bytes(data)} bytes"
        )
    finally:
        srv.stop()
