"""A Python client for consumer groups: ``GroupConsumer`` (asyncio + aiohttp).

```python
async with GroupConsumer("http://127.0.0.1:4437", "billing", "worker-1") as consumer:
    async for batch in consumer:
        handle(batch.stream, batch.data)      # batch.json() for JSON streams
        # auto_commit (default): the batch is committed when you ask for the next one
```

What it does for you:

* joins with a fresh ``join_id`` per instance (a retried join reuses it);
* heartbeats in the background (long-polling the plan), sending commits and
  releases with them and applying the returned assignment;
* reads every active stream from its committed cursor (catch-up reads, then
  ``live=long-poll``) and hands out ``Batch`` es one at a time;
* when retention released data before it was processed (a read answered 410
  with the retained offset in ``Stream-Next-Offset``, or an assignment whose
  cursor the server moved, with a ``skipped`` range), logs a warning,
  continues from the retained offset and sets ``Batch.skipped`` on the next
  batch of that stream (an empty batch if the stream closed right there), so
  the application learns what it will never see;
* on revocation stops reading the stream and releases it once the batch in
  your hands (if it is from that stream) is finished, with its commit;
* on a stream-level fence (another instance now holds it) forgets the stream
  and any batches of it still queued;
* on ``NOT_MEMBER`` (expired, e.g. after a long pause) or an ``incarnation``
  fence (the group was deleted and created again) drops everything
  uncommitted and joins again; on a ``generation`` fence (a newer instance
  joined under the same member id) it stops with ``GroupFenced`` unless
  ``rejoin_when_superseded=True``;
* retries network errors and 5xx with capped backoff, so a server restart is
  a pause, not an error.

Delivery is at least once: a batch may be handed out again (to this or
another member) if its commit did not reach the server before a move.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

log = logging.getLogger(__name__)

_NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)
#: An assignment's cursor when nothing was committed on its stream yet: read from the stream's start.
FROM_START = "-1"


class GroupClientError(Exception):
    """The server refused a group call for good."""

    def __init__(self, status: int, body: Any) -> None:
        err = body.get("error") if isinstance(body, dict) else None
        self.status = status
        self.code = err.get("code") if isinstance(err, dict) else None
        self.body = body
        message = err.get("message") if isinstance(err, dict) else str(body)
        super().__init__(f"{status} {self.code}: {message}")


class GroupFenced(GroupClientError):
    """A newer instance joined under this member id: this one must stop."""


class GroupNotFound(GroupClientError):
    pass


@dataclass(frozen=True, slots=True)
class Skipped:
    """Bytes ``[from_offset, to_offset)`` of ``stream`` that retention released before they were processed.

    ``bytes`` is the server's count when it reported the range with the
    assignment; None when this client met the gap itself (a 410 on a read:
    offsets are opaque to clients, so it does not count them).
    """

    stream: str
    from_offset: str
    to_offset: str
    bytes: int | None


@dataclass(frozen=True, slots=True)
class Batch:
    """Bytes ``[offset, next_offset)`` of one stream; commit ``next_offset`` once processed.

    ``skipped`` is set on the first batch after a gap: data just before
    ``offset`` that retention released before anyone processed it.
    """

    stream: str
    offset: str
    next_offset: str
    data: bytes
    fence: int
    content_type: str
    skipped: Skipped | None = None

    def json(self) -> list[Any]:
        """The messages of a JSON stream (the server sends them as one array)."""
        return json.loads(self.data) if self.data else []


@dataclass(slots=True)
class _Slot:
    fence: int
    position: str  # next offset to hand out
    reader: asyncio.Task[None] | None = None
    revoked: bool = False


@dataclass(slots=True)
class _Sent:
    commits: dict[str, tuple[int, str]] = field(default_factory=dict)
    releases: dict[str, int] = field(default_factory=dict)


class GroupConsumer:
    def __init__(
        self,
        base_url: str,
        group: str,
        member: str,
        *,
        session: aiohttp.ClientSession | None = None,
        auto_commit: bool = True,
        wait_ms: int | None = None,
        commit_interval_s: float = 0.2,
        queue_size: int = 16,
        rejoin_when_superseded: bool = False,
        max_backoff_s: float = 2.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.group = group
        self.member = member
        self.auto_commit = auto_commit
        self.commit_interval_s = commit_interval_s
        self.rejoin_when_superseded = rejoin_when_superseded
        self.max_backoff_s = max_backoff_s
        self._wait_ms_setting = wait_ms
        self._session = session
        self._own_session = session is None
        self._queue: asyncio.Queue[Batch | None] = asyncio.Queue(queue_size)
        self._streams: dict[str, _Slot] = {}
        self._commits: dict[str, tuple[int, str]] = {}  # stream -> (fence, next offset)
        self._releases: dict[str, int] = {}  # stream -> fence
        self._in_hand: Batch | None = None
        self._kick = asyncio.Event()
        self._joined = False
        self._join_id: str | None = None
        self.incarnation: int | None = None
        self.generation: int | None = None
        self.revision: int | None = None
        self.bucket = "default"
        self.session_timeout_ms = 10_000
        self._hb_task: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        self._closed = False

    # ------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> GroupConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        await self._join()
        self._hb_task = asyncio.create_task(self._heartbeat_loop(), name=f"group-heartbeat-{self.member}")

    async def close(self, *, leave: bool = True) -> None:
        """Stop reading, send pending commits with a leave (unless ``leave=False``)."""
        if self._closed:
            return
        self._closed = True
        if self._hb_task is not None:
            self._hb_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._hb_task
        for stream in list(self._streams):
            self._stop_reader(stream)
        if leave and self._joined and self._fatal is None:
            body = {
                "member": self.member,
                "incarnation": self.incarnation,
                "generation": self.generation,
                "commits": [{"stream": s, "fence": f, "offset": o} for s, (f, o) in self._commits.items()],
            }
            with contextlib.suppress(*_NETWORK_ERRORS):
                await self._post("leave", body, timeout=5)
        self._wake_iterator()
        if self._own_session and self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------- iteration

    def __aiter__(self) -> AsyncIterator[Batch]:
        return self

    async def __anext__(self) -> Batch:
        self._finish_in_hand()
        while True:
            if self._fatal is not None:
                raise self._fatal
            if self._closed:
                raise StopAsyncIteration
            item = await self._queue.get()
            if item is None:
                continue
            slot = self._streams.get(item.stream)
            follows = item.offset == slot.position if slot is not None else False
            if slot is not None and item.skipped is not None:
                follows = follows or item.skipped.from_offset == slot.position  # right after a gap
            if slot is None or slot.fence != item.fence or slot.revoked or not follows:
                continue  # from a reader of an earlier activation: stale
            slot.position = item.next_offset
            self._in_hand = item
            return item

    def commit(self, batch: Batch) -> bool:
        """Commit ``batch.next_offset`` (sent with the next heartbeat). False if the stream was lost."""
        return self.commit_offset(batch.stream, batch.fence, batch.next_offset)

    def commit_offset(self, stream: str, fence: int, offset: str) -> bool:
        slot = self._streams.get(stream)
        if slot is None or slot.fence != fence:
            return False
        prev = self._commits.get(stream)
        if prev is None or prev[0] != fence or offset > prev[1]:
            self._commits[stream] = (fence, offset)
            self._kick.set()
        return True

    async def flush(self, timeout: float = 10.0) -> None:
        """Wait until every commit made so far was acknowledged by the server."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._kick.set()
        while self._commits or self._releases:
            if self._fatal is not None:
                raise self._fatal
            if loop.time() > deadline:
                raise TimeoutError("commits not acknowledged in time")
            await asyncio.sleep(0.02)

    @property
    def assigned(self) -> dict[str, int]:
        """Streams this instance may process now, with their fences."""
        return {s: slot.fence for s, slot in self._streams.items() if not slot.revoked}

    def _finish_in_hand(self) -> None:
        batch, self._in_hand = self._in_hand, None
        if batch is None:
            return
        if self.auto_commit:
            self.commit(batch)
        slot = self._streams.get(batch.stream)
        if slot is not None and slot.revoked and slot.fence == batch.fence:
            self._release(batch.stream)

    def _wake_iterator(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)

    # ------------------------------------------------------------- HTTP

    async def _post(self, action: str, body: dict[str, Any], timeout: float = 10.0) -> tuple[int, Any]:
        assert self._session is not None
        url = f"{self.base_url}/v1/groups/{self.group}/{action}"
        async with self._session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            text = await resp.read()
            try:
                data = json.loads(text) if text else None
            except ValueError:
                data = text.decode(errors="replace")
            return resp.status, data

    async def _backoff(self, attempt: int) -> None:
        delay = min(self.max_backoff_s, 0.05 * 2 ** min(attempt, 8))
        await asyncio.sleep(delay * (0.5 + random.random() / 2))

    # ------------------------------------------------------------- membership

    async def _join(self) -> None:
        self._join_id = uuid.uuid4().hex
        attempt = 0
        while True:
            try:
                status, body = await self._post("join", {"member": self.member, "join_id": self._join_id})
            except _NETWORK_ERRORS:
                attempt += 1
                await self._backoff(attempt)
                continue
            if status == 200:
                self._joined = True
                self._apply_view(body)
                return
            code = body.get("error", {}).get("code") if isinstance(body, dict) else None
            if status >= 500:
                attempt += 1
                await self._backoff(attempt)
            elif code == "FENCED":  # this join id was retired before we heard back: a new instance identity
                self._join_id = uuid.uuid4().hex
            elif status == 404:
                raise GroupNotFound(status, body)
            else:
                raise GroupClientError(status, body)

    def _reset(self) -> None:
        """Forget every stream and everything uncommitted (we are no longer a member)."""
        for stream in list(self._streams):
            self._stop_reader(stream)
        self._streams.clear()
        self._commits.clear()
        self._releases.clear()
        self._in_hand = None
        self._joined = False
        while not self._queue.empty():
            self._queue.get_nowait()

    def _fail(self, exc: BaseException) -> None:
        self._fatal = exc
        self._reset()
        self._wake_iterator()

    @property
    def _wait_ms(self) -> int:
        if self._wait_ms_setting is not None:
            return self._wait_ms_setting
        return max(100, min(5000, self.session_timeout_ms // 3))

    async def _heartbeat_loop(self) -> None:
        try:
            await self._heartbeats()
        except asyncio.CancelledError:
            raise
        except GroupClientError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug: surface it to the iterating code rather than hang
            log.exception("group heartbeat loop failed")
            self._fail(exc)

    async def _heartbeats(self) -> None:
        loop = asyncio.get_running_loop()
        attempt = 0
        last_sent = 0.0
        while True:
            try:
                if not self._joined:
                    await self._join()
                urgent = bool(self._releases)
                pending = urgent or bool(self._commits)
                if pending and not urgent:
                    delay = last_sent + self.commit_interval_s - loop.time()
                    if delay > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._release_kick(), delay)
                        continue
                self._kick.clear()
                sent = _Sent(dict(self._commits), dict(self._releases))
                wait_ms = 0 if pending else self._wait_ms
                body = {
                    "member": self.member,
                    "incarnation": self.incarnation,
                    "generation": self.generation,
                    "revision": self.revision,
                    "wait_ms": wait_ms,
                    "commits": [{"stream": s, "fence": f, "offset": o} for s, (f, o) in sent.commits.items()],
                    "releases": [{"stream": s, "fence": f} for s, f in sent.releases.items()],
                }
                last_sent = loop.time()
                request = asyncio.ensure_future(self._post("heartbeat", body, timeout=wait_ms / 1000 + 10))
                kicked: asyncio.Future[Any] | None = None
                try:
                    if not pending:
                        # A long-poll carries nothing: abandon it as soon as there is something to send.
                        kicked = asyncio.ensure_future(self._kick.wait())
                        done, _ = await asyncio.wait({request, kicked}, return_when=asyncio.FIRST_COMPLETED)
                        if request not in done:
                            request.cancel()
                            # Wait for its end, not its outcome: ``await request`` would raise the
                            # request's CancelledError, and suppressing that also swallowed a cancellation
                            # of this task (close()) arriving meanwhile, so the loop went on for ever.
                            await asyncio.wait({request})
                            if not request.cancelled():
                                request.exception()  # ended before the cancel took: its outcome is moot
                            continue
                    status, resp = await request
                finally:
                    if kicked is not None:
                        kicked.cancel()
                    if not request.done():  # closing: the heartbeat in flight dies with the loop, not later
                        request.cancel()
            except _NETWORK_ERRORS:
                attempt += 1
                await self._backoff(attempt)
                continue
            if status == 200:
                attempt = 0
                self._acknowledged(sent, resp)
                continue
            if status >= 500:
                attempt += 1
                await self._backoff(attempt)
                continue
            error = resp.get("error", {}) if isinstance(resp, dict) else {}
            code, reason = error.get("code"), error.get("reason")
            if code == "NOT_MEMBER" or (code == "FENCED" and reason == "incarnation"):
                log.info("%s: %s (%s); joining again", self.member, code, reason)
                self._reset()
            elif code == "FENCED" and reason == "generation" and self.rejoin_when_superseded:
                self._reset()
            elif code == "FENCED":
                self._fail(GroupFenced(status, resp))
                return
            elif status == 404:
                self._fail(GroupNotFound(status, resp))
                return
            else:
                self._fail(GroupClientError(status, resp))
                return

    async def _release_kick(self) -> None:
        while not self._releases:
            self._kick.clear()
            await self._kick.wait()

    def _acknowledged(self, sent: _Sent, view: dict[str, Any]) -> None:
        for stream, entry in sent.commits.items():
            if self._commits.get(stream) == entry:
                del self._commits[stream]
        for stream, fence in sent.releases.items():
            if self._releases.get(stream) == fence:
                del self._releases[stream]
        for r in view.get("rejected", []):
            stream = r["stream"]
            sent_fence = sent.commits.get(stream, (None, ""))[0]
            if self._commits.get(stream, (None,))[0] == sent_fence:
                del self._commits[stream]
            held = self._streams.get(stream)
            if r["code"] in ("FENCED", "STREAM_GONE") and held is not None and held.fence == sent_fence:
                self._stop_reader(stream)  # that activation is over
        self._apply_view(view)

    # ------------------------------------------------------------- assignment

    def _apply_view(self, view: dict[str, Any]) -> None:
        if self.incarnation is not None and view["incarnation"] != self.incarnation:
            for stream in list(self._streams):
                self._stop_reader(stream)
            self._commits.clear()
            self._releases.clear()
        self.incarnation = view["incarnation"]
        self.generation = view["generation"]
        self.revision = view["revision"]
        self.bucket = view.get("bucket", self.bucket)
        self.session_timeout_ms = view["session_timeout_ms"]
        assigned = {a["stream"]: a for a in view["assignments"]}
        for stream, slot in list(self._streams.items()):
            a = assigned.get(stream)
            if a is None or a["fence"] != slot.fence:
                self._stop_reader(stream)  # lost (fenced, expired, gone) or activated anew
                if self._commits.get(stream, (None,))[0] == slot.fence:
                    del self._commits[stream]
        for stream, a in assigned.items():
            current = self._streams.get(stream)
            if a["revoked"]:
                if current is None:
                    if stream not in self._releases:
                        self._releases[stream] = a["fence"]
                        self._kick.set()
                elif not current.revoked:
                    current.revoked = True
                    self._cancel_reader(current)
                    if self._in_hand is None or self._in_hand.stream != stream:
                        self._release(stream)
            elif current is None:
                fresh = _Slot(fence=a["fence"], position=a["cursor"])
                self._streams[stream] = fresh
                gap = a.get("skipped")  # the server moved the cursor past released data: tell the application
                skipped = Skipped(stream, gap["from"], gap["to"], gap.get("bytes")) if gap else None
                fresh.reader = asyncio.create_task(self._read_loop(stream, fresh.fence, a["cursor"], skipped))
            elif current.revoked:  # given back to us before we released it: carry on where we were
                current.revoked = False
                current.reader = asyncio.create_task(self._read_loop(stream, current.fence, current.position))

    def _release(self, stream: str) -> None:
        slot = self._streams.pop(stream, None)
        if slot is None:
            return
        self._cancel_reader(slot)
        self._releases[stream] = slot.fence
        self._kick.set()

    def _stop_reader(self, stream: str) -> None:
        slot = self._streams.pop(stream, None)
        if slot is not None:
            self._cancel_reader(slot)

    @staticmethod
    def _cancel_reader(slot: _Slot) -> None:
        if slot.reader is not None:
            slot.reader.cancel()
            slot.reader = None

    # ------------------------------------------------------------- reading

    def _stream_url(self, stream: str, query: str) -> URL:
        path = quote(stream, safe="/")
        if self.bucket == "default":
            return URL(f"{self.base_url}/v1/stream/{path}?{query}", encoded=True)
        return URL(f"{self.base_url}/v1/buckets/{self.bucket}/stream/{path}?{query}", encoded=True)

    async def _first_offset(self, stream: str) -> str | None:
        """The stream's earliest retained offset (``HEAD``), or None if it is gone."""
        assert self._session is not None
        attempt = 0
        while True:
            try:
                async with self._session.head(
                    self._stream_url(stream, ""), timeout=aiohttp.ClientTimeout(total=60)
                ) as resp:
                    status, first = resp.status, resp.headers.get("Stream-Retained-Offset")
            except _NETWORK_ERRORS:
                status, first = 0, None
            if status == 200 and first is not None:
                return first
            if status in (404, 410):
                return None
            attempt += 1
            await self._backoff(attempt)

    async def _read_loop(self, stream: str, fence: int, offset: str, skipped: Skipped | None = None) -> None:
        """Catch up from the cursor, then long-poll; queue one batch per response.

        ``skipped``: a gap just before ``offset`` to hand out with the next batch.
        """
        assert self._session is not None
        if offset == FROM_START:
            # Nothing committed yet: start at the stream's first retained offset, so every batch names
            # real offsets (a stream created again where one was deleted does not start at zero).
            first = await self._first_offset(stream)
            if first is None:
                return  # the stream is gone; the next plan drops it
            slot = self._streams.get(stream)
            if slot is not None and slot.fence == fence and slot.position == FROM_START:
                slot.position = first
            offset = first
        live = False
        attempt = 0
        gap = skipped
        while True:
            query = f"offset={offset}" + ("&live=long-poll" if live else "")
            try:
                async with self._session.get(
                    self._stream_url(stream, query), timeout=aiohttp.ClientTimeout(total=60)
                ) as resp:
                    status = resp.status
                    data = await resp.read()
                    headers = resp.headers
            except _NETWORK_ERRORS:
                attempt += 1
                await self._backoff(attempt)
                continue
            if status in (200, 204):
                attempt = 0
                nxt = headers.get("Stream-Next-Offset", offset)
                up_to_date = headers.get("Stream-Up-To-Date") == "true"
                closed = up_to_date and headers.get("Stream-Closed") == "true"
                ct = headers.get("Content-Type", "application/octet-stream")
                if status == 200 and nxt != offset:
                    await self._queue.put(Batch(stream, offset, nxt, data, fence, ct, gap))
                    gap = None
                elif gap is not None and closed:  # no batch will ever follow the gap: it goes out alone
                    await self._queue.put(Batch(stream, offset, offset, b"", fence, ct, gap))
                    gap = None
                offset = nxt
                if closed:
                    return  # nothing more will ever come
                live = up_to_date
            elif status == 410 and headers.get("Stream-Next-Offset", "") > offset:
                # Retention released data from ``offset`` on: continue at the retained offset, reporting the gap.
                retained = headers["Stream-Next-Offset"]
                log.warning(
                    "%s: group %r: data of stream %r from %s to %s is no longer retained; continuing from "
                    "the retained offset (the next batch reports the skipped range)",
                    self.member,
                    self.group,
                    stream,
                    offset,
                    retained,
                )
                gap = Skipped(stream, gap.from_offset if gap is not None else offset, retained, None)
                offset, live, attempt = retained, False, 0
            elif status in (404, 410):
                return  # the stream is gone (deleted: a 410 without a retained offset); the next plan drops it
            else:
                attempt += 1
                await self._backoff(attempt)
