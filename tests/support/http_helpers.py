"""Tiny stdlib HTTP client helpers for the black-box ``test_http_*`` suites.

``request`` sends exactly the bytes it is given (no redirects, no retries, no
automatic headers beyond ``Host`` and ``Content-Length``) and returns
``(status, headers, body)`` where ``headers`` is an ``http.client.HTTPMessage``
(case-insensitive ``get``/``in``). Paths are sent raw, so tests can put
``..`` segments or percent-escapes on the wire.

``SseReader`` reads a ``live=sse`` response incrementally and parses it the
way a browser ``EventSource`` does (lines end at CRLF, LF or CR; ``data``
lines are joined with ``\\n``; comments are ignored; a blank line dispatches).
"""

from __future__ import annotations

import base64
import codecs
import http.client
import itertools
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.deadlines import scaled
from tests.support.server_process import ServerProcess

Headers = http.client.HTTPMessage
_counter = itertools.count()

# Every response from the server carries these (protocol section 12.7 + CORS).
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Cross-Origin-Resource-Policy": "cross-origin",
    "Access-Control-Allow-Origin": "*",
}


def unique(prefix: str = "s") -> str:
    """A stream name no other test uses."""
    return f"{prefix}-{time.monotonic_ns()}-{next(_counter)}"


def _split(url: str) -> tuple[str, int, str]:
    parts = urllib.parse.urlsplit(url)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return parts.hostname or "127.0.0.1", parts.port or 80, target


def request(
    method: str,
    url: str,
    headers: dict[str, str] | None = None,
    body: bytes | str | Iterable[bytes] | None = None,
    *,
    timeout: float = 15.0,
    chunked: bool = False,
) -> tuple[int, Headers, bytes]:
    """One HTTP/1.1 request on a fresh connection: ``(status, headers, body)``; ``timeout`` (how long
    a client waits for the answer, on an idle machine) is stretched by the load (``deadlines.py``)."""
    host, port, target = _split(url)
    if isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection(host, port, timeout=scaled(timeout))
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        hdrs = dict(headers or {})
        if chunked:
            hdrs["Transfer-Encoding"] = "chunked"
        elif isinstance(body, bytes) and (body or method in ("PUT", "POST")):
            hdrs.setdefault("Content-Length", str(len(body)))
        for name, value in hdrs.items():
            conn.putheader(name, value)
        conn.endheaders()
        if chunked:
            assert body is not None and not isinstance(body, bytes | str)
            for piece in body:
                conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            conn.send(b"0\r\n\r\n")
        elif isinstance(body, bytes) and body:
            conn.send(body)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, resp.headers, data
    finally:
        conn.close()


# ------------------------------------------------------------------ shortcuts


def stream_url(base: str, name: str, bucket: str | None = None) -> str:
    if bucket is None:
        return f"{base}/v1/stream/{name}"
    return f"{base}/v1/buckets/{bucket}/stream/{name}"


def new_stream(
    srv: ServerProcess,
    content_type: str = "application/octet-stream",
    body: bytes | str = b"",
    *,
    prefix: str = "s",
    bucket: str | None = None,
) -> str:
    """Create a stream with a name no other test uses; its URL."""
    url = stream_url(srv.url, unique(prefix), bucket)
    status, _, resp = create(url, content_type, body)
    assert status == 201, resp
    return url


def create(
    url: str,
    content_type: str | None = "application/octet-stream",
    body: bytes | str | None = None,
    **extra: str,
) -> tuple[int, Headers, bytes]:
    headers = {k.replace("_", "-"): v for k, v in extra.items()}
    if content_type is not None:
        headers["Content-Type"] = content_type
    return request("PUT", url, headers, body if body is not None else b"")


def append(
    url: str, body: bytes | str, content_type: str = "application/octet-stream", **extra: str
) -> tuple[int, Headers, bytes]:
    headers = {"Content-Type": content_type, **{k.replace("_", "-"): v for k, v in extra.items()}}
    return request("POST", url, headers, body)


def close(url: str, **extra: str) -> tuple[int, Headers, bytes]:
    return request(
        "POST", url, {"Stream-Closed": "true", **{k.replace("_", "-"): v for k, v in extra.items()}}, b""
    )


def read(
    url: str, offset: str | None = None, headers: dict[str, str] | None = None, **params: str
) -> tuple[int, Headers, bytes]:
    query = dict(params)
    if offset is not None:
        query["offset"] = offset
    target = url + ("?" + urllib.parse.urlencode(query) if query else "")
    return request("GET", target, headers)


def head(url: str) -> tuple[int, Headers, bytes]:
    return request("HEAD", url)


def tail(url: str) -> str:
    """The stream's current tail offset (via HEAD)."""
    status, headers, _ = head(url)
    assert status == 200, status
    return headers["Stream-Next-Offset"]


def read_all(
    url: str, offset: str = "-1", max_requests: int = 10_000
) -> tuple[bytes, list[tuple[int, Headers, bytes]]]:
    """Follow ``Stream-Next-Offset`` until ``Stream-Up-To-Date``; returns (bytes, responses)."""
    out = bytearray()
    responses = []
    for _ in range(max_requests):
        status, headers, body = read(url, offset)
        assert status == 200, (status, body)
        responses.append((status, headers, body))
        out += body
        offset = headers["Stream-Next-Offset"]
        if headers.get("Stream-Up-To-Date") == "true":
            return bytes(out), responses
    raise AssertionError("stream never reported Stream-Up-To-Date")


