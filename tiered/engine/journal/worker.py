"""The journal's one thread: batch writes and syncs, snapshot files and the close, in the order handed over.

What ``loop.run_in_executor`` on a one-thread ``ThreadPoolExecutor`` did, with less in between: a call is
one queue put (the thread wakes on it) and one ``call_soon_threadsafe`` back to the loop with its outcome,
instead of the executor's lock, work item, idle semaphore and a concurrent future chained to an asyncio
one. With fsync ``always`` every group commit crosses over once, so this is paid per batch of appends.

One thread, so calls run one at a time in the order made: a sync never overlaps the write before it, a
snapshot's sync follows every write queued before it. The thread starts on the first call (a read-only
journal never makes one) and is a daemon: a journal a crash or a test leaves open must not keep the
interpreter from exiting; a call cut short that way was never answered, so nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

T = TypeVar("T")

_Call = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]", asyncio.AbstractEventLoop]


class JournalWorker:
    """Runs blocking calls on the journal's thread; each call's outcome comes back as an asyncio future."""

    def __init__(self, name: str = "journal") -> None:
        self._name = name
        self._queue: SimpleQueue[_Call | None] = SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on the thread, after every call made before (call it on the event loop)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        self._queue.put((fn, args, future, loop))
        return future

    def shutdown(self) -> None:
        """Let the calls made so far finish, then end the thread (blocks until it has)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _serve(self) -> None:
        queue = self._queue
        while (call := queue.get()) is not None:
            fn, args, future, loop = call
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, as an executor would
                _send(loop, _fail, future, exc)
            else:
                _send(loop, _resolve, future, result)


def _send(loop: asyncio.AbstractEventLoop, cb: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(cb, *args)
    except RuntimeError:
        pass  # the loop is closed: nobody waits for the answer any more


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    if not future.cancelled():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.cancelled():
        future.set_exception(exc)
