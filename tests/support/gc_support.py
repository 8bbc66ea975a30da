"""Shared helpers for the ``test_gc_*`` suites (this module holds no tests).

* ``VirtualClock`` (``tiered.core.clock``) is handed to the node: requests, erasure,
  retention, the flusher and GC all read it. Tests advance it; nothing is
  monkeypatched.
* ``ControlledStore`` wraps a real object store and lets a test make ``delete_many``,
  ``list``, ``put`` or ``get`` fail (``ObjectStoreUnavailable``), hang for a while and then
  fail (a timeout), or record every call.
* ``Harness`` runs a real ``Engine`` on a data dir with no background job (passes run
  when a test asks), with crash and clean restarts; ``HttpHarness`` also serves its
  HTTP handler on 127.0.0.1 with the production adapter.

"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

from tiered.cold.objects.store import DeleteFailure, ObjectInfo, ObjectStoreUnavailable, StoredObject
from tiered.core.clock import VirtualClock
from tiered.core.config import Config
from tiered.engine.codec import Record, decode_record
from tiered.engine.engine import Engine
from tiered.engine.streams.model import AppendRequest, ColdSlice, CreateRequest, ForkRequest, Stream
from tiered.hot.log import SegmentLog

__all__ = ["VirtualClock"]

OCTET = "application/octet-stream"
JSON = "application/json"
T0 = 1_800_000_000_000  # virtual "now" at the start of every test (ms)


# --------------------------------------------------------------------------- config and files


def make_config(data_dir: Path, **overrides: Any) -> Config:
    values: dict[str, Any] = {
        "data_dir": str(data_dir),
        "segment_bytes": 1 << 20,
        "max_body_bytes": 256 * 1024,
        "flush_interval_s": 3600.0,  # passes run only when a test asks
        "hot_retention_s": 0.0,
        "gc_interval_s": 3600.0,
        "gc_grace_s": 10.0,
        "reconcile_interval_s": 3600.0,
    }
    values.update(overrides)
    config = Config(**values)
    config.validate()
    return config


def object_files(data_dir: Path) -> set[str]:
    """Keys of the objects under the local store's data prefix."""
    root = data_dir / "cold" / "data"
    return {f"data/{p.name}" for p in root.glob("*.parquet")} if root.exists() else set()


def journal_records(data_dir: Path) -> list[Record]:
    """Every record still in the hot log of a stopped service, in order."""
    log = SegmentLog(data_dir / "hot")
    try:
        return [decode_record(body) for _, body in log.open(read_only=True)]
    finally:
        log.close()


def segment_ids(data_dir: Path) -> list[int]:
    return sorted(int(p.stem) for p in (data_dir / "hot").glob("*.seg"))


# --------------------------------------------------------------------------- a controllable store


class InjectedOutage(ObjectStoreUnavailable):
    pass


class ControlledStore:
    """Wraps a real store. Each ``fail_*`` is 'ok', 'error' (ObjectStoreUnavailable at once) or
    'hang' (block ``hang_s``, then ObjectStoreUnavailable, as a store whose timeout fired)."""

    def __init__(self, inner: Any, hang_s: float = 0.5) -> None:
        self.inner = inner
        self.hang_s = hang_s
        self.fail_delete = "ok"
        self.fail_list = "ok"
        self.fail_put = "ok"
        self.fail_get = "ok"
        self.calls: list[tuple[str, Any]] = []
        self.hanging = 0  # calls blocked right now

    async def _fault(self, mode: str, what: str) -> None:
        if mode == "ok":
            return
        if mode == "hang":
            self.hanging += 1
            try:
                await asyncio.sleep(self.hang_s)
            finally:
                self.hanging -= 1
            raise InjectedOutage(f"{what}: timed out after {self.hang_s}s (injected)")
        raise InjectedOutage(f"{what}: injected outage")

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = True, if_match: str | None = None
    ) -> ObjectInfo:
        self.calls.append(("put", key))
        await self._fault(self.fail_put, f"put {key}")
        return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        self.calls.append(("get", key))
        await self._fault(self.fail_get, f"get {key}")
        return await self.inner.get(key, start=start, end=end)

    async def get_with_info(self, key: str) -> StoredObject:
        self.calls.append(("get", key))
        await self._fault(self.fail_get, f"get {key}")
        return await self.inner.get_with_info(key)

    async def head(self, key: str) -> ObjectInfo | None:
        return await self.inner.head(key)

    async def delete(self, key: str) -> None:
        self.calls.append(("delete", key))
        await self._fault(self.fail_delete, f"delete {key}")
        await self.inner.delete(key)

    async def delete_many(self, keys: Iterable[str]) -> list[DeleteFailure]:
        keys = list(keys)
        self.calls.append(("delete_many", tuple(keys)))
        await self._fault(self.fail_delete, f"delete {len(keys)} objects")
        return await self.inner.delete_many(keys)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        self.calls.append(("list", prefix))
        await self._fault(self.fail_list, f"list {prefix!r}")
        async for info in self.inner.list(prefix):
            yield info

    async def close(self) -> None:
        await self.inner.close()

    def deletes(self) -> list[tuple[str, ...]]:
        return [c[1] for c in self.calls if c[0] == "delete_many"]


def install_store(node: Engine, store: Any) -> None:
    """Route every object-store use of a started node through ``store``."""
    node.store = store
    node.flusher.store = store
    node.cold_reader.store = store
    node.gc.ctx.store = store
    node.snapshots.store = store  # stream snapshots' objects
    if node.claim is not None:
        node.claim.store = store


