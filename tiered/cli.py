"""The ``tiered`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import fields

from .config import Config, ConfigError, load_config

_HELP = {
    "host": "address to listen on (default 127.0.0.1)",
    "port": "TCP port to listen on (default 4437)",
    "data_dir": "directory for hot segments, snapshots and the local object store (default ./tiered-data)",
    "fsync": "'always': acknowledge appends after fdatasync (survives power loss); "
    "'interval': acknowledge after write(), fdatasync every --fsync-interval-ms (survives a crash of "
    "the process, not of the machine)",
    "fsync_interval_ms": "how often 'interval' mode syncs (default 50)",
    "segment_bytes": "hot segment size before it rolls and seals (default 64 MiB)",
    "max_body_bytes": "largest request body accepted; larger gets 413 (default 16 MiB)",
    "max_hot_bytes": "cap on bytes held only in the hot tier; beyond it appends get 503 + Retry-After",
    "max_waiters": "cap on concurrent long-poll/SSE readers; beyond it 503",
    "long_poll_timeout_s": "how long a long-poll waits before 204 (default 20)",
    "sse_max_connection_s": "SSE connections close after this long so caches can collapse (default 60)",
    "read_chunk_bytes": "largest body a catch-up read returns; clients follow Stream-Next-Offset",
    "snapshot_every_bytes": "journal bytes between state snapshots (bounds restart replay time)",
    "log_level": "debug, info, warning or error",
    "cold_store": "where sealed data goes: 'local' (a directory under the data dir, the default) or 's3'",
    "s3_bucket": "S3 bucket for cold objects (credentials come from the standard AWS chain: env, profile, role)",
    "s3_prefix": "key prefix for this server's cold objects inside the bucket",
    "s3_endpoint": "endpoint URL for S3-compatible stores (MinIO, R2, Ceph...); empty for AWS",
    "s3_region": "S3 region (default from the AWS chain)",
    "s3_path_style": "use path-style addressing (true/false), needed by many S3-compatible stores",
    "take_over_prefix": "claim the object-store prefix even though another data dir holds it (true/false; only when "
    "that data dir is gone for good: its objects become orphans here and are deleted after the grace delay)",
    "flush_interval_s": "how often sealed hot data is flushed to the cold tier (default 1)",
    "flush_bytes": "flush early once this many bytes are waiting (default 8 MiB)",
    "cold_object_bytes": "target size of one cold object (default 16 MiB)",
    "hot_retention_s": "keep hot copies this long after they are cold (0: drop at once; default 60)",
    "read_cache_bytes": "memory for cached Parquet footers and row groups (default 64 MiB)",
    "cold_read_timeout_s": "a cold read the object store has not answered by then gets 503 + Retry-After (default 5)",
    "store_probe_interval_s": "how often the object store is probed for /readyz (default 5)",
    "gc_interval_s": "how often the server runs a GC pass (expiry, retention, deletion; default 60)",
    "gc_grace_s": "how long an object nobody owns waits before it is deleted (default 300)",
    "gc_max_objects_per_pass": "bound on objects deleted (and orphans handled) per GC pass (default 1000)",
    "reconcile_interval_s": "how often a GC pass also lists the object store to find orphans (default 3600)",
    "webhooks": "deliver webhook subscriptions (true/false; default true)",
    "webhook_allow_loopback": "let webhooks target loopback (http://localhost, 127.0.0.x) for local development "
    "(true/false; default false: anyone who can create a subscription could reach this machine's local services)",
    "public_url": "base URL clients reach this server at, for callback and JWKS URLs (default: from the request)",
    "admin_token_file": "file holding the admin bearer token (or set TIERED_ADMIN_TOKEN); without one, "
    "admin operations are allowed only when listening on loopback",
}


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML config file (settings under [tiered] or at top level); env TIERED_CONFIG")
    for f in fields(Config):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, dest=f.name, default=None, help=_HELP.get(f.name, "") + f" [env TIERED_{f.name.upper()}]")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiered", description="A tiered log service speaking the Durable Streams protocol.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server", description="Run the Durable Streams server.")
    _add_config_flags(serve)
    verify = sub.add_parser(
        "verify",
        help="check every cold object against the metadata",
        description="Read every cold object the metadata references and check checksums, sizes, "
        "indexes and that rows cover exactly the recorded stream ranges. Exit code 1 on any mismatch. "
        "Reads the data dir without modifying it; safe while a server runs.",
    )
    _add_config_flags(verify)
    gc = sub.add_parser(
        "gc",
        help="run one GC pass (on a running server with --url, or offline on a data dir)",
        description="Run one GC pass: expire streams, apply retention, delete cold objects nobody owns "
        "(after the grace delay) and reconcile the object store. With --url, a running server does it "
        "(admin token from TIERED_ADMIN_TOKEN or --admin-token-file); otherwise it runs offline on a data "
        "dir no server holds. Exit code 1 if integrity errors are found.",
    )
    gc.add_argument("--url", help="base URL of a running server, e.g. http://127.0.0.1:4437")
    gc.add_argument("--dry-run", action="store_true", help="list what would be deleted and why; change nothing")
    _add_config_flags(gc)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Config)}
    try:
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"tiered: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, config.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "serve":
        return _serve(config)
    if args.command == "gc":
        from .gc_command import run_gc_command

        return run_gc_command(config, args.url, args.dry_run)
    if args.command == "verify":
        from .verify import run_verify

        return asyncio.run(run_verify(config))
    return 2


def _serve(config: Config) -> int:
    from .cold.claim import PrefixClaimed
    from .hot.segment import CorruptSegmentError
    from .server import DataDirLocked, serve
    from .snapshot import SnapshotError

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


if __name__ == "__main__":
    sys.exit(main())
