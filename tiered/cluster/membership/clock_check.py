"""Clock sanity: does this node's monotonic clock run at the rate the lease argument assumes? Pure.

The lease protocol never compares two clocks' readings, but it assumes each
node's monotonic clock runs at real time's rate within ``1 ± ρ``, with
``ρ = margin / ttl`` (docs/cluster.md, "Why the window is safe"). A node whose
clock runs fast sees its peers' heartbeats go stale early and declares live
peers dead (churn); one running slow keeps acknowledging after its window
closed in real time. Neither loses acknowledged data (the chains are fenced),
but both hurt, so each node measures its own rate against references:

* the store: the ``Date`` of its heartbeat writes' answers (whole seconds);
* each peer (one incarnation: one process, one clock): the ``clock`` field of
  its heartbeats, its monotonic reading when it sent them.

A sample is an interval of this node's clock during which the reference read
``ref`` (give or take ``ref_slack``): for the store, the write's send and
answer times and the Date's second; for a peer, the time its new heartbeat
was first seen, minus one TTL (an alive peer beats more often than that).
Between the oldest sample in the window and the newest, at least
``min_span_s`` apart, the rate ratio ``my elapsed / reference elapsed`` lies
in an interval that accounts for every slack; a reference *disagrees* only
when that whole interval lies outside ``[1 - ρ, 1 + ρ]``, so latency and
coarse dates can blur an estimate but never make a sane clock disagree.

The verdict: out of bound when more than half of the references it has
samples of disagree (one without an estimate yet counts as agreeing; with
two nodes, the store and the peer both must disagree). One peer
with a bad clock is outvoted by the store and the others, so it does not
make a sane node doubt itself; it flags itself the same way. A node out of
bound stops declaring peers dead (on its own clock's say-so), reports it in
``/readyz`` (not ready) and ``/metrics``, and logs it; samples age out of the
window, so it recovers by itself when its clock does.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = ["ClockCheck", "Estimate", "Sample", "STORE"]

#: The reference name of the object store's clock (peers are named by node id).
STORE = "store"

_MAX_SAMPLES = 256  # per reference; at one per beat this covers the window


@dataclass(frozen=True, slots=True)
class Sample:
    """Between ``lo`` and ``hi`` on this node's clock, the reference read ``ref ± ref_slack``."""

    lo: float
    hi: float
    ref: float
    ref_slack: float


@dataclass(frozen=True, slots=True)
class Estimate:
    """This node's clock rate over a reference's, as an interval; ``disagrees`` beyond the bound."""

    low: float
    high: float
    span_s: float  # this node's clock time between the two samples
    disagrees: bool

    @property
    def rate(self) -> float:
        """A point estimate (the interval's geometric middle), for metrics."""
        return math.sqrt(self.low * self.high) if self.low > 0 else self.high

    def as_json(self) -> dict[str, float | bool]:
        return {
            "rate": round(self.rate, 4),
            "low": round(self.low, 4),
            "high": round(self.high, 4),
            "span_s": round(self.span_s, 1),
            "disagrees": self.disagrees,
        }


@dataclass
class ClockCheck:
    """Samples per reference over a sliding window of this node's clock, and the verdict from them.

    ``bound``: ρ. ``window_s``: how far back samples count. ``min_span_s``:
    the least distance between the two samples of an estimate (longer spans
    make tighter intervals).
    """

    bound: float
    window_s: float
    min_span_s: float
    samples: dict[str, deque[Sample]] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)  # a peer's incarnation its samples belong to

    def __post_init__(self) -> None:
        if not 0 < self.bound < 1:
            raise ValueError(f"the clock rate bound must be in (0, 1), not {self.bound}")
        if not 0 < self.min_span_s < self.window_s:
            raise ValueError("the clock check needs 0 < min_span_s < window_s")

    def observe(self, reference: str, sample: Sample, epoch: int = 0) -> None:
        """Add a sample; ``epoch`` (a peer's incarnation) starts the reference afresh when it changes."""
        if self.epochs.get(reference, epoch) != epoch:
            self.samples.pop(reference, None)
        self.epochs[reference] = epoch
        found = self.samples.setdefault(reference, deque(maxlen=_MAX_SAMPLES))
        if found and sample.ref <= found[-1].ref:
            return  # not newer: a re-read, or a reference that went backwards (a bug there, ignored)
        found.append(sample)

    def forget(self, reference: str) -> None:
        self.samples.pop(reference, None)
        self.epochs.pop(reference, None)

    def estimates(self, now: float) -> dict[str, Estimate]:
        """Every reference with samples spanning ``min_span_s`` within the window ending at ``now``."""
        out: dict[str, Estimate] = {}
        for reference, found in self.samples.items():
            while found and found[0].hi < now - self.window_s:
                found.popleft()
            if len(found) < 2:
                continue
            estimate = self._estimate(found[0], found[-1])
            if estimate is not None:
                out[reference] = estimate
        return out

    def _estimate(self, a: Sample, b: Sample) -> Estimate | None:
        span = (b.lo + b.hi) / 2 - (a.lo + a.hi) / 2
        if span < self.min_span_s:
            return None
        mine_low, mine_high = max(0.0, b.lo - a.hi), b.hi - a.lo
        slack = a.ref_slack + b.ref_slack
        ref_low, ref_high = b.ref - a.ref - slack, b.ref - a.ref + slack
        if ref_high <= 0:
            return None
        low = mine_low / ref_high
        high = mine_high / ref_low if ref_low > 0 else math.inf
        disagrees = low > 1 + self.bound or high < 1 - self.bound
        return Estimate(low, high, span, disagrees)

    def out_of_bound(self, now: float) -> bool:
        """More than half of the references with samples in the window disagree with this node's clock.

        A reference without an estimate yet counts as agreeing: a sane node whose one early estimate
        is of a bad peer must not doubt itself before the store's and the other peers' come in.
        """
        found = self.estimates(now)  # (drops the samples that left the window)
        known = sum(1 for samples in self.samples.values() if samples)
        return bool(found) and 2 * sum(e.disagrees for e in found.values()) > known
