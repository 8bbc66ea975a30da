"""Shard leases: timing and the acknowledgement window, the clock argument as a property, take-over, renewal, release."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
from tiered.core.errors import ErrorCode, TieredError

TIMING = LeaseTiming(ttl_s=10.0, margin_s=2.0)


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
