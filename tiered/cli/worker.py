"""One worker process of a multi-worker node (``tiered serve --workers N``; started by ``workers.py``).

The supervisor starts ``python -m tiered.cli.worker`` with its spec in the
environment (``TIERED_WORKER_SPEC``: the node's settings, this worker's index,
the worker count, the node's port, the directory of the workers' sockets).
The worker is a node of the node's own single-machine cluster
(``tiered/cluster/workers/layout.py``): it opens the cluster on the node's
local store, listens on its Unix socket, joins, waits (bounded) until the
shards are settled among the workers, and only then listens on the node's
port beside its siblings (``SO_REUSEPORT``: the kernel spreads connections).
On SIGTERM/SIGINT it stops accepting, hands its shards off (flushed) and
exits 0. If the supervisor dies the kernel kills the worker
(``PR_SET_PDEATHSIG``): no worker outlives its node.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from tiered.api.kit.rsgi_server import RsgiListener
from tiered.cli.heap import tune_collector
from tiered.cluster.gateway.forward import unix_url
from tiered.cluster.gateway.forward_channel import frames_socket
from tiered.cluster.gateway.forward_frames import max_answer_bytes
from tiered.cluster.gateway.forward_serve import FrameServer
from tiered.cluster.server import ClusterServer, open_cluster
from tiered.cluster.workers.handler import build_forwarded_handler, build_worker_handler
from tiered.cluster.workers.layout import worker_config, worker_id
from tiered.cluster.workers.settle import settled
from tiered.core.config import Config
from tiered.core.hosts import url_host
from tiered.core.logs import configure_logging

__all__ = ["SPEC_ENV", "WorkerSpec", "main"]

log = logging.getLogger(__name__)

SPEC_ENV = "TIERED_WORKER_SPEC"
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    config: Config  # the node's settings (workers resolved, data dir absolute)
    index: int
    count: int
    port: int  # the node's port, chosen by the supervisor
    sockets: Path  # where the workers' Unix sockets are

    def encode(self) -> str:
        return json.dumps(
            {
                "config": dataclasses.asdict(self.config),
                "index": self.index,
                "count": self.count,
                "port": self.port,
                "sockets": str(self.sockets),
            }
        )

    @classmethod
    def decode(cls, text: str) -> WorkerSpec:
        raw: dict[str, Any] = json.loads(text)
        return cls(Config(**raw["config"]), raw["index"], raw["count"], raw["port"], Path(raw["sockets"]))

    def socket(self, index: int) -> Path:
        return self.sockets / f"{worker_id(index)}.sock"

    def ready_file(self, index: int) -> Path:
        """Present while worker ``index`` serves the node's port (removed when it starts again)."""
        return self.sockets / f"{worker_id(index)}.ready"


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this process when the supervisor dies (a killed node leaves no worker)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


async def run_worker(spec: WorkerSpec) -> None:
    config = worker_config(spec.config, spec.index)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tune_collector()
    cluster: ClusterServer | None = None
    listeners: list[RsgiListener] = []
    frames: FrameServer | None = None
    spec.ready_file(spec.index).unlink(missing_ok=True)
    try:
        cluster = await open_cluster(config, shared_disk=True)
        handler = build_worker_handler(cluster)
        internal = RsgiListener(
            handler, max_body_bytes=config.max_body_bytes, max_connections=config.max_waiters + 1024
        )
        listeners.append(internal)
        await internal.start_unix(spec.socket(spec.index))
        # Siblings forward requests here in frames (``tiered/cluster/gateway/forward_frames.py``); the HTTP
        # socket above serves the rest (metrics scrapes, bodies too large to hold whole).
        frames = FrameServer(
            build_forwarded_handler(cluster),
            max_body_bytes=config.max_body_bytes,
            max_answer_bytes=max_answer_bytes(config),
        )
        await frames.start(Path(frames_socket(str(spec.socket(spec.index)))))
        await cluster.join(unix_url(str(spec.socket(spec.index))))
        await _settle(cluster, [worker_id(i) for i in range(spec.count)], stop)
        if not stop.is_set():
            public = _public_listener(config, handler)
            listeners.append(public)
            bound = await public.start(config.host, spec.port)
            spec.ready_file(spec.index).touch()  # what the supervisor waits for (``workers.py``)
            for host, port in bound:
                log.info(
                    "worker %s listening on %s://%s:%s (pid %d)",
                    config.cluster_node_id,
                    public.scheme,
                    url_host(host),
                    port,
                    os.getpid(),
                )
        await stop.wait()
        log.info("worker %s shutting down: handing shards off", config.cluster_node_id)
    finally:
        for listener in reversed(listeners[1:]):  # the port first: new clients go to siblings still up
            await listener.stop()
        if cluster is not None:
            await cluster.stop()
        if frames is not None:
            await frames.stop()
        if listeners:
            await listeners[0].stop()


async def _settle(cluster: ClusterServer, expected: list[str], stop: asyncio.Event) -> None:
    c = cluster.config
    deadline = cluster.clock.monotonic() + 3 * (c.cluster_lease_ttl_s + c.lease_margin_s)
    while not stop.is_set():
        if settled(cluster, expected):
            break
        if cluster.clock.monotonic() > deadline:
            log.warning("worker %s: shards not settled among %s; serving anyway", cluster.node_id, expected)
            break
        await asyncio.sleep(0.05)
    cluster.started = True


def _public_listener(config: Config, handler: Any) -> RsgiListener:
    return RsgiListener(
        handler,
        max_body_bytes=config.max_body_bytes,
        max_connections=config.max_waiters + 1024,
        tls_cert=Path(config.tls_cert) if config.tls_cert else None,
        tls_key=Path(config.tls_key) if config.tls_key else None,
        reuse_port=True,
    )


def main() -> int:
    _die_with_parent()
    spec = WorkerSpec.decode(os.environ[SPEC_ENV])
    c = spec.config
    configure_logging(c.log_level, c.log_format, access_log=c.access_log)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(run_worker(spec))
    except Exception:
        log.exception("worker %d failed", spec.index)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
