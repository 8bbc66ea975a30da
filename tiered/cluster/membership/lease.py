"""The shard lease: who owns a shard, at which epoch, and until when it may acknowledge. Pure.

One lease object per shard, ``{epoch, owner, incarnation, advertise_url,
nonce}``, changed only by conditional writes:

* acquire: create it (``If-None-Match: *``) at epoch 1 when there is none;
* take over: replace it (``If-Match`` the ETag read) with epoch + 1, when it
  is free (released) or its owner's incarnation is dead (see ``heartbeat``);
* renew: replace it (``If-Match`` the holder's own ETag) at the same epoch,
  to change what it says (the advertised URL);
* release: replace it at the same epoch with no owner, after the holder
  stopped acknowledging (handoff).

Nothing ever deletes a lease, so epochs only grow: the epoch after every
change of hands is one more than any before it. A write whose answer was
lost is settled by reading the lease back: our nonce there means our write
landed (each write has a fresh nonce, so equal bytes never repeat).

Acknowledging is bounded in time, on the holder's own monotonic clock only:
``AckWindow`` ends ``ttl - margin`` after the *send* time of the holder's
last successful renewal (its heartbeat renews all its leases at once). A
peer takes over only after seeing that heartbeat unchanged for ``ttl +
margin`` from the *answer* time of its first read of it. The renewal was
sent before it landed, and the peer saw it only after it landed, so the
holder's window closes at least ``2 * margin`` (less clock-rate drift) before
a takeover can happen. No two clocks are ever compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from tiered.core.errors import ErrorCode, TieredError

__all__ = [
    "AckWindow",
    "Hold",
    "HoldState",
    "LeaseBody",
    "LeaseRecord",
    "LeaseTiming",
    "LeaseWrite",
    "decode_lease",
    "encode_lease",
    "landed",
    "plan_release",
    "plan_renew",
    "plan_take",
]


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """How long a renewal counts, and the safety margin on each side.

    ``margin_s`` must cover the clock-rate difference between any two nodes
    over ``ttl_s`` (NTP-disciplined clocks drift by ppm; a 10 % margin is
    orders of magnitude more) and a pause between checking the window and
    sending an acknowledgement.
    """

    ttl_s: float
    margin_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ttl_s) and math.isfinite(self.margin_s)):
            raise ValueError("lease timings must be finite")
        if not 0 < self.margin_s < self.ttl_s / 2:
            raise ValueError(
                f"the lease margin must be positive and below half the TTL "
                f"(ttl {self.ttl_s} s, margin {self.margin_s} s)"
            )

    def ack_deadline(self, sent_at: float) -> float:
        """Until when a renewal sent at ``sent_at`` (holder's clock) lets the holder acknowledge."""
        return sent_at + self.ttl_s - self.margin_s

    @property
    def stale_after_s(self) -> float:
        """How long a peer must see a heartbeat unchanged before judging its node dead."""
        return self.ttl_s + self.margin_s


@dataclass(slots=True)
class AckWindow:
    """The holder's "may acknowledge until", on its own monotonic clock; only ever extended."""

    until: float = -math.inf

    def extend(self, sent_at: float, timing: LeaseTiming) -> None:
        self.until = max(self.until, timing.ack_deadline(sent_at))

    def allows(self, now: float) -> bool:
        return now < self.until

    def close(self) -> None:
        self.until = -math.inf


class LeaseBody(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """The lease object. ``owner == ""`` means free (released); the epoch is kept."""

    epoch: int
    owner: str
    incarnation: int  # the owner's incarnation (its join count); 0 when free
    advertise_url: str
    nonce: str
    # On a free lease: the node whose state the shard is in (its last writer), "" if unknown.
    last_owner: str = ""

    @property
    def free(self) -> bool:
        return not self.owner


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A lease as read (or written): its body and the ETag of that version."""

    body: LeaseBody
    etag: str


@dataclass(frozen=True, slots=True)
class LeaseWrite:
    """A conditional write to make: create (``if_match is None``) or compare-and-set."""

    shard: int
    body: LeaseBody
    if_match: str | None


def encode_lease(body: LeaseBody) -> bytes:
    return msgspec.json.encode(body)


def decode_lease(data: bytes, shard: int) -> LeaseBody:
    try:
        body = msgspec.json.decode(data, type=LeaseBody)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TieredError(
            ErrorCode.DATA_DAMAGED, f"the lease of shard {shard} is unreadable: {exc}", shard=shard
        ) from None
    if body.epoch < 1:
        raise TieredError(
            ErrorCode.DATA_DAMAGED, f"the lease of shard {shard} has epoch {body.epoch}", shard=shard
        )
    return body


def plan_take(
    shard: int,
    current: LeaseRecord | None,
    *,
    owner: str,
    incarnation: int,
    advertise_url: str,
    nonce: str,
    epoch_floor: int = 0,
) -> LeaseWrite:
    """Acquire (no lease yet) or take over (``current`` is free or its owner is dead).

    The caller has judged that ``current`` may be taken; the new epoch is one
    more than both the lease's and ``epoch_floor`` (the highest epoch seen in
    the shard's manifest chain), so it is new even if a lease was lost.
    """
    base = max(current.body.epoch if current else 0, epoch_floor)
    body = LeaseBody(
        epoch=base + 1, owner=owner, incarnation=incarnation, advertise_url=advertise_url, nonce=nonce
    )
    return LeaseWrite(shard, body, current.etag if current else None)


class HoldState(StrEnum):
    FENCING = "fencing"  # lease won; the fencing manifest is not written yet: no acknowledgements
    SERVING = "serving"  # fenced: acknowledges while the node's window is open
    RELEASING = "releasing"  # handing off: acknowledges nothing, release not yet confirmed


@dataclass
class Hold:
    """What the holder knows about a lease it holds."""

    shard: int
    epoch: int
    etag: str
    nonce: str
    advertise_url: str
    state: HoldState = HoldState.FENCING
    release: LeaseWrite | None = field(default=None, repr=False)  # the release in flight, if any
    prepared: bool = False  # the data plane agreed to serve it (asked once, before the fence)

    @classmethod
    def won(cls, write: LeaseWrite, etag: str) -> Hold:
        return cls(write.shard, write.body.epoch, etag, write.body.nonce, write.body.advertise_url)


def plan_renew(hold: Hold, *, owner: str, incarnation: int, advertise_url: str, nonce: str) -> LeaseWrite:
    """Rewrite our own lease at the same epoch (for example to advertise a new URL)."""
    body = LeaseBody(hold.epoch, owner, incarnation, advertise_url, nonce)
    return LeaseWrite(hold.shard, body, hold.etag)


def plan_release(hold: Hold, *, nonce: str, last_owner: str = "") -> LeaseWrite:
    """Give the shard up at the same epoch; the next owner takes epoch + 1 without waiting.

    ``last_owner`` names the node whose disk holds the shard's state, for
    durability modes where that matters (see ``NodeConfig.rebalance``).
    """
    return LeaseWrite(hold.shard, LeaseBody(hold.epoch, "", 0, "", nonce, last_owner), hold.etag)


def landed(write: LeaseWrite, found: LeaseRecord | None) -> bool:
    """Whether ``write`` is what the lease holds now (settles a lost answer or a 412 after a retry)."""
    return found is not None and found.body.nonce == write.body.nonce
