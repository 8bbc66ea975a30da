"""The cluster protocol's pure parts, one module at a time (no I/O), and the in-memory store."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import (
    AlreadyExists,
    CasUnavailable,
    ConcurrentWrite,
    Fault,
    Listed,
    MemoryCasStore,
    ObjectStoreCas,
    OutcomeUnknown,
    PreconditionFailed,
    md5_etag,
)
from tiered.cluster.membership.heartbeat import (
    HeartbeatBody,
    HeartbeatRecord,
    Liveness,
    PeerView,
    decode_heartbeat,
    encode_heartbeat,
    plan_beat,
    plan_declare_dead,
    plan_join,
    plan_stop,
)
from tiered.cluster.membership.lease import (
    AckWindow,
    Hold,
    LeaseBody,
    LeaseRecord,
    LeaseTiming,
    decode_lease,
    encode_lease,
    landed,
    plan_release,
    plan_renew,
    plan_take,
)
from tiered.cluster.membership.manifest import (
    EntryKind,
    ManifestEntry,
    ManifestWriter,
    WriteResult,
    check_chain,
    decode_entry,
    encode_entry,
)
from tiered.cluster.membership.placement import assignment, moved, owner
from tiered.cluster.membership.shards import (
    MAX_SHARDS,
    ClusterSpec,
    check_shard_count,
    decode_spec,
    encode_spec,
    resolve_spec,
    shard_of,
)
from tiered.cold.objects.localdir import LocalDirStore
from tiered.core.errors import ErrorCode, TieredError

TIMING = LeaseTiming(ttl_s=10.0, margin_s=2.0)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


# -- cas: the in-memory store and its faults -------------------------------------------------


def test_memory_store_create_compare_and_set_list_delete() -> None:
    async def scenario() -> None:
        store = MemoryCasStore()
        etag = await store.put_if_absent("k/a", b"one")
        assert etag == md5_etag(b"one")
        with pytest.raises(AlreadyExists):
            await store.put_if_absent("k/a", b"two")
        with pytest.raises(PreconditionFailed):
            await store.put_if_match("k/a", b"two", "not-the-etag")
        with pytest.raises(PreconditionFailed):
            await store.put_if_match("k/missing", b"two", etag)
        new = await store.put_if_match("k/a", b"two", etag)
        found = await store.get("k/a")
        assert found is not None and (found.data, found.etag) == (b"two", new)
        with pytest.raises(PreconditionFailed):
            await store.put_if_match("k/a", b"three", etag)  # the old version is gone: no ABA
        await store.put_if_absent("k/b", b"b")
        await store.put_if_absent("other", b"o")
        assert await store.list("k/") == [Listed("k/a", new), Listed("k/b", md5_etag(b"b"))]
        await store.delete("k/a")
        await store.delete("k/a")  # missing is fine
        assert await store.get("k/a") is None
        assert store.history["k/a"] == [b"one", b"two"]

    run(scenario())


def test_memory_store_faults_do_what_real_stores_do() -> None:
    async def scenario() -> None:
        store = MemoryCasStore()
        store.inject(Fault.LOST)
        with pytest.raises(OutcomeUnknown):
            await store.put_if_absent("a", b"1")
        assert (await store.get("a")) is not None  # applied, answer lost

        store.inject(Fault.DROPPED)
        with pytest.raises(OutcomeUnknown):
            await store.put_if_absent("b", b"1")
        assert await store.get("b") is None  # never arrived

        store.inject(Fault.CONFLICT_409)
        with pytest.raises(ConcurrentWrite):
            await store.put_if_absent("b", b"1")
        assert await store.get("b") is None

        store.inject(Fault.APPLIED_412)
        with pytest.raises(AlreadyExists):
            await store.put_if_absent("b", b"mine")
        found = await store.get("b")
        assert found is not None and found.data == b"mine"  # applied, then a retry's refusal

        # Delayed: refused now, applied later with its original condition.
        etag = found.etag
        store.inject(Fault.DELAYED, "b")
        with pytest.raises(OutcomeUnknown):
            await store.put_if_match("b", b"late", etag)
        assert store.deliver_delayed() is True
        found = await store.get("b")
        assert found is not None and found.data == b"late"
        store.inject(Fault.DELAYED)
        with pytest.raises(OutcomeUnknown):
            await store.put_if_match("b", b"stale", etag)  # etag no longer current
        assert store.deliver_delayed() is False

        # Targeted by key prefix; reads fail only with read faults.
        store.inject(Fault.UNAVAILABLE, "x/")
        await store.put_if_absent("y", b"y")
        assert await store.get("y") is not None
        with pytest.raises(CasUnavailable):
            await store.list("x/")
        assert not store.faults

    run(scenario())


def test_the_adapter_refuses_a_store_without_compare_and_set() -> None:
    class PutOnly:
        async def put(self, key: str, data: bytes) -> None: ...

    with pytest.raises(ValueError, match="compare-and-set"):
        ObjectStoreCas(PutOnly())  # type: ignore[arg-type]


def test_the_adapter_over_the_local_directory_store(tmp_path: Path) -> None:
    """Every ObjectStore has conditional writes now; the local one serves the protocol too."""

    async def scenario() -> None:
        cas = ObjectStoreCas(LocalDirStore(tmp_path))
        etag = await cas.put_if_absent("k", b"one")
        with pytest.raises(AlreadyExists):
            await cas.put_if_absent("k", b"two")
        etag2 = await cas.put_if_match("k", b"two", etag)
        with pytest.raises(PreconditionFailed):
            await cas.put_if_match("k", b"three", etag)
        got = await cas.get("k")
        assert got is not None and got.data == b"two" and got.etag == etag2

    run(scenario())


# -- keys -----------------------------------------------------------------------------------


def test_keys_round_trip_and_sort_numerically() -> None:
    assert keys.node_of_key(keys.node_key("n-1")) == "n-1"
    assert keys.node_of_key(keys.LEASES + "0001.json") is None
    assert keys.shard_of_lease_key(keys.lease_key(17)) == 17
    assert keys.shard_of_lease_key(keys.LEASES + "x.json") is None
    assert keys.seq_of_manifest_key(keys.manifest_key(3, 12)) == 12
    assert sorted(keys.manifest_key(0, n) for n in (10, 9, 100)) == [
        keys.manifest_key(0, n) for n in (9, 10, 100)
    ]
    assert keys.manifest_key(1, 1).startswith(keys.manifest_prefix(1))
    assert not keys.manifest_key(10, 1).startswith(keys.manifest_prefix(1))


# -- shards ---------------------------------------------------------------------------------


def test_shard_of_is_pinned_stable_and_separates_bucket_from_path() -> None:
    # Pinned: a change here would move every stream of every existing cluster.
    assert [shard_of("default", p, 64) for p in ("a", "b", "orders/2024", "é/x")] == [19, 29, 17, 55]
    assert shard_of("acme", "logs/app", 4096) == 2214
    assert shard_of("a", "b/c", 4096) != shard_of("a/b", "c", 4096)
    counts = Counter(shard_of("b", f"stream-{i}", 16) for i in range(16_000))
    assert set(counts) == set(range(16)) and max(counts.values()) < 1.15 * 1000


def test_the_shard_count_is_fixed_at_creation() -> None:
    assert check_shard_count(1) == 1 and check_shard_count(MAX_SHARDS) == MAX_SHARDS
    for bad in (0, -1, MAX_SHARDS + 1):
        with pytest.raises(TieredError) as err:
            check_shard_count(bad)
        assert err.value.code is ErrorCode.BAD_REQUEST
    spec = decode_spec(encode_spec(ClusterSpec("c1", 8, 1)))
    assert resolve_spec(spec, None) is spec and resolve_spec(spec, 8) is spec
    with pytest.raises(TieredError) as err:
        resolve_spec(spec, 16)
    assert err.value.code is ErrorCode.BAD_REQUEST and err.value.context["shard_count"] == 8
    for damaged in (
        b"{",
        b'{"cluster_id":"c","shard_count":0,"created_ms":1}',
        encode_spec(ClusterSpec("c", 8, 1, 2)),
    ):
        with pytest.raises(TieredError) as err:
            decode_spec(damaged)
        assert err.value.code is ErrorCode.DATA_DAMAGED


# -- lease ----------------------------------------------------------------------------------


def test_lease_timing_and_the_ack_window() -> None:
    for ttl, margin in ((10, 0), (10, 5), (10, -1), (math.inf, 1)):
        with pytest.raises(ValueError):
            LeaseTiming(ttl, margin)
    assert TIMING.ack_deadline(100.0) == 108.0 and TIMING.stale_after_s == 12.0
    window = AckWindow()
    assert not window.allows(0.0)
    window.extend(100.0, TIMING)
    window.extend(90.0, TIMING)  # an older renewal never shortens it
    assert window.allows(107.9) and not window.allows(108.0)
    window.close()
    assert not window.allows(100.0)


@given(
    sent=st.floats(0, 1e6),
    to_effect=st.floats(0, 60),
    to_observed=st.floats(0, 60),
    holder_rate=st.floats(0.99, 1.01),
    peer_rate=st.floats(0.99, 1.01),
    ttl=st.floats(1, 60),
    margin_share=st.floats(0.05, 0.45),
)
def test_a_holder_window_closes_before_any_peer_may_take_over(
    sent: float,
    to_effect: float,
    to_observed: float,
    holder_rate: float,
    peer_rate: float,
    ttl: float,
    margin_share: float,
) -> None:
    """The clock argument, in real time: the holder's window ends before the peer's wait does.

    A renewal sent at real time ``sent`` lands ``to_effect`` later; a peer's
    read returns it ``to_observed`` after that. Each clock runs at its own rate
    (1 % drift, far beyond NTP-disciplined clocks) from its own origin.
    """
    timing = LeaseTiming(ttl, ttl * margin_share)
    holder_window_real = (timing.ack_deadline(holder_rate * sent) - holder_rate * sent) / holder_rate
    holder_last_ack = sent + holder_window_real
    observed = sent + to_effect + to_observed
    peer_takeover = observed + timing.stale_after_s / peer_rate
    assert holder_last_ack < peer_takeover


def _lease(
    epoch: int, owner: str = "n1", incarnation: int = 1, nonce: str = "x", etag: str = "e"
) -> LeaseRecord:
    return LeaseRecord(LeaseBody(epoch, owner, incarnation, f"http://{owner}", nonce), etag)


def test_acquire_take_over_renew_release() -> None:
    first = plan_take(3, None, owner="n1", incarnation=1, advertise_url="u1", nonce="a")
    assert (first.body.epoch, first.if_match, first.body.owner) == (1, None, "n1")
    over = plan_take(3, _lease(4, etag="E4"), owner="n2", incarnation=7, advertise_url="u2", nonce="b")
    assert (over.body.epoch, over.if_match, over.body.incarnation) == (5, "E4", 7)
    floored = plan_take(3, _lease(4), owner="n2", incarnation=7, advertise_url="u2", nonce="c", epoch_floor=9)
    assert floored.body.epoch == 10
    hold = Hold.won(over, "E5")
    renew = plan_renew(hold, owner="n2", incarnation=7, advertise_url="u3", nonce="d")
    assert (renew.body.epoch, renew.if_match, renew.body.advertise_url) == (5, "E5", "u3")
    release = plan_release(hold, nonce="e")
    assert (release.body.epoch, release.if_match, release.body.free) == (5, "E5", True)
    assert landed(release, LeaseRecord(release.body, "E6"))
    assert not landed(release, _lease(6, nonce="someone-else")) and not landed(release, None)
    assert decode_lease(encode_lease(over.body), 3) == over.body
    for damaged in (b"[]", encode_lease(LeaseBody(0, "n", 1, "", "x"))):
        with pytest.raises(TieredError) as err:
            decode_lease(damaged, 3)
        assert err.value.code is ErrorCode.DATA_DAMAGED


# -- heartbeat ------------------------------------------------------------------------------


def _hb(
    node: str, incarnation: int, state: Liveness = Liveness.ALIVE, beat: int = 0, etag: str = ""
) -> HeartbeatRecord:
    body = HeartbeatBody(node, incarnation, state, beat, f"nonce-{incarnation}-{beat}-{state}")
    return HeartbeatRecord(body, etag or f"{node}-{incarnation}-{beat}-{state}")


def test_peer_view_judges_by_its_own_clock_from_the_first_sight_of_a_version() -> None:
    view = PeerView(TIMING)
    view.observe("n2", _hb("n2", 1, beat=1), at=100.0)
    view.observe("n2", _hb("n2", 1, beat=1), at=105.0)  # the same version again: the clock keeps running
    assert view.unchanged_for("n2", 111.9) == pytest.approx(11.9)
    assert view.alive("n2", 111.9) and not view.stale("n2", 111.9)
    assert view.stale("n2", 112.0) and not view.alive("n2", 112.0)
    assert view.suspects(112.0) == ["n2"] and view.live_nodes(112.0) == []
    view.observe("n2", _hb("n2", 1, beat=2), at=113.0)  # a new beat resets it
    assert view.alive("n2", 124.9) and view.suspects(124.9) == []
    assert not view.is_dead("n2", 1)
    view.observe("n2", _hb("n2", 1, Liveness.DEAD, beat=3), at=126.0)
    assert view.is_dead("n2", 1) and not view.alive("n2", 126.0) and view.suspects(200.0) == []
    view.observe("n2", _hb("n2", 2), at=127.0)  # rejoined: incarnation 1 stays dead
    assert view.is_dead("n2", 1) and not view.is_dead("n2", 2) and view.alive("n2", 127.0)
    view.observe("n3", _hb("n3", 5, Liveness.STOPPED), at=1.0)
    assert view.is_dead("n3", 5) and view.is_dead("n3", 4) and not view.is_dead("n3", 6)
    view.observe("n4", _hb("n4", 3), at=1.0)  # seeing incarnation 3 proves 1 and 2 are over
    assert view.is_dead("n4", 2) and not view.is_dead("n4", 3)
    assert not view.is_dead("unknown", 1) and view.unchanged_for("unknown", 5.0) == 0.0
    view.observe("n5", None, at=10.0)
    assert not view.stale("n5", 21.9) and view.stale("n5", 22.0)


def test_join_waits_out_a_previous_incarnation_that_may_still_run() -> None:
    view = PeerView(TIMING)
    fresh = plan_join("n1", None, view, 0.0, incarnation_floor=0, advertise_url="u", nonce="a")
    assert fresh is not None and (fresh.body.incarnation, fresh.if_match) == (1, None)
    # No heartbeat, but a lease names incarnation 4: wait until the absence is stale.
    view.observe("n1", None, at=0.0)
    assert plan_join("n1", None, view, 11.0, incarnation_floor=4, advertise_url="u", nonce="a") is None
    late = plan_join("n1", None, view, 12.0, incarnation_floor=4, advertise_url="u", nonce="a")
    assert late is not None and late.body.incarnation == 5
    # An alive previous incarnation: wait until stale, then take over its object.
    alive = _hb("n1", 2, beat=9, etag="E")
    view.observe("n1", alive, at=20.0)
    assert plan_join("n1", alive, view, 31.9, incarnation_floor=0, advertise_url="u", nonce="a") is None
    over = plan_join("n1", alive, view, 32.0, incarnation_floor=0, advertise_url="u", nonce="a")
    assert over is not None and (over.body.incarnation, over.if_match, over.body.beat) == (3, "E", 0)
    # Declared dead or stopped: no wait; the incarnation floor from leases wins.
    dead = _hb("n1", 2, Liveness.DEAD, etag="D")
    view.observe("n1", dead, at=40.0)
    now = plan_join("n1", dead, view, 40.0, incarnation_floor=6, advertise_url="u", nonce="a")
    assert now is not None and (now.body.incarnation, now.if_match) == (7, "D")


def test_beat_stop_and_declare_dead_are_compare_and_sets_on_the_version_seen() -> None:
    me = _hb("n1", 3, beat=4, etag="E")
    beat = plan_beat(me, "b")
    assert (beat.body.beat, beat.body.incarnation, beat.if_match, beat.body.state) == (
        5,
        3,
        "E",
        Liveness.ALIVE,
    )
    stop = plan_stop(me, "s")
    assert (stop.body.state, stop.if_match) == (Liveness.STOPPED, "E")
    dead = plan_declare_dead("n1", me, by="n2", nonce="d")
    assert (dead.body.state, dead.body.incarnation, dead.if_match, dead.body.declared_by) == (
        Liveness.DEAD,
        3,
        "E",
        "n2",
    )
    marker = plan_declare_dead("n9", None, by="n2", nonce="d", incarnation_floor=4)
    assert (marker.body.incarnation, marker.if_match, marker.body.state) == (4, None, Liveness.DEAD)
    assert decode_heartbeat(encode_heartbeat(beat.body), "n1") == beat.body
    for damaged, node in ((b"{}", "n1"), (encode_heartbeat(beat.body), "n2")):
        with pytest.raises(TieredError) as err:
            decode_heartbeat(damaged, node)
        assert err.value.code is ErrorCode.DATA_DAMAGED


# -- manifest -------------------------------------------------------------------------------


def _entry(
    seq: int, epoch: int, kind: EntryKind = EntryKind.COMMIT, writer: str = "n1", nonce: str = ""
) -> ManifestEntry:
    return ManifestEntry(0, seq, epoch, kind, writer, 1, nonce or f"{seq}-{epoch}")


def test_the_fence_goes_above_the_chain_and_stops_older_writers() -> None:
    new = ManifestWriter(0, epoch=3, writer="n2", incarnation=1)
    with pytest.raises(TieredError) as err:
        new.plan_commit(b"x", "c")
    assert err.value.code is ErrorCode.SHARD_NOT_OWNED  # nothing before the fence
    fence = new.plan_fence(_entry(7, 2, writer="n1"), "f")
    assert fence is not None and (fence.seq, fence.epoch, fence.kind) == (8, 3, EntryKind.FENCE)
    assert new.plan_fence(None, "other") is fence  # pending: the same entry, same bytes, again
    new.written(fence)
    assert new.fenced and new.next_seq == 9

    # The old writer's next position is taken by the fence: it must stop at once.
    old = ManifestWriter(0, epoch=2, writer="n1", incarnation=1, fence_seq=1, next_seq=8)
    mine = old.plan_commit(b"late", "o")
    assert mine.seq == 8
    with pytest.raises(TieredError) as err:
        old.conflict(mine, fence)
    assert err.value.code is ErrorCode.SHARD_FENCED
    assert err.value.context["epoch"] == 3 and err.value.context["owner"] == "n2"
    assert err.value.context["retry_after_s"] == 1

    # A writer finding a higher epoch at the top of the chain never fences.
    with pytest.raises(TieredError) as err:
        ManifestWriter(0, 2, "n1", 1).plan_fence(_entry(9, 3, EntryKind.FENCE, "n2"), "f")
    assert err.value.code is ErrorCode.SHARD_FENCED


def test_fence_settling_own_lost_answers_and_older_writers_racing() -> None:
    writer = ManifestWriter(0, epoch=4, writer="n1", incarnation=1)
    fence = writer.plan_fence(_entry(5, 3, writer="n0"), "f")
    assert fence is not None
    # An older owner's entry took position 6 after we listed: fence again above it.
    assert writer.conflict(fence, _entry(6, 3, writer="n0")) is WriteResult.RETRY
    assert writer.pending is None and not writer.fenced
    fence = writer.plan_fence(_entry(6, 3, writer="n0"), "g")
    assert fence is not None and fence.seq == 7
    # Its answer was lost and it is there: it is ours (by nonce).
    assert writer.conflict(fence, fence) is WriteResult.WRITTEN and writer.fence_seq == 7
    # Our own fence found at the top on a re-plan: nothing to write.
    again = ManifestWriter(0, epoch=4, writer="n1", incarnation=1)
    assert again.plan_fence(fence, "h") is None and again.fenced and again.next_seq == 8
    # Someone else at our epoch: refused, never written over.
    with pytest.raises(TieredError) as err:
        ManifestWriter(0, 4, "n9", 1).plan_fence(fence, "i")
    assert err.value.code is ErrorCode.SHARD_FENCED
    # Outcome unknown and absent: the same entry stays pending for the next commit.
    commit = again.plan_commit(b"p", "j")
    again.vanished(commit)
    assert again.plan_commit(b"q", "k") is commit
    # After the fence, an older epoch at our position is impossible: stop.
    with pytest.raises(TieredError):
        again.conflict(commit, _entry(8, 3, writer="n0"))


def test_check_chain_states_what_every_valid_chain_looks_like() -> None:
    good = [
        _entry(1, 1, EntryKind.FENCE, "n1"),
        _entry(2, 1, writer="n1"),
        _entry(3, 3, EntryKind.FENCE, "n2"),
        _entry(4, 3, writer="n2"),
    ]
    summary = check_chain(good)
    assert (summary.latest_seq, summary.latest_epoch, summary.fences) == (4, 3, {1: 1, 3: 3})
    assert check_chain([]).latest_seq == 0
    assert check_chain([_entry(10, 2, writer="n1")]).latest_epoch == 2  # compacted below: starts anywhere
    bad = {
        "gap": [good[0], good[2]],
        "epoch down": [good[2], _entry(4, 1, writer="n2")],
        "commit opens an epoch": [good[0], _entry(2, 2, writer="n2")],
        "second fence": [good[0], _entry(2, 1, EntryKind.FENCE, "n1")],
        "two writers": [good[0], _entry(2, 1, writer="n2")],
        "first entry not a fence": [_entry(1, 1, writer="n1")],
    }
    for name, entries in bad.items():
        with pytest.raises(TieredError) as err:
            check_chain(entries)
        assert err.value.code is ErrorCode.DATA_DAMAGED, name
    entry = _entry(3, 2, EntryKind.FENCE)
    assert decode_entry(encode_entry(entry), 0, 3) == entry
    for data, seq in ((b"nope", 3), (encode_entry(entry), 4), (msgspec.json.encode({"x": 1}), 3)):
        with pytest.raises(TieredError) as err:
            decode_entry(data, 0, seq)
        assert err.value.code is ErrorCode.DATA_DAMAGED


# -- placement ------------------------------------------------------------------------------


def test_placement_is_the_same_everywhere_and_moves_little() -> None:
    nodes = [f"node-{i}" for i in range(5)]
    assert owner(7, nodes) == owner(7, list(reversed(nodes))) and owner(7, []) is None
    shards = 4096
    before = assignment(shards, nodes)
    counts = Counter(before)
    assert set(counts) == set(nodes) and max(counts.values()) < 1.15 * shards / 5
    after = assignment(shards, [*nodes, "node-new"])
    changed = moved(before, after)
    assert all(after[s] == "node-new" for s in changed)  # only to the newcomer, never between others
    assert abs(len(changed) - shards / 6) < 0.15 * shards / 6  # about 1/N
    gone = assignment(shards, nodes[1:])
    assert set(moved(before, gone)) == {s for s, o in enumerate(before) if o == "node-0"}
