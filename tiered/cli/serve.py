"""``tiered serve``: the data-dir lock, the node, the HTTP listener, shutdown on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from tiered.config import Config
from tiered.datadir import DataDirLock, DataDirLocked
from tiered.http.aiohttp_server import AiohttpListener
from tiered.http.app import build_handler
from tiered.node import Node

log = logging.getLogger(__name__)


async def serve(config: Config, ready: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM; then release live readers, drain, snapshot and exit cleanly."""
    lock = DataDirLock(config.data_path)
    lock.acquire()
    node = Node(config)
    try:
        await node.start()
        listener = AiohttpListener(build_handler(node), max_body_bytes=config.max_body_bytes)
        for host, port in await listener.start(config.host, config.port):
            print(
                f"tiered listening on http://{host}:{port} (data dir {config.data_path.resolve()})",
                flush=True,
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("shutting down")
        node.streams.begin_shutdown()
        await listener.stop()
    finally:
        await node.stop()
        lock.release()


def run(config: Config) -> int:
    from tiered.cold.claim import PrefixClaimed
    from tiered.hot.segment import CorruptSegmentError
    from tiered.journal.snapshot import SnapshotError

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(config))
    except (DataDirLocked, CorruptSegmentError, SnapshotError, PrefixClaimed, OSError) as exc:
        print(f"tiered: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0