# --------------------------------------------------------------------------- the service


class Harness:
    """A real Engine on ``config``'s data dir, restartable; nothing runs in the background."""

    def __init__(
        self, config: Config, wrap: Callable[[Any], Any] | None = None, *, clock: VirtualClock | None = None
    ) -> None:
        self.config = config
        self.wrap = wrap
        self.clock = clock or VirtualClock(T0)
        self.node: Engine | None = None

    @property
    def s(self) -> Engine:
        assert self.node is not None
        return self.node

    async def start(self, *, abort_interrupted: bool = True) -> Engine:
        node = Engine(self.config, self.clock)
        await node.start(jobs=False)
        if self.wrap is not None:
            install_store(node, self.wrap(node.store))
        if abort_interrupted:
            await node.flusher.abort_interrupted_copies()  # what the flusher's run() does first
        self.node = node
        return node

    async def stop(self) -> None:
        if self.node is not None:
            await self.node.stop()
            self.node = None

    async def crash(self) -> None:
        """Stop like SIGKILL after the last fsync: no shutdown snapshot, no background task survives."""
        node = self.node
        if node is None:
            return
        self.node = None
        await node.supervisor.stop()
        await node.deliveries.close()
        await node.journal.close(None)
        if node.store is not None:
            await node.store.close()

    async def restart(self, *, crash: bool = False) -> Engine:
        await (self.crash() if crash else self.stop())
        return await self.start()

    # ---- stream helpers

    async def bucket(self, name: str) -> None:
        await self.s.streams.create_bucket(name)

    async def create(
        self,
        bucket: str,
        path: str,
        data: bytes = b"",
        *,
        content_type: str = OCTET,
        ttl_s: int | None = None,
        fork_from: tuple[str, str] | None = None,
        fork_offset: int | None = None,
    ) -> Stream:
        fork = None
        if fork_from is not None:
            src = self.s.streams.lookup(*fork_from)
            offset = src.tail if fork_offset is None else fork_offset
            fork = ForkRequest(
                source_uid=src.uid, offset=offset, spec=f"{fork_from[0]}/{fork_from[1]}@{offset}"
            )
            content_type = src.content_type
        created, s = await self.s.streams.create(
            bucket, path, CreateRequest(content_type, ttl_s, None, None, False, data, fork)
        )
        assert created
        return s

    async def append(self, bucket: str, path: str, data: bytes, content_type: str | None = None) -> int:
        s = self.s.streams.lookup(bucket, path)
        result = await self.s.streams.append(
            bucket, path, AppendRequest(content_type or s.content_type, data, False)
        )
        return result.tail

    async def read(self, bucket: str, path: str, start: int | None = None) -> bytes:
        """Bytes from ``start`` (default: the retained offset) to the tail."""
        streams = self.s.streams
        s = streams.lookup(bucket, path)
        lo = s.retained_from if start is None else start
        return await streams.read(s, lo, streams.view(s).tail)

    def slice_kinds(self, bucket: str, path: str) -> list[str]:
        s = self.s.streams.lookup(bucket, path)
        return [type(sl).__name__ for sl in self.s.state.plan_read(s, s.retained_from, s.tail)]

    def cold_keys_of(self, bucket: str, path: str) -> set[str]:
        s = self.s.streams.lookup(bucket, path)
        return {sl.key for sl in self.s.state.plan_read(s, 0, s.tail) if isinstance(sl, ColdSlice)}

    async def flush(self) -> int:
        n = await self.s.flusher.flush_once()
        await self.s.flusher.release_hot_copies()
        return n

    async def gc(self, now_ms: int, **kwargs: Any) -> Any:
        return await self.s.gc.run_pass(now_ms=now_ms, **kwargs)


# --------------------------------------------------------------------------- in-process HTTP


class HttpHarness(Harness):
    """A Harness whose node also answers HTTP on 127.0.0.1 (the production adapter and handler)."""

    def __init__(
        self, config: Config, wrap: Callable[[Any], Any] | None = None, *, clock: VirtualClock | None = None
    ) -> None:
        super().__init__(config, wrap, clock=clock)
        self.listener: Any = None
        self.session: Any = None
        self.port = 0

    async def start(self, *, abort_interrupted: bool = True) -> Engine:
        import aiohttp

        from tiered.api.app import build_handler
        from tiered.api.kit.aiohttp_server import AiohttpListener

        node = await super().start(abort_interrupted=abort_interrupted)
        self.listener = AiohttpListener(build_handler(node), max_body_bytes=self.config.max_body_bytes)
        [(_, self.port)] = await self.listener.start("127.0.0.1", 0)
        self.session = aiohttp.ClientSession(auto_decompress=False)
        return node

    async def _close_http(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.listener is not None:
            await self.listener.stop()
            self.listener = None

    async def stop(self) -> None:
        await self._close_http()
        await super().stop()

    async def crash(self) -> None:
        await self._close_http()
        await super().crash()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def http(
        self,
        method: str,
        path: str,
        *,
        body: bytes | str | None = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, bytes]:
        """One request: (status, headers, body)."""
        import json as _json

        data: bytes | None
        if json_body is not None:
            data = _json.dumps(json_body).encode()
        else:
            data = body.encode() if isinstance(body, str) else body
        async with self.session.request(method, self.url + path, data=data, headers=headers or {}) as resp:
            return resp.status, resp.headers, await resp.read()
