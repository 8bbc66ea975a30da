"""What a multi-worker node's processes agree on: ids, the data dir's layout, each worker's settings. Pure.

A node served by workers is a single-machine cluster: each worker is a
cluster node (``w0``, ``w1``, ...) with local durability on the one data dir
they share, its shards placed by rendezvous hashing, its lease records and
manifest chains in the node's local object store (``<data>/cold``, whose
compare-and-set is an ``flock``), and its siblings reached over Unix sockets.

A data dir is laid out for one process (one engine at its root: ``IDENTITY``,
``hot/``, ``snapshots/``) or for workers (one engine per shard under
``shards/``, and the ``WORKERS`` marker). The two do not see each other's data,
so each refuses the other's layout instead of starting empty beside it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tiered.core.config import Config

__all__ = [
    "MARKER",
    "layout_problem",
    "worker_config",
    "worker_id",
    "worker_index",
]

#: Present in a data dir laid out for workers (written by the first multi-worker start).
MARKER = "WORKERS"
_SINGLE = "IDENTITY"  # a single process's engine identity, at the data dir's root


def worker_id(index: int) -> str:
    return f"w{index}"


def worker_index(node_id: str) -> int | None:
    """The index of a worker id (``w3`` -> 3); None for any other node id."""
    if len(node_id) > 1 and node_id[0] == "w" and node_id[1:].isdigit():
        return int(node_id[1:])
    return None


def layout_problem(data_dir: Path, *, workers: bool) -> str | None:
    """Why ``data_dir`` cannot be served as asked (None: it can): it holds the other layout's data."""
    if workers and (data_dir / _SINGLE).exists():
        return (
            f"{data_dir} holds a single-process node's data (served with workers = 1); a multi-worker node "
            "keeps one engine per shard and would not see it: serve it with --workers 1"
        )
    if not workers and (data_dir / MARKER).exists():
        return (
            f"{data_dir} holds a multi-worker node's data (one engine per shard); a single process would not "
            "see it: serve it with --workers N (N > 1, or 0 for one per core)"
        )
    return None


def worker_config(base: Config, index: int) -> Config:
    """Worker ``index``'s settings: a cluster node of the node's own single-machine cluster."""
    return dataclasses.replace(
        base,
        cluster_node_id=worker_id(index),
        cluster_advertise_url="",  # its Unix socket, known once it listens
        cluster_shards=base.worker_shards,
        durability="local",
        workers=1,
    )
