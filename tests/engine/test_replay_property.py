"""Replay, snapshots and restarts rebuild exactly the state that was live, after random histories.

Hypothesis draws histories against a real ``Node`` (journal, segment log, local
object store; no background jobs, a virtual clock): streams created, appended,
forked and deleted in several buckets; cold copies and hot trims; retention
policies and GC passes (with reconciliation); bucket erasure; pull-wake
subscriptions (created, woken, claimed, acked); consumer groups (created,
joined, heartbeats with commits, left, swept); retention advanced past
group cursors and subscription acked offsets (their skips journaled as
follow-ups, at sweeps, joins, heartbeats and claims). After each history the state's
fingerprint (every field of every object, extensions included) must be equal:

* live, and after an in-memory snapshot round trip;
* live, and recovered from the data dir after a crash (newest snapshot + replay);
* live, and replayed from the very first record, when the log still has it.

Tenants are in the histories too: tokens issued, revoked and rotated,
public-read flags, quota overrides (which then refuse some appends and
creates, changing nothing), recorded usage; appended bytes counted at apply.

So are idempotent producers, under a short producer TTL (30 s: an ``advance``
of 60 s expires them) and a cap of 2 per stream (a third producer evicts the
longest idle): next sequences, retries, epoch bumps, and the GC's expiry of
idle streams' producers. Their order on each stream (what the next eviction
takes) is compared too, not only their content.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gc_support import Harness, VirtualClock, make_config
from tests.support.state_fingerprint import fingerprint
from tiered.core.errors import TieredError
from tiered.engine.codec import RECORDS
from tiered.engine.engine import new_state, producer_limits
from tiered.engine.groups.state import CommitRequest, GroupSpec
from tiered.engine.journal.journal import Journal
from tiered.engine.journal.snapshot import SnapshotStore
from tiered.engine.snapshot import SNAPSHOTS, decode_snapshot, encode_snapshot
from tiered.engine.subscriptions.config import parse_config
from tiered.hot.log import SegmentLog

pytestmark = pytest.mark.timeout(600)

BUCKETS = ["default", "red"]
PATHS = ["jobs/a", "jobs/b", "other"]

op = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(BUCKETS), st.sampled_from(PATHS), st.binary(max_size=300)),
    st.tuples(
        st.just("append"),
        st.sampled_from(BUCKETS),
        st.sampled_from(PATHS),
        st.binary(min_size=1, max_size=900),
    ),
    st.tuples(
        st.just("append"),
        st.sampled_from(BUCKETS),
        st.sampled_from(PATHS),
        st.binary(min_size=1, max_size=900),
    ),
    st.tuples(st.just("fork"), st.sampled_from(BUCKETS), st.sampled_from(PATHS), st.integers(0, 2000)),
    st.tuples(st.just("delete"), st.sampled_from(BUCKETS), st.sampled_from(PATHS)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("policy"), st.sampled_from(BUCKETS), st.sampled_from([None, 0, 200, 5_000])),
    st.tuples(st.just("gc"), st.booleans()),
    st.tuples(st.just("advance"), st.sampled_from([500, 5_000, 60_000])),
    st.tuples(st.just("erase")),
    st.tuples(st.just("subscribe")),
    st.tuples(st.just("claim-ack")),
    st.tuples(st.just("group")),
    st.tuples(st.just("join"), st.sampled_from(["m1", "m2"])),
    st.tuples(st.just("heartbeat"), st.sampled_from(["m1", "m2"])),
    st.tuples(st.just("leave"), st.sampled_from(["m1", "m2"])),
    st.tuples(st.just("retain"), st.sampled_from(PATHS), st.sampled_from([0.5, 1.0])),
    st.tuples(st.just("sweep")),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("token"), st.sampled_from(BUCKETS), st.sampled_from(["read", "write", "admin"])),
    st.tuples(st.just("revoke"), st.integers(0, 3)),
    st.tuples(st.just("rotate"), st.integers(0, 3), st.sampled_from([0, 10])),
    st.tuples(st.just("public"), st.sampled_from(BUCKETS), st.booleans()),
    st.tuples(st.just("quota"), st.sampled_from(BUCKETS), st.sampled_from([None, 0, 1_000])),
    st.tuples(st.just("usage"), st.sampled_from(BUCKETS), st.integers(1, 5_000)),
    st.tuples(
        st.just("produce"),
        st.sampled_from(BUCKETS),
        st.sampled_from(PATHS),
        st.sampled_from(["p1", "p2", "p3"]),
        st.sampled_from(["next", "retry", "restart"]),
    ),
)
PRODUCER_TTL_S = 30.0
MAX_PRODUCERS = 2


async def apply_op(h: Harness, o: tuple[Any, ...]) -> None:
    node, clock = h.s, h.clock
    streams = node.streams
    kind = o[0]
    ct = "application/octet-stream"
    from tiered.engine.streams.model import AppendRequest, CreateRequest, ForkRequest

    if kind == "create":
        await streams.create(o[1], o[2], CreateRequest(ct, None, None, None, False, o[3]))
    elif kind == "append":
        await streams.append(o[1], o[2], AppendRequest(ct, o[3], False))
    elif kind == "fork":
        src = streams.lookup(o[1], o[2])
        offset = min(o[3], src.tail)
        await streams.create(
            o[1],
            f"fork-{o[2]}-{clock.ms}",
            CreateRequest(None, None, None, None, False, b"", ForkRequest(src.uid, offset, f"x@{offset}")),
        )
    elif kind == "delete":
        await streams.delete(o[1], o[2])
    elif kind == "flush":
        await h.flush()
    elif kind == "policy":
        await streams.set_retention(o[1], None, None, o[2])
    elif kind == "gc":
        await node.gc.run_pass(reconcile=o[1])
    elif kind == "advance":
        clock.advance(o[1])
    elif kind == "erase":
        await streams.erase_bucket("red")
    elif kind == "subscribe":
        cfg = parse_config({"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wakes"})
        await node.subscriptions.put("s1", cfg, "http://127.0.0.1", "http://127.0.0.1/jwks")
    elif kind == "claim-ack":
        from tiered.engine.subscriptions.config import WakeRequest

        claimed = await node.subscriptions.claim("s1", "worker")
        await node.subscriptions.ack(
            "s1",
            claimed["token"],
            WakeRequest(claimed["wake_id"], claimed["generation"], (), True),
            pull_only=True,
        )
    elif kind == "group":
        await node.groups.create("g1", GroupSpec(pattern="jobs/*"))
    elif kind == "join":
        await node.groups.join("g1", o[1], f"{o[1]}-join")
    elif kind in ("heartbeat", "leave"):
        g = node.groups.groups.get("g1")
        m = g.members[o[1]]
        commits = [
            CommitRequest(t.path, t.fence, 1)
            for t in g.targets.values()
            if t.holder == o[1] and t.holder_generation == m.generation
        ]
        if kind == "heartbeat":
            await node.groups.heartbeat("g1", o[1], g.incarnation, m.generation, commits, [], None, 0, None)
        else:
            await node.groups.leave("g1", o[1], g.incarnation, m.generation, commits)
    elif kind == "retain":
        s = streams.lookup("default", o[1])
        await streams.retain_from("default", o[1], s.retained_from + int((s.tail - s.retained_from) * o[2]))
    elif kind == "sweep":
        await node.groups.sweep()
    elif kind == "snapshot":
        await node.journal.snapshot(node.state)
    elif kind == "token":
        await node.auth.issue(o[1], o[2], "jobs" if o[2] == "read" else None, None, clock.ms + 60_000)
    elif kind in ("revoke", "rotate"):
        ids = sorted(node.auth.state.tokens)
        if ids:
            token_id = ids[o[1] % len(ids)]
            if kind == "revoke":
                await node.auth.revoke(token_id)
            else:
                await node.auth.rotate(token_id, o[2] * 1000)
    elif kind == "public":
        await node.auth.set_public_read(o[1], o[2])
    elif kind == "quota":
        await node.tenants.set_quotas(
            o[1], {} if o[2] is None else {"max_retained_bytes": o[2], "max_streams": None}
        )
    elif kind == "produce":
        from tiered.engine.streams import producers

        s = streams.lookup(o[1], o[2])
        p = producers.live_state(s.producers, o[3], clock.ms, node.state.producer_limits)
        epoch, seq = (0, 0) if p is None else (p.epoch, p.last_seq)
        if o[4] == "next" and p is not None:
            seq += 1
        elif o[4] == "restart":
            epoch, seq = epoch + 1, 0
        await streams.append(o[1], o[2], AppendRequest(ct, b"p", False, o[3], epoch, seq))
    elif kind == "usage":
        node.tenants.counter.egress(o[1], o[2], o[2] // 2)
        node.tenants.counter.request(o[1], "read")
        await node.tenants.record_usage()


def recovered(config: Any, *, from_genesis: bool) -> Any:
    data = config.data_path
    snapshots = SnapshotStore(data / ("no-snapshots" if from_genesis else "snapshots"), SNAPSHOTS)
    journal = Journal(SegmentLog(data / "hot", segment_bytes=config.segment_bytes), snapshots, RECORDS)
    limits = producer_limits(config)
    try:
        return journal.recover(read_only=True, new_state=lambda: new_state(limits))
    finally:
        journal.log.close()


def producer_order(state: Any) -> dict[int, list[str]]:
    """Each stream's producers in the order eviction and expiry take them (the fingerprint sorts dicts)."""
    return {uid: list(s.producers) for uid, s in state.streams.items() if s.producers}


