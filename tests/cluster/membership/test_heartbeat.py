"""Heartbeats: a peer judged by the observer's own clock, joins that wait out a previous incarnation, compare-and-set beats."""

from __future__ import annotations

import pytest

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
    LeaseTiming,
)
from tiered.core.errors import ErrorCode, TieredError

TIMING = LeaseTiming(ttl_s=10.0, margin_s=2.0)


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
