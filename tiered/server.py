"""Running the service: data-dir lock, startup, the HTTP listener, shutdown."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
from pathlib import Path

from aiohttp import web

from .config import Config
from .http_api import build_app
from .service import StreamService

log = logging.getLogger(__name__)


class DataDirLocked(Exception):
    pass


class DataDirLock:
    """An exclusive lock on the data dir: one process owns it at a time."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "LOCK"
        self._fd: int | None = None

    def acquire(self, *, shared: bool = False) -> None:
        """Take the lock; ``shared`` (read-only commands) writes nothing and only keeps writers out."""
        if shared:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return  # no server ever ran here (it creates the file): nothing to exclude
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirLocked(f"{self.path.parent} is in use by another tiered process") from None
        if not shared:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


async def serve(config: Config, ready: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM; then flush, snapshot and exit cleanly."""
    lock = DataDirLock(config.data_path)
    lock.acquire()
    service = StreamService(config)
    try:
        await service.start()
        app = build_app(service)
        # handler_cancellation: a reader that disconnects ends its handler at once, so a
        # long-poll or SSE waiter slot is freed when the connection closes, not at its timeout.
        runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, config.host, config.port, backlog=1024, reuse_address=True)
        await site.start()
        # aiohttp internal: _server is typed AbstractServer, which does not declare .sockets
        for sock in site._server.sockets if site._server else []:  # type: ignore[attr-defined]
            host, port = sock.getsockname()[:2]
            print(f"tiered listening on http://{host}:{port} (data dir {config.data_path.resolve()})", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("shutting down")
        service.begin_shutdown()
        await runner.cleanup()
    finally:
        await service.stop()
        lock.release()