async def run_history(data_dir: Path, history: list[tuple[Any, ...]]) -> dict[str, list[str]]:
    """Run the history and check every rebuilt state; returns each stream's producers, by path."""
    config = make_config(
        data_dir, gc_grace_s=1.0, producer_ttl_s=PRODUCER_TTL_S, max_producers_per_stream=MAX_PRODUCERS
    )
    h = Harness(config, clock=VirtualClock())
    await h.start()
    crashed = False
    try:
        await h.bucket("red")
        await h.create("default", "wakes", content_type="application/json")
        for o in history:
            try:
                await apply_op(h, o)
            except (TieredError, KeyError, AttributeError):
                pass  # refused (stream missing, no member...): nothing changed, the history goes on
        node = h.s
        live = fingerprint(node.state)
        # The derived index the flusher, trimmer and reaper scan names exactly the streams with hot chunks.
        with_chunks = sorted(uid for uid, st in node.state.streams.items() if len(st.chunks.starts))
        assert [st.uid for st in node.state.hot_resident()] == with_chunks
        order = producer_order(node.state)
        by_path = {f"{s.bucket}/{s.path}": list(s.producers) for s in node.state.streams.values()}
        position = node.journal.log.end
        limits = node.state.producer_limits
        round_trip, _ = decode_snapshot(encode_snapshot(node.state, position), lambda: new_state(limits))
        assert fingerprint(round_trip) == live, "the snapshot round trip lost something"
        assert producer_order(round_trip) == order, "the snapshot round trip reordered producers"
        await h.crash()
        crashed = True
        after_crash = recovered(config, from_genesis=False)
        assert fingerprint(after_crash) == live, "crash recovery differs from live"
        assert producer_order(after_crash) == order, "crash recovery reordered producers"
        if (config.data_path / "hot" / "00000000000000000001.seg").exists():
            replayed = recovered(config, from_genesis=True)
            assert fingerprint(replayed) == live, "full replay differs from live"
            assert producer_order(replayed) == order, "full replay reordered producers"
        return by_path
    finally:
        if not crashed:
            await h.stop()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=st.lists(op, min_size=5, max_size=40))
