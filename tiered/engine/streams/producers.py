"""Idempotent producers' state per stream: expiry, the per-stream cap, and what it costs (pure).

Each stream keeps, per ``Producer-Id``, the epoch and last sequence of its
last accepted append (protocol section 5.2.1) and when that was. Without
bounds, every distinct id a client ever sent would be kept forever (in
memory, in snapshots), so:

* **Expiry.** A producer's state expires ``ttl_ms`` after its last accepted
  append (``--producer-ttl-s``, default 7 days: the protocol's recommendation,
  and Kafka's ``transactional.id.expiration.ms``). The protocol allows it:
  "after state expiry, the producer is treated as new". Its next append with
  ``Producer-Seq: 0`` starts it afresh (200, in whatever epoch it names);
  one with a higher sequence is refused like any unknown producer's (400: a
  new producer starts at sequence 0), so a client learns that its session is
  gone instead of having a gap filled silently.
* **A cap per stream.** At most ``max_per_stream`` producers have state on a
  stream (``--max-producers-per-stream``, default 1,000). A new producer at the
  cap evicts the one that has been idle longest (least recently appended),
  which is then treated as new, as if it had expired. Refusing the new
  producer instead would let any writer (or a client that makes up a fresh id
  per request) lock a stream against new producers for up to a week; evicting
  the longest idle keeps the stream writable and, for the producers still
  active, exactly-once. Evictions are counted
  (``tiered_producer_states_dropped_total{reason="cap"}``).
* **A cost.** Each state counts ``state_bytes(id)`` (its id's UTF-8 bytes plus
  24 for epoch, sequence and time) towards its bucket's retained bytes
  (``tiered/engine/tenants/footprint.py``), so ``max_retained_bytes`` bounds it too.

Everything here is a function of the state and a time passed in: a stream's
``producers`` dict is kept in least-recently-used order (an accepted append
moves its producer to the end; its time never goes below the newest's, so
the order is also by time), expiry and eviction take from the front, and the
same ``plan`` decides what an append will drop (for the quota check) and what
applying its record drops. Replaying the journal, or restoring a snapshot
(which keeps the order), gives the same producers in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiered.engine.streams.model import ProducerState

DEFAULT_TTL_S = 7 * 24 * 3600
DEFAULT_MAX_PER_STREAM = 1000
#: What a state costs beyond its id: epoch, last sequence and last append time, 8 bytes each.
STATE_OVERHEAD_BYTES = 24


@dataclass(frozen=True, slots=True)
class ProducerLimits:
    """How long an idle producer's state lives, and how many states one stream keeps."""

    ttl_ms: int = DEFAULT_TTL_S * 1000
    max_per_stream: int = DEFAULT_MAX_PER_STREAM


def state_bytes(producer: str) -> int:
    """What one producer's state counts towards its bucket's retained bytes."""
    return len(producer.encode("utf-8", "surrogatepass")) + STATE_OVERHEAD_BYTES


def expired(p: ProducerState, now_ms: int, limits: ProducerLimits) -> bool:
    return now_ms - p.last_ms >= limits.ttl_ms


def live_state(
    producers: dict[str, ProducerState], producer: str, now_ms: int, limits: ProducerLimits
) -> ProducerState | None:
    """The producer's state, or None when it has none (never had, expired, or evicted)."""
    p = producers.get(producer)
    return None if p is None or expired(p, now_ms, limits) else p


@dataclass(frozen=True, slots=True)
class ProducerChange:
    """What applying an append (or an expiry sweep) at one time does to a stream's producer states."""

    expired: tuple[str, ...]  # idle past the TTL, oldest first
    evicted: tuple[str, ...]  # the longest idle, to make room at the cap
    bytes_delta: int  # the change of the stream's ``producer_bytes``


NO_CHANGE = ProducerChange((), (), 0)


def plan(
    producers: dict[str, ProducerState], producer: str | None, ts_ms: int, limits: ProducerLimits
) -> ProducerChange:
    """States dropped when ``producer`` (None: no producer, a sweep) is recorded at ``ts_ms``."""
    gone: list[str] = []
    for pid, p in producers.items():  # oldest first: stop at the first one still live
        if not expired(p, ts_ms, limits):
            break
        gone.append(pid)
    if not gone and (producer is None or producer in producers):
        return NO_CHANGE  # the common case: nothing expired, nothing added
    dropped = set(gone)
    adds = producer is not None and (producer not in producers or producer in dropped)
    evicted: list[str] = []
    if adds:
        over = len(producers) - len(gone) + 1 - limits.max_per_stream
        if over > 0:
            for pid in producers:
                if pid in dropped:
                    continue
                evicted.append(pid)
                if len(evicted) >= over:
                    break
    delta = sum(-state_bytes(pid) for pid in gone) + sum(-state_bytes(pid) for pid in evicted)
    if adds:
        assert producer is not None
        delta += state_bytes(producer)
    return ProducerChange(tuple(gone), tuple(evicted), delta)


def apply(
    producers: dict[str, ProducerState],
    producer: str | None,
    epoch: int,
    seq: int,
    ts_ms: int,
    limits: ProducerLimits,
) -> ProducerChange:
    """Drop what ``plan`` says, then record ``producer``'s state (if any) as the most recently used."""
    change = plan(producers, producer, ts_ms, limits)
    for pid in change.expired:
        del producers[pid]
    for pid in change.evicted:
        del producers[pid]
    if producer is not None:
        producers.pop(producer, None)
        newest = next(reversed(producers.values()), None)
        # Never below the newest's time (a clock that stepped back): the order stays by time.
        last_ms = ts_ms if newest is None else max(ts_ms, newest.last_ms)
        producers[producer] = ProducerState(epoch, seq, last_ms)
    return change


def total_bytes(producers: dict[str, ProducerState]) -> int:
    return sum(state_bytes(pid) for pid in producers)
