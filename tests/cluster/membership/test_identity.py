"""Two processes under one node id (pure): the older one learns it was replaced, a new one refuses a twin."""

from __future__ import annotations

from tiered.cluster.membership.heartbeat import HeartbeatBody, HeartbeatRecord, Liveness
from tiered.cluster.membership.identity import (
    EXIT_NODE_ID_IN_USE,
    TWIN_CHANGES,
    NodeIdInUse,
    replaced_by,
    twin_running,
)


def _hb(incarnation: int, state: Liveness = Liveness.ALIVE, beat: int = 0) -> HeartbeatRecord:
    body = HeartbeatBody("n1", incarnation, state, beat, f"nonce-{incarnation}-{beat}", "http://n1:7")
    return HeartbeatRecord(body, f"etag-{incarnation}-{beat}-{state}")


def test_an_older_incarnation_is_replaced_only_by_a_live_higher_one() -> None:
    why = replaced_by("n1", 3, _hb(4))
    assert why is not None and "incarnation 3 was replaced by incarnation 4" in why
    assert "http://n1:7" in why and f"code {EXIT_NODE_ID_IN_USE}" in why
    assert replaced_by("n1", 3, _hb(3, beat=9)) is None  # our own incarnation (a beat of ours)
    assert replaced_by("n1", 3, _hb(3, Liveness.DEAD)) is None  # declared dead: join again
    assert replaced_by("n1", 3, _hb(4, Liveness.STOPPED)) is None  # the newer one is gone: join again
    assert replaced_by("n1", 0, _hb(4)) is None  # never joined: not an older incarnation
    assert replaced_by("n1", 3, None) is None


def test_a_waiting_process_refuses_only_after_two_new_alive_versions() -> None:
    first = _hb(2, beat=5)
    assert twin_running("n1", first, first, 0) is None
    assert twin_running("n1", first, _hb(2, beat=6), 1) is None  # one late write of a crashed process
    why = twin_running("n1", first, _hb(2, beat=7), TWIN_CHANGES)
    assert why is not None and "node id n1 is in use" in why and "5 -> 7" in why
    assert twin_running("n1", first, _hb(2, Liveness.DEAD, 8), 3) is None  # declared dead: join now
    assert twin_running("n1", _hb(2, Liveness.STOPPED), _hb(3), 3) is None  # it did not wait on a live one
    assert twin_running("n1", None, _hb(3), 3) is None


def test_the_exception_carries_the_documented_exit_code() -> None:
    exc = NodeIdInUse("n1", "why")
    assert exc.exit_code == EXIT_NODE_ID_IN_USE == 3 and exc.message == "why" and str(exc) == "why"