def test_replay_snapshot_and_restart_rebuild_the_live_state(history: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run_history(Path(tmp) / "data", history))


def test_a_fixed_history_touching_every_feature() -> None:
    history: list[tuple[Any, ...]] = [
        ("subscribe",),
        ("group",),
        ("join", "m1"),
        ("join", "m2"),
        ("create", "default", "jobs/a", b"a" * 100),
        ("create", "default", "jobs/b", b"b" * 50),
        ("create", "red", "other", b"r" * 70),
        ("append", "default", "jobs/a", b"x" * 400),
        ("fork", "default", "jobs/a", 120),
        ("flush",),
        ("policy", "default", 200),
        ("gc", True),
        ("claim-ack",),
        ("heartbeat", "m1"),
        ("heartbeat", "m2"),
        ("append", "default", "jobs/a", b"w" * 300),
        ("append", "default", "jobs/b", b"v" * 300),
        ("retain", "jobs/a", 0.5),  # past the groups' cursors and the subscription's acked offsets
        ("sweep",),
        ("claim-ack",),
        ("retain", "jobs/b", 1.0),
        ("heartbeat", "m1"),
        ("advance", 5_000),
        ("erase",),
        ("append", "default", "jobs/b", b"y" * 900),
        ("snapshot",),
        ("leave", "m2"),
        ("delete", "default", "jobs/a"),
        ("advance", 60_000),
        ("gc", True),
        ("flush",),
        ("token", "default", "write"),
        ("token", "red", "read"),
        ("rotate", 0, 10),
        ("public", "default", True),
        ("quota", "default", 1_000),
        ("append", "default", "jobs/b", b"z" * 900),
        ("usage", "default", 4_000),
        ("revoke", 1),
        ("snapshot",),
        ("usage", "default", 10),
        ("quota", "default", None),
        ("create", "default", "other", b""),
        ("produce", "default", "other", "p1", "next"),
        ("produce", "default", "other", "p2", "next"),
        ("produce", "default", "other", "p1", "next"),
        ("produce", "default", "other", "p3", "next"),  # evicts p2, the longest idle
        ("produce", "default", "other", "p1", "retry"),
        ("snapshot",),
        ("produce", "default", "jobs/b", "p1", "restart"),
        ("advance", 60_000),  # every producer expired
        ("produce", "default", "other", "p2", "next"),  # drops other's expired states
        ("gc", False),  # drops jobs/b's
        ("produce", "default", "other", "p3", "restart"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        producers = asyncio.run(run_history(Path(tmp) / "data", history))
    assert producers["default/other"] == ["p2", "p3"] and producers["default/jobs/b"] == []