def error_message(body: bytes) -> str:
    """The message of an error body (every error: ``{"error": {"code", "message", ...}}``)."""
    return json.loads(body)["error"]["message"]


def error_code(body: bytes) -> str:
    return json.loads(body)["error"]["code"]


def assert_security_headers(headers: Headers) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, (name, headers.get(name))


# ------------------------------------------------------------------------ SSE


@dataclass
class SseEvent:
    event: str
    data: str
    id: str | None = None

    def json(self) -> Any:
        return json.loads(self.data)

    def b64(self) -> bytes:
        text = self.data.replace("\n", "").replace("\r", "")
        assert len(text) % 4 == 0, text
        return base64.b64decode(text, validate=True)


@dataclass
class _Parser:
    """The WHATWG event-stream parsing algorithm, fed incrementally."""

    events: list[SseEvent] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    _buf: str = ""
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _has_data: bool = False
    _id: str | None = None

    def feed(self, text: str, eof: bool = False) -> None:
        self._buf += text
        while True:
            idx = [i for i in (self._buf.find("\r"), self._buf.find("\n")) if i >= 0]
            if not idx:
                break
            i = min(idx)
            if self._buf[i] == "\r":
                if i + 1 == len(self._buf) and not eof:
                    break  # a CR at the end may be the first half of CRLF
                step = 2 if self._buf[i + 1 : i + 2] == "\n" else 1
            else:
                step = 1
            line, self._buf = self._buf[:i], self._buf[i + step :]
            self._line(line)

    def _line(self, line: str) -> None:
        if line == "":
            if self._has_data:
                self.events.append(SseEvent(self._event or "message", "\n".join(self._data), self._id))
            self._event, self._data, self._has_data = "", [], False
            return
        if line.startswith(":"):
            self.comments.append(line[1:])
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "id":
            self._id = value


class SseReader:
    """An open ``live=sse`` request; read events until a condition holds or EOF."""

    def __init__(
        self,
        url: str,
        offset: str,
        timeout: float = 10.0,
        headers: dict[str, str] | None = None,
        raw_query: str | None = None,
        **params: str,
    ) -> None:
        """``raw_query``: the query sent as it is (another spelling), instead of offset, live and params."""
        query = raw_query or urllib.parse.urlencode({"offset": offset, "live": "sse", **params})
        host, port, target = _split(f"{url}?{query}")
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self.conn.request("GET", target, headers=headers or {})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = self.resp.headers
        self.raw = bytearray()
        self.parser = _Parser()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.eof = False
        self.timeout = timeout

    @property
    def events(self) -> list[SseEvent]:
        return self.parser.events

    def controls(self) -> list[dict[str, Any]]:
        return [e.json() for e in self.events if e.event == "control"]

    def read_until(
        self, done: Callable[[list[SseEvent]], bool], timeout: float | None = None
    ) -> list[SseEvent]:
        deadline = time.monotonic() + scaled(timeout or self.timeout)
        while not done(self.events):
            if self.eof:
                raise AssertionError(f"SSE stream ended early; events={self.events!r}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting on SSE; events={self.events!r}")
            self._read_some()
        return self.events

    def read_to_eof(self, timeout: float | None = None) -> list[SseEvent]:
        deadline = time.monotonic() + scaled(timeout or self.timeout)
        while not self.eof:
            if time.monotonic() > deadline:
                raise AssertionError(f"SSE stream did not end; events={self.events!r}")
            self._read_some()
        return self.events

    def _read_some(self) -> None:
        chunk = self.resp.read1(65536)
        if not chunk:
            self.eof = True
            self.parser.feed(self._decoder.decode(b"", final=True), eof=True)
            return
        self.raw += chunk
        self.parser.feed(self._decoder.decode(chunk))

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> SseReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -------------------------------------------------------------- concurrency


class Background:
    """Run ``fn`` on a thread; ``result()`` joins and returns (or re-raises)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._result: Any = None
        self._error: BaseException | None = None
        self.started = time.monotonic()
        self.finished: float | None = None

        def run() -> None:
            try:
                self._result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                self._error = exc
            finally:
                self.finished = time.monotonic()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self, timeout: float = 15.0) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError("background request did not finish")
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def elapsed(self) -> float:
        assert self.finished is not None
        return self.finished - self.started


# ------------------------------------------------------------------ servers


def module_server(tmp_path_factory: Any, name: str, *args: str) -> Iterator[ServerProcess]:
    """Body of a module-scoped server fixture: one ``tiered serve`` shared by a module."""
    srv = ServerProcess(tmp_path_factory.mktemp(name) / "data", "--long-poll-timeout-s", "2", *args).start()
    try:
        yield srv
    finally:
        srv.stop()


def state_of(url: str) -> dict[str, Any]:
    """Everything a client can observe about a stream without changing it."""
    status, headers, body = head(url)
    if status != 200:
        return {"status": status}
    status2, headers2, content = read(url, "-1")
    assert status2 == 200
    return {
        "status": status,
        "content_type": headers.get("Content-Type"),
        "tail": headers.get("Stream-Next-Offset"),
        "closed": headers.get("Stream-Closed"),
        "ttl": headers.get("Stream-TTL"),
        "expires_at": headers.get("Stream-Expires-At"),
        "etag": headers2.get("ETag"),
        "content": content,
    }
