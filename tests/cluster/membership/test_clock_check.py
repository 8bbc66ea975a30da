"""Clock sanity (pure): rate estimates as intervals, the bound, the majority verdict, the sliding window."""

from __future__ import annotations

import pytest

from tiered.cluster.membership.clock_check import STORE, ClockCheck, Sample


def _check() -> ClockCheck:
    return ClockCheck(bound=0.2, window_s=300.0, min_span_s=100.0)


def _feed(check: ClockCheck, reference: str, rate: float, *, start: float = 0.0, until: float = 200.0,
          every: float = 5.0, slack: float = 0.5, epoch: int = 0) -> None:  # fmt: skip
    """Samples of a reference whose clock runs at 1/rate of ours: ours at t reads ref t / rate."""
    t = start
    while t <= until:
        check.observe(reference, Sample(t - 1.0, t, t / rate, slack), epoch=epoch)
        t += every


def test_a_clock_twice_as_fast_as_every_reference_is_out_of_bound() -> None:
    check = _check()
    for ref in (STORE, "peer-1", "peer-2"):
        _feed(check, ref, 2.0)
    found = check.estimates(200.0)
    assert set(found) == {STORE, "peer-1", "peer-2"}
    assert all(e.disagrees and e.low > 1.2 for e in found.values())
    assert found[STORE].rate == pytest.approx(2.0, rel=0.05)
    assert check.out_of_bound(200.0)


def test_a_sane_clock_agrees_even_with_coarse_dates_and_late_samples() -> None:
    check = _check()
    _feed(check, STORE, 1.0, slack=0.5)
    _feed(check, "peer-1", 1.03)  # within the bound
    found = check.estimates(200.0)
    assert not any(e.disagrees for e in found.values()) and not check.out_of_bound(200.0)
    assert found["peer-1"].low <= 1.03 <= found["peer-1"].high


def test_no_verdict_before_the_span_and_one_bad_peer_is_outvoted() -> None:
    check = _check()
    _feed(check, STORE, 2.0, until=90.0)
    assert check.estimates(90.0) == {} and not check.out_of_bound(90.0)  # not long enough yet
    check = _check()
    _feed(check, STORE, 1.0)
    _feed(check, "sane", 1.0)
    _feed(check, "fast", 0.5)  # that peer's clock runs twice as fast as ours: its problem
    assert check.estimates(200.0)["fast"].disagrees
    assert not check.out_of_bound(200.0)
    two = _check()
    _feed(two, STORE, 1.0)
    _feed(two, "fast", 0.5)  # one of two references disagrees: not more than half
    assert not two.out_of_bound(200.0)
    early = _check()
    _feed(early, "fast", 0.5)  # the first estimate to come in is of the bad peer...
    _feed(early, STORE, 1.0, start=150.0)  # ...while the store's samples do not span enough yet
    assert early.estimates(200.0).keys() == {"fast"}
    assert not early.out_of_bound(200.0)  # the store counts as agreeing until it can say


def test_old_samples_age_out_so_a_clock_that_recovers_is_sane_again() -> None:
    check = _check()
    _feed(check, STORE, 2.0, until=200.0)
    assert check.out_of_bound(200.0)
    # From t=200 on (our clock) the reference runs at our rate again.
    t = 205.0
    while t <= 900.0:
        check.observe(STORE, Sample(t - 1.0, t, 100.0 + (t - 200.0), 0.5))
        t += 5.0
    assert not check.out_of_bound(900.0)


def test_a_new_incarnation_starts_a_peer_afresh_and_stale_readings_are_ignored() -> None:
    check = _check()
    _feed(check, "peer", 2.0, epoch=1)
    assert check.estimates(200.0)["peer"].disagrees
    check.observe("peer", Sample(204.0, 205.0, 7.0, 0.0), epoch=2)  # a restart: a new clock origin
    assert "peer" not in check.estimates(205.0)
    check.observe("peer", Sample(205.0, 206.0, 6.0, 0.0), epoch=2)  # older than the last: ignored
    assert len(check.samples["peer"]) == 1


def test_the_settings_are_checked() -> None:
    for bad in ({"bound": 0.0}, {"bound": 1.0}, {"min_span_s": 0.0}, {"min_span_s": 400.0}):
        kwargs = {"bound": 0.2, "window_s": 300.0, "min_span_s": 100.0, **bad}
        with pytest.raises(ValueError):
            ClockCheck(**kwargs)  # type: ignore[arg-type]
