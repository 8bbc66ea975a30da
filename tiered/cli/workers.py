"""``tiered serve --workers N``: the supervisor of a node served by N worker processes.

It holds the data dir's lock (so no other node, and no earlier supervisor's
worker, writes the data dir), checks the layout (``tiered/cluster/workers/layout.py``),
picks the port (port 0: a free one, shared by every worker), declares the
workers of a killed predecessor dead so the new ones need not wait out their
lease TTL, then starts the workers (``worker.py``) and keeps them running:

* a worker that exits while the node runs (a crash, a SIGKILL) is declared
  dead at once (``tiered/cluster/workers/membership.py``): its siblings take its
  shards over at their next pass (its acknowledged writes are on the shared
  disk, fsynced); it is started again (after a backoff that grows while it
  keeps failing within 30 s of starting) and takes its share back;
* on SIGTERM/SIGINT every worker is asked to stop (each hands its shards off,
  flushed), the supervisor waits for them (SIGKILL after 60 s) and exits 0
  if they all did;
* when all workers answer ``/healthz`` it logs ``tiered listening on ...``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from tiered.api.kit.rsgi_server import _bindable_port
from tiered.cli.worker import SPEC_ENV, WorkerSpec
from tiered.cluster.membership.cas import ObjectStoreCas
from tiered.cluster.workers.layout import MARKER, layout_problem, worker_id
from tiered.cluster.workers.membership import declare_every_alive, declare_gone
from tiered.core.config import Config
from tiered.core.hosts import listen_addresses, url_host
from tiered.engine.datadir import DataDirLock
from tiered.engine.engine import open_store

__all__ = ["serve_workers"]

log = logging.getLogger(__name__)

_STOP_WAIT_S = 60.0
_HEALTHY_AFTER_S = 30.0  # a worker that ran this long before failing restarts at the shortest backoff


async def serve_workers(config: Config) -> int:
    """Run the node's workers until SIGINT/SIGTERM; 0 if every worker stopped cleanly."""
    data = config.data_path.resolve()
    config = dataclasses.replace(config, data_dir=str(data), workers=config.worker_count())
    data.mkdir(parents=True, exist_ok=True)
    lock = DataDirLock(data)
    lock.acquire()
    sockets: Path | None = None
    try:
        problem = layout_problem(data, workers=True)  # checked before the lock too (serve.run): now held
        if problem is not None:
            raise OSError(problem)
        marker = data / MARKER
        if not marker.exists():
            marker.write_text(f"workers layout; shards: {config.worker_shards}\n")
        port = config.port
        for address in listen_addresses(config.host):  # busy: a clear error now, not in every worker
            port = _bindable_port(address, port)
        store = await open_store(config, read_only=False, probe=False)
        try:
            cas = ObjectStoreCas(store)
            gone = await declare_every_alive(cas)
            if gone:
                log.info("workers of an earlier run declared dead: %s", ", ".join(gone))
            sockets = Path(tempfile.mkdtemp(prefix="tiered-workers-"))
            return await _Supervisor(config, port, sockets, cas).run()
        finally:
            await store.close()
    finally:
        if sockets is not None:
            shutil.rmtree(sockets, ignore_errors=True)
        lock.release()


class _Supervisor:
    def __init__(self, config: Config, port: int, sockets: Path, cas: ObjectStoreCas) -> None:
        self.config = config
        self.port = port
        self.sockets = sockets
        self.cas = cas
        self.count = config.workers
        self.stop = asyncio.Event()
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.restarts = 0

    def spec(self, index: int) -> WorkerSpec:
        return WorkerSpec(self.config, index, self.count, self.port, self.sockets)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        keepers = [asyncio.create_task(self._keep(i), name=f"worker-{i}") for i in range(self.count)]
        announce = asyncio.create_task(self._announce())
        await self.stop.wait()
        log.info("shutting down: stopping %d workers", self.count)
        announce.cancel()
        for proc in list(self.procs.values()):
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        codes = await asyncio.gather(*keepers)
        failed = [worker_id(i) for i, rc in enumerate(codes) if rc != 0]
        if failed:
            log.error("workers %s did not stop cleanly", ", ".join(failed))
            return 1
        log.info("all workers stopped")
        return 0

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        env = {**os.environ, SPEC_ENV: self.spec(index).encode()}
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tiered.cli.worker", env=env)
        self.procs[index] = proc
        log.info("worker %s started (pid %d)", worker_id(index), proc.pid)
        return proc

    async def _keep(self, index: int) -> int:
        """Run worker ``index`` until the node stops, restarting it whenever it ends; its last exit code."""
        loop = asyncio.get_running_loop()
        backoff = 0.5
        while True:
            proc = await self._spawn(index)
            started = loop.time()
            rc = await self._wait(proc)
            if self.stop.is_set():
                return rc
            log.warning("worker %s (pid %d) exited with %s; restarting it", worker_id(index), proc.pid, rc)
            self.restarts += 1
            await declare_gone(self.cas, worker_id(index))
            if loop.time() - started > _HEALTHY_AFTER_S:
                backoff = 0.5
            try:
                await asyncio.wait_for(self.stop.wait(), backoff)
                return 0  # stopped while waiting to restart: nothing runs
            except TimeoutError:
                pass
            backoff = min(backoff * 2, 10.0)

    async def _wait(self, proc: asyncio.subprocess.Process) -> int:
        waiting = asyncio.ensure_future(proc.wait())
        stopping = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if waiting.done():
            return waiting.result()
        try:
            return await asyncio.wait_for(waiting, _STOP_WAIT_S)
        except TimeoutError:
            log.error("worker pid %d did not stop within %.0f s; killing it", proc.pid, _STOP_WAIT_S)
            proc.kill()
            await proc.wait()
            return -signal.SIGKILL

    async def _announce(self) -> None:
        """Log the node's address once every worker listens on it (its shards settled)."""
        pending = set(range(self.count))
        while pending:
            pending = {i for i in pending if not self.spec(i).ready_file(i).exists()}
            if pending:
                await asyncio.sleep(0.05)
        scheme = "https" if self.config.tls_cert else "http"
        for address in listen_addresses(self.config.host):
            log.info(
                "tiered listening on %s://%s:%s (%s; %d workers; data dir %s)",
                scheme,
                url_host(address),
                self.port,
                self.config.http_server,
                self.count,
                self.config.data_path,
            )
        for warning in self.config.exposure_warnings(self.config.admin_token() is not None):
            log.warning("%s", warning)
