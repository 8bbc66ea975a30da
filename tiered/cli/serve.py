"""``tiered serve``: the data-dir lock, the node, the HTTP listener, shutdown on SIGINT/SIGTERM.

Before anything is opened, ``run`` resolves ``--host`` (a name that does not
resolve is a one-line error, exit code 2) and refuses an open server off
loopback (``Config.exposure_problem``); once listening, ``serve`` logs what
the operator must know about exposure as warnings (``Config.exposure_warnings``:
an open data plane off loopback, admin routes refused for want of a token).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Protocol

from tiered.api.app import build_handler
from tiered.api.kit.types import Handler
from tiered.cli.heap import freeze_recovered_state, tune_collector
from tiered.core.config import Config, ConfigError
from tiered.core.hosts import UnresolvableHost, listen_addresses, url_host
from tiered.engine.datadir import DataDirLock, DataDirLocked
from tiered.engine.engine import Engine

log = logging.getLogger(__name__)


async def serve(config: Config, ready: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM; then release live readers, drain, snapshot and exit cleanly."""
    if config.cluster_node_id:
        await serve_cluster(config, ready)
        return
    lock = DataDirLock(config.data_path)
    lock.acquire()
    engine = Engine(config)
    # Handlers first: a SIGTERM that arrives while recovering or just after the listener opened
    # must still end in a clean shutdown, not the default action's abrupt exit.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tune_collector()
    try:
        await engine.start()
        freeze_recovered_state()
        listener = make_listener(config, build_handler(engine))
        scheme = "https" if config.tls_cert else "http"
        for host, port in await listener.start(config.host, config.port):
            log.info(  # a log line, so --log-format json keeps every line JSON
                "tiered listening on %s://%s:%s (%s; data dir %s)",
                scheme,
                url_host(host),
                port,
                config.http_server,
                config.data_path.resolve(),
            )
        warn_exposure(config)
        loop.add_signal_handler(signal.SIGHUP, engine.reload_keys)
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("shutting down")
        engine.streams.begin_shutdown()
        await listener.stop()
    finally:
        await engine.stop()
        lock.release()


async def serve_cluster(config: Config, ready: asyncio.Event | None = None) -> None:
    """Cluster mode: open the store and compose the node, listen (the advertised URL needs the port),
    then join and take shards.

    On SIGINT/SIGTERM the node stops acknowledging, hands each shard off
    (flushed), marks itself stopped so peers take over at once, and exits.
    """
    from tiered.cluster.compose import build_cluster_handler
    from tiered.cluster.server import ClusterServer, open_cluster

    config.data_path.mkdir(parents=True, exist_ok=True)
    lock = DataDirLock(config.data_path)
    lock.acquire()
    cluster: ClusterServer | None = None
    listener: Listener | None = None
    tune_collector()  # no freeze: shards' states come and go with their leases
    stop = asyncio.Event()  # handlers first, as in serve(): a SIGTERM during start-up shuts down cleanly
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        cluster = await open_cluster(config)
        listener = make_listener(config, build_cluster_handler(cluster))
        scheme = "https" if config.tls_cert else "http"
        bound = await listener.start(config.host, config.port)
        host, port = bound[0]
        # Another process holding this node id ends this one (tiered/cluster/membership/identity.py).
        await cluster.join(f"{scheme}://{url_host(host)}:{port}", on_replaced=stop.set)
        # Bounded: a node that cannot take shards yet (peers still hold them) serves by forwarding.
        await cluster.wait_serving(timeout_s=3 * config.cluster_lease_ttl_s)
        for host, port in bound:
            log.info(
                "tiered listening on %s://%s:%s (%s; cluster node %s, durability %s; data dir %s)",
                scheme,
                url_host(host),
                port,
                config.http_server,
                config.cluster_node_id,
                config.durability,
                config.data_path.resolve(),
            )
        warn_exposure(config)
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("shutting down: handing shards off")
    finally:
        if cluster is not None:
            await cluster.stop()
        if listener is not None:
            await listener.stop()
        lock.release()
    if cluster is not None and cluster.replaced is not None:
        raise cluster.replaced


