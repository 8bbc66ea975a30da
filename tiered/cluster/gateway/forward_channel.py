"""A worker's persistent connections to a sibling's frame socket: a forwarded request out, its answer back.

The client half of ``forward_frames.py``. Writes (everything but ``GET`` and
``HEAD``) go on one shared connection per sibling, each ``ASK`` frame with
its own id, queued and written once per turn of the event loop; answers come
back whole and are matched by id; a request whose caller left is stopped on
the owner with ``CANCEL``; one timer per connection fails requests past their
read timeout. Reads, which may stream, go one at a time on a pooled
connection and get the answer as the owner framed it: a whole body, or an
event stream as ``CHUNK`` frames, passed on as they arrive (the connection
stops reading while the client's reader is behind, so a slow reader holds the
owner back rather than this worker's memory); a caller that left closes that
connection, which stops the read on the owner. No HTTP is written or parsed
on either side.

A failure says whether the request may have reached the owner
(``ChannelFailed.sent``): a connection that could not be opened, or a frame
still queued when the connection was lost, means it did not; one lost after
the frame was written means it may have (the caller, ``forward.py``, then
never resends a write that is not idempotent).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TypeVar, cast

from tiered.cluster.gateway.forward_batch import TurnBatch, write_all
from tiered.cluster.gateway.forward_frames import (
    ASK,
    CANCEL,
    CHUNK,
    CUT,
    END,
    HEAD,
    WHOLE,
    Ask,
    FrameError,
    FrameReader,
    decode_said,
    frame,
    frame_parts,
)
from tiered.cluster.gateway.unix_http import Answer  # one answer type for both ways to a sibling

__all__ = ["Answer", "ChannelFailed", "FrameChannel", "frames_socket"]

log = logging.getLogger(__name__)

_P = TypeVar("_P", bound=asyncio.Protocol)

#: A streamed answer's bytes held for a slow reader before the connection stops reading.
_HOLD_BYTES = 256 * 1024


def frames_socket(http_socket: str) -> str:
    """A worker's frame socket, beside the HTTP socket it advertises (``w0.sock`` -> ``w0.frames``)."""
    base = http_socket[: -len(".sock")] if http_socket.endswith(".sock") else http_socket
    return base + ".frames"


class ChannelFailed(Exception):
    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class _Stream:
    """A streamed answer's body as it arrives; closing it early closes the connection (the owner stops)."""

    __slots__ = ("_conn", "_chunks", "_held", "_waiter", "_end", "_timeout_s")

    def __init__(self, conn: _Conn, timeout_s: float) -> None:
        self._conn = conn
        self._chunks: collections.deque[bytes] = collections.deque()
        self._held = 0
        self._waiter: asyncio.Future[None] | None = None
        self._end: str | None = None  # "end" (clean), or why it was cut
        self._timeout_s = timeout_s

    def push(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._held += len(chunk)
        if self._held > _HOLD_BYTES:
            self._conn.pause()
        self._wake()

    def finish(self, how: str) -> None:
        if self._end is None:
            self._end = how
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> bytes:
        while not self._chunks:
            if self._end is not None:
                if self._end != "end":
                    log.info("a forwarded event stream ended early: %s", self._end)
                    raise ChannelFailed(f"the owner's stream was cut: {self._end}", sent=True)
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, self._timeout_s)
            except TimeoutError:
                self._conn.close()
                self.finish("no data within the read timeout")
            finally:
                self._waiter = None
        chunk = self._chunks.popleft()
        self._held -= len(chunk)
        if self._held <= _HOLD_BYTES // 2 and self._end is None:
            # Only while the answer is still arriving: after its end the connection may carry another.
            self._conn.resume()
        return chunk

    async def aclose(self) -> None:
        if self._end is None:
            self._conn.close()  # the reader left: the owner's stream is cancelled
            self.finish("closed by the reader")


