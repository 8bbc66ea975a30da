"""What a cluster plugs into one shard's engine, handed to the engine's constructor.

A single server's engine sees only its own streams. In cluster mode each
shard's engine is the same engine with hooks (``tiered/cluster/compose.py``
builds them, one ``EngineHooks`` per shard):

* ``remote_forks``: a fork whose source is in another shard is pinned and copied there;
* ``remote_streams``: the subscriptions' shard also sees the streams other shards report;
* ``remote_append``: a wake event goes to a wake stream in another shard;
* ``quota_others``: a bucket's usage in the other shards, so quotas hold bucket-wide;
* ``stream_directory``: a consumer group decides on the streams of every shard;
* ``gc_tasks``: garbage only a cluster has (WAL objects, fork pins), collected by the engine's GC runner;
* ``extensions``: parts built with the engine that see its state (commit observers and background
  jobs, e.g. the subscription feed of a shard), each run by the engine's supervisor.

Every hook is given once, before the engine composes its parts; each part
gets what it needs in its constructor and nothing is set on it afterwards.
A hook left at its default is a single server's behaviour (nothing elsewhere).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from tiered.core.clock import Clock
from tiered.engine.groups.service import StreamDirectory
from tiered.engine.journal.committer import CommitObserver
from tiered.engine.streams.model import Stream
from tiered.engine.streams.service import RemoteForks
from tiered.engine.streams.state import StreamState
from tiered.engine.subscriptions.state import StreamsView
from tiered.engine.supervisor import Job
from tiered.gc.context import GcTask

#: Append one JSON message to a stream of another shard; False: not written, try again later.
RemoteAppend = Callable[[str, bytes], Awaitable[bool]]
#: (streams, retained bytes) of a bucket in the other shards.
QuotaOthers = Callable[[str], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class EngineView:
    """What an extension sees of the engine it is built with: its state, its clock, what readers see."""

    state: StreamState
    clock: Clock
    visible_tail: Callable[[Stream], int]


@dataclass(frozen=True, slots=True)
class Extension:
    """Parts an extension adds to one engine: commit observers (after the engine's own) and jobs."""

    observers: Sequence[CommitObserver] = ()
    jobs: Mapping[str, Job] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class EngineHooks:
    remote_forks: RemoteForks | None = None
    remote_streams: StreamsView | None = None
    remote_append: RemoteAppend | None = None
    quota_others: QuotaOthers | None = None
    stream_directory: StreamDirectory | None = None
    gc_tasks: Sequence[GcTask] = ()
    extensions: Sequence[Callable[[EngineView], Extension]] = ()


#: A single server's engine: nothing elsewhere.
NO_HOOKS = EngineHooks()
