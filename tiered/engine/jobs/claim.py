"""One server per object-store prefix: a create-only claim object naming the data dir that owns it.

Two servers pointed at the same bucket and prefix would each see the other's
objects as orphans and delete them. So at start-up a server writes
``_tiered/claim.json`` with ``If-None-Match: *``, naming its data dir's identity
(a random id kept in the data dir, so a restart or a restore of the same volume
is the same owner). If another identity holds the claim, the server refuses to
start. ``--take-over-prefix`` replaces the claim explicitly (for a data dir lost
for good) with a compare-and-set on the claim it read (``If-Match``), so of two
servers taking over at once exactly one wins; the previous owner, if it still
runs, notices at its next check and stops writing and deleting there.

Both writes are only as safe as the store's conditional writes: an S3 store
that ignores ``If-None-Match`` would let a second server overwrite the claim
silently, which is why ``serve`` probes the store first (``s3_conditional_writes``).

The claim is checked again before every flush pass (at most every
``recheck_s``) and always right before reconciliation deletes orphans.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from tiered.cold.objects.store import ObjectExists, ObjectNotFound, ObjectStore, PreconditionFailed
from tiered.core.clock import Clock, SystemClock

log = logging.getLogger(__name__)

CLAIM_KEY = "_tiered/claim.json"
IDENTITY_FILE = "IDENTITY"
# Each attempt loses a race only to another server changing the claim at that moment.
_ACQUIRE_ATTEMPTS = 5


class PrefixClaimed(Exception):
    """Another data dir owns this object-store prefix."""


class ClaimBody(msgspec.Struct, forbid_unknown_fields=False):
    identity: str
    data_dir: str
    host: str
    claimed_ms: int
    version: int = 1


def load_identity(data_dir: Path, *, create: bool) -> str | None:
    """The data dir's identity; made once (fsynced) when ``create``, else None if it has none."""
    path = data_dir / IDENTITY_FILE
    try:
        text = path.read_text().strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    if not create:
        return None
    identity = uuid.uuid4().hex
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(identity + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return identity


@dataclass
class PrefixClaim:
    store: ObjectStore
    identity: str
    data_dir: str
    recheck_s: float = 10.0
    clock: Clock = field(default_factory=SystemClock)
    held: bool = False
    lost_to: ClaimBody | None = None
    _checked_at: float = 0.0

    def _body(self) -> bytes:
        return msgspec.json.encode(
            ClaimBody(self.identity, self.data_dir, socket.gethostname(), self.clock.now_ms())
        )

    async def current(self) -> ClaimBody | None:
        try:
            return _decode(await self.store.get(CLAIM_KEY))
        except ObjectNotFound:
            return None

    async def observe(self) -> None:
        """Find out, without claiming anything, whether the claim is ours (an offline GC pass)."""
        owner = await self.current()
        self.held = owner is not None and owner.identity == self.identity

    async def acquire(self, *, take_over: bool = False) -> None:
        """Claim the prefix, or raise ``PrefixClaimed`` naming the owner and the way out."""
        for _ in range(_ACQUIRE_ATTEMPTS):
            if await self._try_acquire(take_over):
                self.held, self.lost_to = True, None
                self._checked_at = self.clock.monotonic()
                log.info("claimed the object-store prefix for data dir identity %s", self.identity)
                return
        raise PrefixClaimed(
            f"the claim object {CLAIM_KEY} kept changing while this server tried to claim the prefix: "
            "another server is claiming it at the same time; stop one of them"
        )

    async def _try_acquire(self, take_over: bool) -> bool:
        """One attempt: True once the claim is ours, False if it changed under us (look again)."""
        try:
            await self.store.put(CLAIM_KEY, self._body(), if_none_match=True)
            return True
        except ObjectExists:
            pass
        try:
            found = await self.store.get_with_info(CLAIM_KEY)
        except ObjectNotFound:
            return False  # deleted between our PUT and GET
        owner = _decode(found.data)
        if owner.identity == self.identity:
            return True  # a restart (or a restore) of the same data dir
        if not take_over:
            raise PrefixClaimed(
                f"this object-store prefix is claimed by another tiered data dir (identity {owner.identity}, "
                f"data dir {owner.data_dir} on {owner.host}): two servers on one prefix delete each other's "
                "objects. Point this server at its own prefix (--s3-prefix), or, if that data dir is gone "
                "for good, start once with --take-over-prefix (its objects become orphans here)."
            )
        log.warning(
            "taking over the object-store prefix from identity %s (data dir %s on %s)",
            owner.identity,
            owner.data_dir,
            owner.host,
        )
        try:
            # Replaces exactly the claim we read: a concurrent take-over makes this fail, not both win.
            await self.store.put(CLAIM_KEY, self._body(), if_match=found.info.etag)
        except PreconditionFailed:
            return False
        return True

    async def still_held(self, *, force: bool = False) -> bool:
        """Whether the claim is still ours (reads it at most every ``recheck_s`` unless ``force``)."""
        if not self.held:
            return False
        if not force and self.clock.monotonic() - self._checked_at < self.recheck_s:
            return True
        owner = await self.current()
        self._checked_at = self.clock.monotonic()
        if owner is None or owner.identity != self.identity:
            self.held, self.lost_to = False, owner
            log.critical(
                "the object-store prefix is no longer claimed by this data dir (now: %s); this server stops "
                "writing and deleting there",
                owner.identity if owner else "nobody",
            )
            return False
        return True


def _decode(data: bytes) -> ClaimBody:
    try:
        return msgspec.json.decode(data, type=ClaimBody)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PrefixClaimed(
            f"the claim object {CLAIM_KEY} is not readable ({exc}); refusing to guess"
        ) from None
