#!/usr/bin/env python3
"""A do-nothing HTTP server on either of tiered's HTTP stacks: the ceiling for appends.

Every request's body is read and answered ``204`` with a ``Stream-Next-Offset``
header, through the same adapter tiered uses (``tiered.api.kit.rsgi_server`` or
``tiered.api.kit.aiohttp_server``) and uvloop, so ``bench/compare.py`` can put
tiered beside the fastest a server on that stack could possibly answer:
the gap is the cost of the protocol, the journal and fsync.

Two options turn it into a model of an append server whose own work costs a chosen amount, to find
what bounds a served append on this stack (``bench/cpu_per_append.py`` with one ``--build`` per model
runs the curve; docs/benchmarks.md, "what bounds a served append"):

* ``--journal DIR``: every body is group-committed to a new file in DIR (removed at exit) before the answer, the way
  tiered's journal does it (a commit task on the loop takes what is queued, one thread writes it and
  syncs it with ``fdatasync``, the batch's future wakes its requests): the cost of "durable before acknowledged"
  with none of tiered's own logic.
* ``--work-us N``: N µs of interpreter work per request on the loop (holding the GIL, as tiered's
  own Python does): a stand-in for parsing, deciding and applying an append.

    python bench/null_server.py --stack granian --port 4438
    python bench/null_server.py --journal /tmp/j --work-us 20 --port 4438
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiered.api.kit.types import Request, Response  # noqa: E402
from tiered.engine.journal.worker import JournalWorker  # noqa: E402

NEXT_OFFSET = {"Stream-Next-Offset": "0000000000000000_0000000000000000"}


async def nothing(request: Request) -> Response:
    await request.body()
    # 201 for the benchmark's stream creation (PUT), 204 for every append.
    return Response(201 if request.method == "PUT" else 204, NEXT_OFFSET)


class GroupCommit:
    """Bodies written and fdatasync'ed in batches on one thread; each request waits for its batch.

    The shape of tiered's journal (``tiered/engine/journal``) without its records: appends queue on the
    loop, and one commit task hands the queue to tiered's own journal thread (``JournalWorker``: one
    queue put, one ``call_soon_threadsafe`` back per batch) while earlier batches are on disk."""

    def __init__(self, directory: Path) -> None:
        self._fd, self._path = tempfile.mkstemp(prefix="null-journal-", dir=directory)
        self._pending: list[bytes] = []
        self._batch: asyncio.Future[None] | None = None
        self._wakeup = asyncio.Event()
        self._worker = JournalWorker()
        self._task = asyncio.get_running_loop().create_task(self._commit_loop())
        self.batches = 0

    def append(self, body: bytes) -> asyncio.Future[None]:
        if self._batch is None:
            self._batch = asyncio.get_running_loop().create_future()
        self._pending.append(body)
        self._wakeup.set()
        return self._batch

    async def _commit_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._pending:
                continue
            bodies, batch = self._pending, self._batch
            assert batch is not None
            self._pending, self._batch = [], None
            await self._worker.run(self._write, b"".join(bodies))
            self.batches += 1
            batch.set_result(None)

    def _write(self, data: bytes) -> None:
        os.write(self._fd, data)
        os.fdatasync(self._fd)

    def close(self) -> None:
        self._task.cancel()
        self._worker.shutdown()
        os.close(self._fd)
        os.unlink(self._path)


def _wake(waiter: asyncio.Future[None], _batch: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def append_handler(journal: GroupCommit | None, work_us: float) -> Callable[[Request], Awaitable[Response]]:
    """The modelled append: read the body, ``work_us`` of interpreter work, then wait for its batch."""
    work_s = work_us / 1e6
    clock = time.perf_counter

    async def append(request: Request) -> Response:
        body = await request.body()
        if work_s:
            deadline = clock() + work_s
            while clock() < deadline:
                pass
        if journal is not None:
            batch = journal.append(body)
            if not batch.done():
                # The request's own waiter, as tiered's committer does: a client that leaves cancels
                # its waiter, never the batch.
                waiter: asyncio.Future[None] = batch.get_loop().create_future()
                batch.add_done_callback(functools.partial(_wake, waiter))
                await waiter
        return Response(201 if request.method == "PUT" else 204, NEXT_OFFSET)

    return append


async def main(stack: str, host: str, port: int, journal_dir: Path | None, work_us: float) -> None:
    journal = GroupCommit(journal_dir) if journal_dir is not None else None
    handler = append_handler(journal, work_us) if journal is not None or work_us else nothing
    listener: object
    if stack == "granian":
        from tiered.api.kit.rsgi_server import RsgiListener

        listener = RsgiListener(handler, max_body_bytes=16 << 20)
    else:
        from tiered.api.kit.aiohttp_server import AiohttpListener

        listener = AiohttpListener(handler, max_body_bytes=16 << 20)
    await listener.start(host, port)  # type: ignore[attr-defined]
    print(f"null server ({stack}) on http://{host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await listener.stop()  # type: ignore[attr-defined]
    if journal is not None:
        journal.close()
        print(f"group commits: {journal.batches}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stack", choices=("granian", "aiohttp"), default="granian")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4438)
    p.add_argument(
        "--journal",
        "--data-dir",  # so bench/compare.py's --other-tiered can run the model as one more server
        dest="journal",
        type=Path,
        help="group-commit every body to a file here, fsync always",
    )
    p.add_argument("--work-us", type=float, default=0.0, help="interpreter work per request (µs)")
    a = p.parse_args()
    import uvloop

    uvloop.install()
    asyncio.run(main(a.stack, a.host, a.port, a.journal, a.work_us))
