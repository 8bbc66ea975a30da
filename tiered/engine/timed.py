"""Timing two shells from the outside: object-store requests (every backend alike) and flush passes.

``TimedStore`` wraps whatever ``open_object_store`` returned, so the local
directory and S3 are measured the same way and no backend carries metrics
code. ``TimedFlusher`` is the flusher with its passes timed; it lives here so
that the cold tier stays free of metrics.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import ExitStack
from typing import Any

from tiered.cold.objects.store import DeleteFailure, ObjectInfo, ObjectStore, StoredObject
from tiered.core.ports import NOT_RECORDED, LatencyRecorder
from tiered.engine.jobs.flusher import ColdFlusher


class TimedStore:
    """An ``ObjectStore`` that times each call by operation (``tiered_store_request_seconds``).

    Operations it has no timer for are passed through to the store untimed
    (``__getattr__``), so a backend's extra methods keep working.
    """

    def __init__(self, inner: ObjectStore, timers: Mapping[str, LatencyRecorder]) -> None:
        self.inner = inner
        self._put = timers.get("put", NOT_RECORDED)
        self._get = timers.get("get", NOT_RECORDED)
        self._head = timers.get("head", NOT_RECORDED)
        self._delete = timers.get("delete", NOT_RECORDED)
        self._delete_many = timers.get("delete_many", NOT_RECORDED)
        self._list = timers.get("list", NOT_RECORDED)

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = True, if_match: str | None = None
    ) -> ObjectInfo:
        with self._put.time():
            return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        with self._get.time():
            return await self.inner.get(key, start=start, end=end)

    async def get_with_info(self, key: str) -> StoredObject:
        with self._get.time():
            return await self.inner.get_with_info(key)

    async def head(self, key: str) -> ObjectInfo | None:
        with self._head.time():
            return await self.inner.head(key)

    async def delete(self, key: str) -> None:
        with self._delete.time():
            await self.inner.delete(key)

    async def delete_many(self, keys: Iterable[str]) -> list[DeleteFailure]:
        with self._delete_many.time():
            return await self.inner.delete_many(keys)

    async def close(self) -> None:
        await self.inner.close()

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        return self._timed_list(prefix)

    async def _timed_list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        with self._list.time():  # the whole listing, every page
            async for info in self.inner.list(prefix):
                yield info

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TimedFlusher(ColdFlusher):
    """The cold flusher, with each pass that uploaded something or failed timed (``tiered_cold_flush_seconds``).

    Idle passes (nothing to flush, about one a second) are not observed: they
    would bury the passes that matter.
    """

    def __init__(self, *args: Any, pass_seconds: LatencyRecorder = NOT_RECORDED, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pass_seconds = pass_seconds

    async def flush_once(self) -> int:
        with ExitStack() as observed:
            observed.enter_context(self.pass_seconds.time())
            committed = await super().flush_once()  # a pass that raises is observed
            if not committed:
                observed.pop_all()  # an idle pass is not
        return committed