class _Conn(asyncio.Protocol):
    """One connection to the owner's frame socket; carries one request at a time."""

    def __init__(self, channel: FrameChannel, max_body: int) -> None:
        self.channel = channel
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader(max_body)
        self.answer: asyncio.Future[Answer] | None = None
        self.stream: _Stream | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timeout_s = 0.0
        self.lost = False
        self._paused = False

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        try:
            for kind, _, meta, body in self.reader.feed(data):
                self._frame(kind, meta, body)
        except FrameError as exc:
            log.warning("closing a forwarding connection to %s: %s", self.channel.path, exc)
            self._fail(f"a malformed answer: {exc}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(f"the connection closed ({exc!r})" if exc is not None else "the connection closed")

    def pause_writing(self) -> None:  # a request body larger than the socket buffer: the kernel drains it
        pass

    def resume_writing(self) -> None:
        pass

    # -- one request ---------------------------------------------------------------------

    def send(self, parts: list[bytes], timeout_s: float) -> asyncio.Future[Answer]:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.answer = answer = loop.create_future()
        self.timeout_s = timeout_s
        self.timer = loop.call_later(timeout_s, self._timed_out)
        write_all(self.transport, parts)
        return answer

    def _frame(self, kind: int, meta: bytes, body: bytes) -> None:
        if kind == WHOLE or kind == HEAD:
            answer = self.answer
            if answer is None or self.stream is not None:
                raise FrameError("an answer to no request")
            said = decode_said(meta)
            self._stop_timer()
            self.answer = None
            if kind == WHOLE:
                if not answer.done():
                    answer.set_result(Answer(said.status, said.headers, body))
                self.channel.release(self)
                return
            self.stream = _Stream(self, self.timeout_s)
            if not answer.done():
                answer.set_result(Answer(said.status, said.headers, self.stream))
            return
        stream = self.stream
        if stream is None:
            raise FrameError(f"a stream frame {kind:#x} outside a streamed answer")
        if kind == CHUNK:
            stream.push(body)
        elif kind == END:
            # The whole answer is here (what the reader has not taken is held by its stream): the
            # connection reads again before it is pooled, or the next request on it would wait forever.
            self.stream = None
            self.resume()
            stream.finish("end")
            self.channel.release(self)
        elif kind == CUT:
            self.stream = None
            stream.finish("the owner's stream failed")
            self.close()
        else:
            raise FrameError(f"an unexpected frame {kind:#x} in an answer")

    def _timed_out(self) -> None:
        self.timer = None
        self._fail(f"no answer within {self.timeout_s:.0f} s")
        self.close()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fail(self, why: str) -> None:
        self._stop_timer()
        answer, self.answer = self.answer, None
        if answer is not None and not answer.done():
            answer.set_exception(ChannelFailed(f"{self.channel.path}: {why}", sent=True))
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.finish(why)

    # -- flow control and closing ----------------------------------------------------------

    def pause(self) -> None:
        if not self._paused and self.transport is not None and not self.lost:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.lost:
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    @property
    def idle(self) -> bool:
        return (
            not self.lost
            and not self._paused
            and self.answer is None
            and self.stream is None
            and not self.reader.pending
        )


class _Pending:
    __slots__ = ("answer", "deadline", "sent")

    def __init__(self, answer: asyncio.Future[Answer], deadline: float) -> None:
        self.answer = answer
        self.deadline = deadline
        self.sent = False  # written to the socket (not only queued)


class _MuxConn(asyncio.Protocol):
    """The shared connection writes go on: many requests at a time, matched to their answers by id.

    Requests queued in one turn of the event loop leave in one ``write``.
    """

    def __init__(self, channel: FrameChannel, max_body: int) -> None:
        self.channel = channel
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader(max_body)
        self.pending: dict[int, _Pending] = {}
        self.lost = False
        self._next = 0
        self._batch = TurnBatch(self._write)
        self._queued: list[_Pending] = []  # requests in the batch, not written yet
        self._sweeping: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        try:
            for kind, rid, meta, body in self.reader.feed(data):
                pending = self.pending.pop(rid, None)
                if kind == WHOLE:
                    said = decode_said(meta)
                    if pending is not None and not pending.answer.done():
                        pending.answer.set_result(Answer(said.status, said.headers, body))
                elif kind != CUT:
                    raise FrameError(f"frame {kind:#x} on a multiplexed connection")
                elif pending is not None and not pending.answer.done():
                    pending.answer.set_exception(ChannelFailed(f"{self.channel.path}: answer cut", sent=True))
        except FrameError as exc:
            log.warning("closing a forwarding connection to %s: %s", self.channel.path, exc)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.channel.lost(self)
        why = f"the connection closed ({exc!r})" if exc is not None else "the connection closed"
        pending, self.pending = self.pending, {}
        for p in pending.values():
            if not p.answer.done():
                p.answer.set_exception(ChannelFailed(f"{self.channel.path}: {why}", sent=p.sent))
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def send(self, ask: Ask, body: bytes, timeout_s: float) -> tuple[int, _Pending]:
        loop = asyncio.get_running_loop()
        self._next = rid = self._next % 0xFFFFFFFF + 1
        parts = frame_parts(ASK, ask, body, rid)
        pending = self.pending[rid] = _Pending(loop.create_future(), loop.time() + timeout_s)
        self._batch.add(parts)
        self._queued.append(pending)
        if self._sweeping is None:
            self._sweeping = loop.call_later(_SWEEP_S, self._sweep)
        return rid, pending

    def cancel(self, rid: int) -> None:
        """The caller left (or gave up): the owner stops the request. A request still queued here leaves
        with its ``CANCEL`` right behind it, so the owner never starts it."""
        self.pending.pop(rid, None)
        if not self.lost:
            self._batch.add([frame(CANCEL, rid=rid)])

    def _write(self, out: list[bytes]) -> None:
        queued, self._queued = self._queued, []
        transport = self.transport
        if transport is None or self.lost:
            return
        for p in queued:
            p.sent = True
        write_all(transport, out)

    def _sweep(self) -> None:
        """Fail requests past their read timeout (one timer per connection, not one per request)."""
        self._sweeping = None
        now = asyncio.get_running_loop().time()
        late = [rid for rid, p in self.pending.items() if p.deadline <= now]
        for rid in late:
            p = self.pending.pop(rid)
            if not p.answer.done():  # the caller then cancels it on the owner
                p.answer.set_exception(ChannelFailed(f"{self.channel.path}: no answer in time", sent=True))
        if self.pending and not self.lost:
            self._sweeping = asyncio.get_running_loop().call_later(_SWEEP_S, self._sweep)


_SWEEP_S = 1.0


class FrameChannel:
    """Connections to one sibling's frame socket: the shared one for writes, a pool for reads."""

    def __init__(
        self, path: str, *, connect_timeout_s: float, read_timeout_s: float, max_body: int, max_idle: int = 64
    ) -> None:
        self.path = path
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_body = max_body
        self.max_idle = max_idle
        self._idle: list[_Conn] = []
        self._mux: _MuxConn | None = None
        self._mux_connecting: asyncio.Task[_MuxConn] | None = None

    async def close(self) -> None:
        connecting, self._mux_connecting = self._mux_connecting, None
        if connecting is not None:
            connecting.cancel()
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        mux, self._mux = self._mux, None
        if mux is not None:
            mux.close()

    def release(self, conn: _Conn) -> None:
        if conn.idle and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    def lost(self, mux: _MuxConn) -> None:
        if self._mux is mux:
            self._mux = None

    async def _connect(self) -> _Conn:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.idle:
                return conn
            conn.close()
        _, conn = await self._open(lambda: _Conn(self, self.max_body))
        return conn

    async def _open(self, factory: Callable[[], _P]) -> tuple[asyncio.BaseTransport, _P]:
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.create_unix_connection(factory, self.path), self.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise ChannelFailed(f"cannot connect to {self.path}: {exc!r}", sent=False) from exc

    async def _shared(self) -> _MuxConn:
        mux = self._mux
        if mux is not None and not mux.lost:
            return mux
        connecting = self._mux_connecting
        if connecting is None:  # one connect for every request waiting for it, in a task of its own:
            # a caller that leaves (cancelled) while it runs leaves alone, the others still get it
            connecting = self._mux_connecting = asyncio.ensure_future(self._open_shared())
            connecting.add_done_callback(_retrieved)
        return await asyncio.shield(connecting)

    async def _open_shared(self) -> _MuxConn:
        try:
            _, mux = await self._open(lambda: _MuxConn(self, self.max_body))
        except asyncio.CancelledError:  # only ``close`` cancels it: nothing was sent
            raise ChannelFailed(f"{self.path}: the channel closed while connecting", sent=False) from None
        finally:
            if self._mux_connecting is asyncio.current_task():
                self._mux_connecting = None
        self._mux = mux
        return mux

    async def request(self, ask: Ask, body: bytes, *, read_timeout_s: float | None = None) -> Answer:
        """Send ``ask`` and its ``body``; the answer, its body whole or streamed (an event stream).

        Reads (``GET``, ``HEAD``: they may stream) go one at a time on a pooled connection; everything
        else on the shared one. Raises ``UnicodeEncodeError`` (nothing sent) for a header value that
        is not valid text.
        """
        timeout_s = read_timeout_s if read_timeout_s is not None else self.read_timeout_s
        if ask.method not in _READS:
            mux = await self._shared()
            rid, pending = mux.send(ask, body, timeout_s)
            try:
                return await pending.answer
            except BaseException:
                mux.cancel(rid)  # failed or cancelled (the client left): the owner stops too
                raise
        parts = frame_parts(ASK, ask, body)
        conn = await self._connect()
        answer = conn.send(parts, timeout_s)
        try:
            return await answer
        except BaseException:
            conn.close()  # failed, or cancelled mid-answer (the client left): the owner's request ends too
            raise


_READS = frozenset({"GET", "HEAD"})


def _retrieved(task: asyncio.Task[_MuxConn]) -> None:
    """A connect's failure is its waiters' to raise; with none left, it is not an unretrieved error."""
    if not task.cancelled():
        task.exception()
