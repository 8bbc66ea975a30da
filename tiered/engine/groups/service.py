"""The consumer-groups shell: decide (``GroupsState``) -> commit -> durable -> view, plus long-poll and the sweeper.

Like the streams shell: decisions are committed with no ``await`` between
deciding and committing, so the event loop makes them atomic. Views are built
*before* waiting for durability, so a response never shows a cursor or plan a
crash could take back (the wait comes after, before answering).

The sweeper (``sweep_forever``, started by the node) journals what nobody
asked for: member expiry, cursors retention passed, and plans that follow
streams appearing or disappearing (``GroupsState.decide_sweep``).

``RetentionFollower`` (a commit observer) moves the cursors a retention
record passes in the same batch as the record, and reports every such move
once it is durable: a warning naming the group, stream and range, and the
``skipped_bytes`` / ``skipped_ranges`` counters ``/metrics`` exposes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from tiered.core.clock import Clock
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import format_offset
from tiered.engine.groups import views
from tiered.engine.groups.model import CommitRequest, GroupSpec, Rejected, ReleaseRequest
from tiered.engine.groups.records import GroupCursorsSkipped
from tiered.engine.groups.state import GroupsState
from tiered.engine.journal.committer import Committer
from tiered.engine.streams.records import RetentionAdvanced
from tiered.engine.streams.state import StreamState
from tiered.engine.streams.visibility import Visibility

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 0.5
MAX_WAIT_MS = 10_000
_UNAVAILABLE = (ErrorCode.JOURNAL_FAILED, ErrorCode.STORE_UNAVAILABLE)


def rejected_json(items: list[Rejected]) -> list[dict[str, str]]:
    return [{"stream": r.stream, "code": r.code, "message": r.message} for r in items]


class StreamDirectory(Protocol):
    """Cluster mode: the streams of other shards too (``tiered/cluster/features/directory.py``)."""

    async def view(self, local: StreamState, buckets: Iterable[str], *, fresh: bool) -> StreamState: ...


class GroupService:
    def __init__(
        self,
        state: StreamState,
        groups: GroupsState,
        committer: Committer,
        visibility: Visibility,
        clock: Clock,
        *,
        sweep_interval_s: float = SWEEP_INTERVAL_S,
        skips: CursorSkips | None = None,
        directory: StreamDirectory | None = None,
    ) -> None:
        self.state = state
        self.groups = groups
        self.committer = committer
        self.visibility = visibility
        self.clock = clock
        self.sweep_interval_s = sweep_interval_s
        self.closing = False
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        #: Cluster mode: decisions see every shard's streams of the group's bucket, not only this shard's.
        self.directory = directory
        #: What retention made groups skip (``/metrics``), as journaled by this process.
        self.skips = skips or CursorSkips()

    def begin_shutdown(self) -> None:
        """Stop the sweeper's next pass and release every waiting member at once."""
        self.closing = True
        self.notify_all()

    # ------------------------------------------------------------- plumbing

    async def _commit(self, records: Sequence[Any]) -> None:
        if not records:
            return
        try:
            await self.committer.commit(list(records))
        except TieredError as exc:
            if exc.code in _UNAVAILABLE:
                raise TieredError(ErrorCode.UNAVAILABLE, exc.message) from None
            raise
        for name in {r.name for r in records}:
            self._notify(name)

    async def _settled(self) -> None:
        try:
            await self.committer.settled()
        except TieredError as exc:
            raise TieredError(ErrorCode.UNAVAILABLE, exc.message) from None

    async def _streams(self, buckets: Iterable[str], *, fresh: bool = True) -> StreamState:
        """The streams decisions see: this engine's, or in cluster mode every shard's of ``buckets``.

        ``fresh``: as they are now (what a single server's decision sees); else
        possibly a little older (heartbeats without commits, the sweeper).
        """
        if self.directory is None:
            return self.state
        return await self.directory.view(self.state, buckets, fresh=fresh)

    async def _streams_of(self, name: str, *, fresh: bool = True) -> StreamState:
        g = self.groups.groups.get(name)
        return await self._streams([g.spec.bucket] if g is not None else [], fresh=fresh)

    def _view(self, name: str, streams: StreamState | None = None) -> dict[str, Any]:
        return views.group_view(
            self.groups,
            name,
            streams if streams is not None else self.state,
            self.clock.now_ms(),
            lambda s: self.visibility.view(s).tail,
        )

    # ------------------------------------------------------------- groups

    async def list_groups(self) -> list[dict[str, Any]]:
        summary = views.summary(self.groups)
        await self._settled()
        return summary

    async def create(self, name: str, spec: GroupSpec) -> tuple[bool, dict[str, Any]]:
        streams = await self._streams([spec.bucket])
        records = self.groups.decide_create(name, spec, streams, self.clock.now_ms())
        await self._commit(records)
        view = self._view(name, streams)
        await self._settled()  # an identical create may still be on its way to disk
        return bool(records), view

    async def describe(self, name: str) -> dict[str, Any]:
        view = self._view(name, await self._streams_of(name))
        await self._settled()
        return view

    async def delete(self, name: str, incarnation: int | None, revision: int | None) -> None:
        records = self.groups.decide_delete(
            name, self.clock.now_ms(), incarnation=incarnation, expected_revision=revision
        )
        await self._commit(records)
        await self._settled()

    async def link(
        self,
        name: str,
        paths: list[str],
        *,
        unlink: bool,
        incarnation: int | None,
        revision: int | None,
        op_id: str | None,
    ) -> dict[str, Any]:
        streams = await self._streams_of(name)
        records = self.groups.decide_link(
            name,
            paths,
            streams,
            self.clock.now_ms(),
            unlink=unlink,
            incarnation=incarnation,
            expected_revision=revision,
            op_id=op_id,
        )
        await self._commit(records)
        view = self._view(name, streams)
        await self._settled()
        return view

    # ------------------------------------------------------------- members

    async def join(self, name: str, member: str, join_id: str) -> dict[str, Any]:
        streams = await self._streams_of(name)
        records = self.groups.decide_join(name, member, join_id, streams, self.clock.now_ms())
        await self._commit(records)
        view = views.member_view(self.groups, name, member)
        await self._settled()
        return view

    async def heartbeat(
        self,
        name: str,
        member: str,
        incarnation: int,
        generation: int,
        commits: list[CommitRequest],
        releases: list[ReleaseRequest],
        revision: int | None,
        wait_ms: int,
        op_id: str | None,
    ) -> dict[str, Any]:
        """Commit, release, stay alive; with ``revision`` and ``wait_ms``, park while the plan is unchanged."""
        groups = self.groups
        streams = await self._streams_of(name, fresh=bool(commits))  # commits are checked against tails
        now = self.clock.now_ms()
        records, rejected = groups.decide_heartbeat(
            name, incarnation, member, generation, commits, releases, streams, now, op=op_id
        )
        groups.touch(name, incarnation, member, generation, now)
        await self._commit(records)
        waited = False
        if wait_ms and revision is not None and not rejected:
            g = groups.get(name)
            wait = min(wait_ms, MAX_WAIT_MS, g.spec.session_timeout_ms // 2)
            await self.wait_for_change(name, incarnation, revision, wait / 1000)
            waited = True
        # Waiting (for the disk or a plan change) let other requests in: a newer join under this member id,
        # or a delete, must fence this instance, not hand it the newer one's view.
        g = groups.check_group(name, incarnation)
        groups.check_member(g, member, generation)
        if waited:
            groups.touch(name, incarnation, member, generation, self.clock.now_ms())
        view = views.member_view(groups, name, member)
        view["rejected"] = rejected_json(rejected)
        await self._settled()
        return view

    async def leave(
        self, name: str, member: str, incarnation: int, generation: int, commits: list[CommitRequest]
    ) -> dict[str, Any]:
        streams = await self._streams_of(name, fresh=bool(commits))
        records, rejected, was_member = self.groups.decide_leave(
            name, incarnation, member, generation, commits, streams, self.clock.now_ms()
        )
        await self._commit(records)
        await self._settled()
        return {"group": name, "member": member, "left": was_member, "rejected": rejected_json(rejected)}

    # ------------------------------------------------------------- long-poll

    def _notify(self, name: str) -> None:
        for fut in self._waiters.pop(name, []):
            if not fut.done():
                fut.set_result(None)

    def notify_all(self) -> None:
        for name in list(self._waiters):
            self._notify(name)

    async def wait_for_change(self, name: str, incarnation: int, revision: int, timeout_s: float) -> None:
        """Park until the group's plan moves past ``revision`` (or it goes), or the timeout."""
        deadline = self.clock.monotonic() + timeout_s
        loop = asyncio.get_running_loop()
        while not self.closing:
            g = self.groups.groups.get(name)
            if g is None or g.incarnation != incarnation or g.revision != revision:
                return
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.setdefault(name, []).append(fut)
            try:
                # Short slices: a shutdown releases parked heartbeats promptly.
                async with asyncio.timeout(min(remaining, 0.5)):
                    await fut
            except TimeoutError:
                pass
            finally:
                futs = self._waiters.get(name)
                if futs is not None and fut in futs:
                    futs.remove(fut)
                    if not futs:
                        del self._waiters[name]

    # ------------------------------------------------------------- sweeper

    def grant_grace(self) -> None:
        """After a restart every member gets a full session timeout to come back."""
        self.groups.grant_grace(self.clock.now_ms())

    async def sweep(self) -> int:
        """Journal expirations and stream-set changes; returns how many plans."""
        if self.committer.journal.failed is not None:
            return 0
        streams = await self._streams({g.spec.bucket for g in self.groups.groups.values()}, fresh=False)
        if self.committer.journal.failed is not None:
            return 0
        records = self.groups.decide_sweep(streams, self.clock.now_ms())
        await self._commit(records)
        return len(records)

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            try:
                await self.sweep()
            except TieredError as exc:
                log.warning("group sweep not journaled: %s", exc.message)
            except Exception:
                log.exception("group sweep failed")


class CursorSkips:
    """Group cursors retention moved past uncommitted data: one warning per range, and the lifetime counters.

    Shared by the observer that reports each durable ``GroupCursorsSkipped``
    and the service that shows the counters (``/metrics``), as journaled by this process.
    """

    def __init__(self) -> None:
        self.skipped_bytes = 0
        self.skipped_ranges = 0

    def report(self, record: GroupCursorsSkipped, bucket: str) -> None:
        for r in record.skips:
            self.skipped_bytes += r.end - r.start
            self.skipped_ranges += 1
            log.warning(
                "group %r: retention passed its cursor on stream %r (bucket %r): moved from %s to %s, %d bytes skipped",
                record.name,
                r.path,
                bucket,
                format_offset(r.start),
                format_offset(r.end),
                r.end - r.start,
            )


class RetentionFollower:
    """Commit observer: a retention record's follow-up moves the group cursors it passed; moves get reported.

    ``follow=False`` (offline GC passes, which write GC records only) still
    reports but adds nothing: the server moves those cursors at its next sweep.
    """

    def __init__(
        self, groups: GroupsState, state: StreamState, skips: CursorSkips, *, follow: bool = True
    ) -> None:
        self.groups = groups
        self.state = state
        self.skips = skips
        self.follow = follow

    def before_apply(self, record: Any) -> object:
        return None

    def after_apply(self, record: Any, token: object) -> Sequence[Any]:
        groups = self.groups
        if self.follow and isinstance(record, RetentionAdvanced) and groups.groups:
            return groups.decide_skips(self.state, record.ts_ms)
        return ()

    def on_durable(self, record: Any) -> Callable[[], None] | None:
        if not isinstance(record, GroupCursorsSkipped):
            return None
        g = self.groups.groups.get(record.name)
        bucket = g.spec.bucket if g is not None else "?"
        return lambda: self.skips.report(record, bucket)