def warn_exposure(config: Config) -> None:
    for warning in config.exposure_warnings(config.admin_token() is not None):
        log.warning("%s", warning)


class Listener(Protocol):
    async def start(self, host: str, port: int) -> list[tuple[str, int]]: ...
    async def stop(self, timeout: float = 5.0) -> None: ...


def make_listener(config: Config, handler: Handler) -> Listener:
    """The configured HTTP server adapter; both serve the same handler."""
    if config.http_server == "aiohttp":
        from tiered.api.kit.aiohttp_server import AiohttpListener

        return AiohttpListener(
            handler, max_body_bytes=config.max_body_bytes, large_body_max_bytes=large_body_limit(config)
        )
    from tiered.api.kit.rsgi_server import RsgiListener

    return RsgiListener(
        handler,
        max_body_bytes=config.max_body_bytes,
        large_body_max_bytes=large_body_limit(config),
        # Live readers beyond max_waiters get a 503 from the service, so let them reach it.
        max_connections=config.max_waiters + 1024,
        tls_cert=Path(config.tls_cert) if config.tls_cert else None,
        tls_key=Path(config.tls_key) if config.tls_key else None,
    )


def run(config: Config) -> int:
    from tiered.cold.objects.store import ConditionalWritesUnsupported, ObjectStoreError
    from tiered.engine.auth.jwt import JwksError
    from tiered.engine.jobs.claim import PrefixClaimed
    from tiered.engine.journal.snapshot import SnapshotError
    from tiered.hot.segment import CorruptSegmentError

    try:
        listen_addresses(config.host)  # resolved once here; the listener and the loopback test reuse it
    except UnresolvableHost as exc:
        print(f"tiered: cannot start: {exc}", file=sys.stderr)
        return 2
    problem = config.exposure_problem()
    if problem is not None:
        print(f"tiered: cannot start: {problem}", file=sys.stderr)
        return 2
    try:
        # Read at start (a systemd credential exists only once the unit runs, not when the
        # boot script checks the configuration): unreadable or too short refuses to start.
        config.cluster_secret()
    except ConfigError as exc:
        print(f"tiered: cannot start: {exc}", file=sys.stderr)
        return 2
    # Worker processes (tiered/cli/workers.py): the data dir keeps the layout it was first served with.
    from tiered.cluster.workers.layout import layout_problem

    workers = config.worker_count() > 1
    problem = None if config.cluster_node_id else layout_problem(config.data_path, workers=workers)
    if problem is not None:
        print(f"tiered: cannot start: {problem}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if workers:
        from tiered.cli.workers import serve_workers

        try:
            return asyncio.run(serve_workers(config))
        except (DataDirLocked, ObjectStoreError, OSError) as exc:
            print(f"tiered: cannot start: {exc}", file=sys.stderr)
            return 1
    from tiered.cluster.membership.identity import NodeIdInUse

    try:
        asyncio.run(serve(config))
    except NodeIdInUse as exc:
        print(f"tiered: stopped: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except ConditionalWritesUnsupported as exc:
        print(
            f"tiered: cannot start: the object store does not enforce conditional writes: {exc}. "
            "tiered relies on them (the one-server-per-prefix claim). Use a store that enforces them; only if "
            "you accept the risk README.md describes, set s3_conditional_writes = 'off'.",
            file=sys.stderr,
        )
        return 1
    except (
        DataDirLocked,
        CorruptSegmentError,
        SnapshotError,
        PrefixClaimed,
        ObjectStoreError,
        JwksError,
        OSError,
    ) as exc:
        print(f"tiered: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


def large_body_limit(config: Config) -> int:
    """Bodies the adapters may stream (large bodies stored by reference); 0 when that is off."""
    return config.large_body_max_bytes if config.large_body_threshold_bytes > 0 else 0
