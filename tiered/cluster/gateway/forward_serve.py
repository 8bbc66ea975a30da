"""The owner's half of forwarding between workers: serve a framed request as if it arrived here.

A worker listens on a Unix socket for ``ASK`` frames (``forward_frames.py``)
from its siblings. Each one becomes a ``ForwardedRequest``: a
``tiered.api.kit.types.Request`` whose target is the one the receiving
worker parsed and routed by (never parsed again), whose body is the bytes the
frame carried, and whose headers are the client's (the credential among
them). It goes straight to the handler it is given: the node's shard routing
behind the one error mapping (``tiered/cluster/workers/handler.py``), which
serves it from the shard's engine here (authorized there, once: the
receiving worker makes no access decision) or, if the shard moved away
meanwhile, answers 503 with a retry hint (a forwarded request is never
forwarded again). The request was counted, logged and given its request id
by the worker the client reached; here it only runs under that id.

The answer goes back framed, with the request's id. On the shared
(multiplexed) connection writes come on, requests run concurrently and their
answers, whole, are queued and written once per turn of the event loop (a
group commit acknowledges many appends at once: one system call for all their
answers); a ``CANCEL`` stops one request. On a dedicated connection (reads) a
streamed answer (SSE) goes as chunks, written as the owner produces them and
paused while the socket is full (the receiving worker stops reading while its
client is behind); a stream that fails here is sent as ``CUT``, so the client
sees a cut stream, never a clean end. A connection closed by the receiving
worker (its clients left, it timed out, it died) cancels every request it
carried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

from tiered.api.kit.errors import ClientDisconnected, error_response
from tiered.api.kit.rsgi_server import RsgiHeaders
from tiered.api.kit.types import Handler, Request
from tiered.cluster.gateway.forward_batch import TurnBatch, write_all
from tiered.cluster.gateway.forward_frames import (
    ASK,
    CANCEL,
    CHUNK,
    CUT,
    END,
    HEAD,
    HOP_BY_HOP,
    MAX_ANSWER,
    WHOLE,
    Ask,
    FrameError,
    FrameReader,
    Said,
    decode_ask,
    frame,
    frame_parts,
)
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.logs import REQUEST_ID

__all__ = ["ForwardedRequest", "FrameServer"]

log = logging.getLogger(__name__)


async def _no_read() -> bytes:  # pragma: no cover - the body is set before anything reads it
    return b""


class ForwardedRequest(Request):
    """A request a sibling worker received and parsed: its target and body as that worker had them."""

    __slots__ = ()

    def __init__(self, ask: Ask, body: bytes) -> None:
        super().__init__(
            ask.method,
            ask.path,
            ask.query_string,
            RsgiHeaders(ask.headers),  # case-insensitive, as the adapters' (names are lower-case)
            _no_read,
            scheme=ask.scheme,
            host=ask.host,
        )
        self._body = body
        target = ask.target
        if target is not None:
            self._target = target  # the receiver's parse: what it routed by is what is judged here
            query = target.query
            self._query = query if isinstance(query, dict) else dict(query)


class _Serving(asyncio.Protocol):
    """One connection from a sibling: requests by id, answers written once per turn of the loop."""

    def __init__(self, server: FrameServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader(server.max_body_bytes)
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self._batch = TurnBatch(self._write)
        self._drained: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        tasks, self.tasks = self.tasks, {}
        for task in tasks.values():
            task.cancel()  # the sender left (its clients left, or it died): stop what it asked
        self._batch.clear()
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def pause_writing(self) -> None:
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            for kind, rid, meta, body in self.reader.feed(data):
                if kind == CANCEL:
                    task = self.tasks.pop(rid, None)
                    if task is not None:
                        task.cancel()
                    continue
                if kind != ASK or rid in self.tasks or (rid == 0 and self.tasks):
                    raise FrameError(f"frame {kind:#x} (request {rid}) where a new request was expected")
                task = asyncio.get_running_loop().create_task(self._serve(rid, decode_ask(meta), body))
                if not task.done():
                    self.tasks[rid] = task
        except FrameError as exc:
            log.warning("closing a forwarding connection: %s", exc)
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _send(self, parts: list[bytes]) -> None:
        """Queue frames; everything queued in this turn of the loop leaves in one write."""
        self._batch.add(parts)

    def _write(self, out: list[bytes]) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            write_all(transport, out)

    async def _serve(self, rid: int, ask: Ask, body: bytes) -> None:
        """Serve one request; it always gets an answer, or is cut (never left to the sender's timeout)."""
        REQUEST_ID.set(ask.request_id or None)
        answered = False
        try:
            await self._answer(rid, ask, body)
            answered = True
        except ClientDisconnected:  # the body is whole here: nothing the sender's client did
            log.warning("a forwarded %s %s ended as if its client had left", ask.method, ask.path[:200])
        except Exception:  # an answer that cannot be framed (a header value that is not text): a bug
            log.exception("a forwarded %s %s could not be answered", ask.method, ask.path[:200])
        finally:  # cancelled (the sender left or cancelled it): no answer is wanted
            self.tasks.pop(rid, None)
        if not answered:
            self._cut(rid)

    def _cut(self, rid: int) -> None:
        """No answer for ``rid``: the sender's caller gets a 503 to retry (the outcome unknown) at once."""
        if rid:
            self._send([frame(CUT, rid=rid)])
        else:  # a dedicated connection: closing it fails its one request, whatever was written of it
            self.close()

    async def _answer(self, rid: int, ask: Ask, body: bytes) -> None:
        request = ForwardedRequest(ask, body)
        try:
            response = await self.server.handler(request)
        except ClientDisconnected:
            raise
        except Exception:  # the handler maps every error; this is a bug, answered as the mapper would
            log.exception("internal error serving a forwarded %s %s", ask.method, ask.path[:200])
            response = error_response(TieredError(ErrorCode.INTERNAL_ERROR, "internal error"))
        transport = self.transport
        if transport is None or transport.is_closing():
            await _close_body(response.body)
            return
        said = Said(
            response.status, {k: v for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP}
        )
        answer = response.body
        if not isinstance(answer, bytes) and rid != 0:
            collected = await _collected(answer, self.server.max_answer_bytes, ask.path)
            if collected is None:  # cut: the sender's caller gets a 503 to retry (the outcome unknown)
                self._cut(rid)
                return
            answer = collected
        if isinstance(answer, bytes):
            self._send(frame_parts(WHOLE, said, answer, rid))
            return
        await self._stream(transport, said, answer, ask.path)

    async def _stream(
        self, transport: asyncio.Transport, said: Said, body: AsyncIterator[bytes], path: str
    ) -> None:
        """A streamed answer on a dedicated connection: chunks as they come, paused while the socket is full."""
        self._batch.flush()  # what was queued before leaves before this stream
        transport.write(frame(HEAD, said))
        try:
            async for chunk in body:
                if chunk:
                    transport.writelines(frame_parts(CHUNK, None, chunk))
                if self._drained is not None:
                    await self._drained
                if transport.is_closing():
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("forwarded streaming response to %s ended by an error: %s", path[:200], exc)
            transport.write(frame(CUT))
            return
        finally:
            await _close_body(body)
        transport.write(frame(END))


async def _collected(body: AsyncIterator[bytes], limit: int, path: str) -> bytes | None:
    """A streamed answer to a multiplexed request, whole: at most ``limit`` bytes, what the sender takes
    in one frame. None: past that, or failed, so it is cut (the sender answers 503, the outcome unknown),
    never a 500. (Only reads stream, and they come on dedicated connections: this is a safety net.)"""
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in body:
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                raise ValueError(f"over {limit} bytes")
    except Exception as exc:
        log.warning("a forwarded answer to %s could not be collected: %s", path[:200], exc)
        return None
    finally:
        await _close_body(body)
    return b"".join(parts)


async def _close_body(body: bytes | AsyncIterator[bytes]) -> None:
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


class FrameServer:
    """Serves framed requests from sibling workers on a Unix socket only this user can open."""

    def __init__(self, handler: Handler, *, max_body_bytes: int, max_answer_bytes: int = MAX_ANSWER) -> None:
        """``max_answer_bytes``: the largest whole answer the sending workers take (a streamed answer to
        a write is collected up to it)."""
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.max_answer_bytes = max_answer_bytes
        self.connections: set[_Serving] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self, path: Path) -> None:
        """Listen at ``path`` (a stale socket file a killed worker left is replaced), mode 0600."""
        path.unlink(missing_ok=True)
        loop = asyncio.get_running_loop()
        # The directory is the node's private one (mode 0700: ``tiered/cli/workers.py``), so nobody else
        # reaches the socket even before this chmod.
        self._server = await loop.create_unix_server(lambda: _Serving(self), str(path))
        os.chmod(path, 0o600)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for conn in list(self.connections):
            conn.close()  # cancels what they were serving
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)
