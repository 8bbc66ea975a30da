"""The ``tiered`` command line: each command shows only the settings it uses, each with its default.

Every setting has one name in four places (flag, ``TIERED_*`` environment
variable, TOML key, and the ``Config`` field that documents it); precedence,
lowest first: default, TOML file, environment, flag.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import MISSING, Field, fields
from typing import Any

from tiered.core.config import Config, ConfigError, load_config
from tiered.core.logs import configure_logging

MiB = 1024 * 1024


def _default_text(f: Field[Any]) -> str:
    value = f.default if f.default is not MISSING else None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value >= MiB and value % MiB == 0:
        return f"{value} ({value // MiB} MiB)"
    if value == "":
        return "empty"
    return str(value)


def _add_config_flags(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument(
        "--config", help="TOML config file (settings under [tiered] or at top level) [env TIERED_CONFIG]"
    )
    for f in fields(Config):
        if command not in f.metadata.get("commands", ()):
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = " (true/false)" if f.type in (bool, "bool") else ""
        parser.add_argument(
            flag,
            dest=f.name,
            default=None,
            help=f"{f.metadata['help']}{kind} (default: {_default_text(f)}) [env TIERED_{f.name.upper()}]",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiered", description="A tiered log service speaking the Durable Streams protocol."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server", description="Run the Durable Streams server.")
    _add_config_flags(serve, "serve")
    verify = sub.add_parser(
        "verify",
        help="check every hot segment and cold object against the metadata",
        description="Check every hot record's checksum and read every cold object the metadata references: "
        "checksums, sizes, indexes, and that rows cover exactly the recorded stream ranges. Exit code 1 on any "
        "mismatch, 2 if the data dir does not exist. Reads the data dir and the store without modifying them; "
        "safe while a server runs.",
    )
    _add_config_flags(verify, "verify")
    verify.add_argument(
        "--shard",
        type=int,
        default=None,
        help="cluster mode: verify this shard of the node whose data dir and prefix are given (its engine's "
        "data dir <data-dir>/shards/NNNN and prefix <s3-prefix>/shards/NNNN)",
    )
    gc = sub.add_parser(
        "gc",
        help="run one GC pass (on a running server with --url, or offline on a data dir)",
        description="Run one GC pass: expire streams, apply retention, delete cold objects nobody owns "
        "(after the grace delay) and reconcile the object store. With --url, a running server does it "
        "(admin token from TIERED_ADMIN_TOKEN or --admin-token-file); otherwise it runs offline on a data "
        "dir no server holds. Exit code 1 if integrity errors are found, 2 if refused.",
    )
    gc.add_argument("--url", help="base URL of a running server, e.g. http://127.0.0.1:4437")
    gc.add_argument(
        "--dry-run", action="store_true", help="list what would be deleted and why; change nothing"
    )
    _add_config_flags(gc, "gc")
    cluster = sub.add_parser("cluster", help="cluster operations", description="Cluster operations.")
    ops = cluster.add_subparsers(dest="cluster_command", required=True)
    take = ops.add_parser(
        "take-over",
        help="give a dead node's local-durability shard to another node, losing its data",
        description="With local durability a shard's data is on its last writer's volume, so no other node "
        "takes it. When that node is gone for good, this grants the shard to another node, which starts it "
        "EMPTY. Prints exactly what is lost; changes nothing without --yes-lose-unflushed-data (or with "
        "--dry-run). Exit code 0 done or nothing to do, 1 refused, 2 bad use.",
    )
    take.add_argument("--shard", type=int, required=True, help="the shard number")
    take.add_argument(
        "--to", default="", help="the node id that may take it (default: any node but the dead one)"
    )
    take.add_argument(
        "--dead-data-dir",
        default="",
        help="the dead node's data dir, if still readable: its unflushed bytes are measured",
    )
    take.add_argument("--dry-run", action="store_true", help="print what would be lost; change nothing")
    take.add_argument("--yes-lose-unflushed-data", action="store_true", help="accept the loss printed")
    _add_config_flags(take, "serve")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Config)}
    try:
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"tiered: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_format, access_log=config.access_log)
    if args.command == "serve":
        from tiered.cli.serve import run

        return run(config)
    if args.command == "gc":
        from tiered.cli.gc import run_gc_command

        return run_gc_command(config, args.url, args.dry_run)
    if args.command == "cluster":
        from tiered.cli.cluster import run_take_over

        return run_take_over(
            config,
            args.shard,
            args.to,
            args.dead_data_dir,
            dry_run=args.dry_run,
            confirmed=args.yes_lose_unflushed_data,
        )
    if args.command == "verify":
        from tiered.cli.verify import run_verify

        if args.shard is not None:
            from tiered.cluster.shards.host import shard_config

            config = shard_config(config, args.shard)
        return asyncio.run(run_verify(config))
    return 2


if __name__ == "__main__":
    sys.exit(main())
