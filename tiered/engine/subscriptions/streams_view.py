"""The streams subscriptions link, as the rules see them: tails and retained offsets by path.

Subscriptions link streams under the stream root (the default bucket) by
path. The rules read them through ``StreamsView`` only: ``StateStreams``
over this engine's ``StreamState``, and in cluster mode ``CombinedStreams``
adds the streams other shards reported (``tiered.cluster.features.sub_feed``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.streams.model import Stream
from tiered.engine.streams.state import StreamState
from tiered.engine.subscriptions.model import is_reserved


class StreamsView(Protocol):
    """The streams under the stream root (default bucket) that subscriptions can link."""

    def tail(self, path: str) -> int | None:
        """The stream's tail offset, or None if no live stream has that path."""
        ...

    def paths(self) -> Iterable[str]: ...

    def retained(self, path: str) -> tuple[int, int] | None:
        """(first offset, retained offset) of the live stream at ``path``, or None.

        The first offset is where a link that acked nothing yet starts, for
        what it can lose: the stream's first byte. A fork's bytes below its
        fork point are its source's, readable from the fork's retained
        offset: retention among them is no loss to the link, only retention
        of the fork's own bytes is.
        """
        ...


def retained_of(s: Stream) -> tuple[int, int]:
    """``StreamsView.retained`` of one stream (a plain stream's fork offset is its first byte)."""
    return min(s.fork_offset, s.retained_from), s.retained_from


class StateStreams:
    """A ``StreamsView`` over ``StreamState``; ``visible_tail`` (the shell's) limits tails to durable data."""

    def __init__(
        self, state: StreamState, now_ms: int, visible_tail: Callable[[Stream], int] | None = None
    ) -> None:
        self.state = state
        self.now_ms = now_ms
        self.visible_tail = visible_tail

    def _live(self, s: Stream | None) -> bool:
        return s is not None and not s.soft_deleted and not s.expired(self.now_ms)

    def tail(self, path: str) -> int | None:
        s = self.state.find(DEFAULT_BUCKET, path)
        if s is None or not self._live(s):
            return None
        return self.visible_tail(s) if self.visible_tail is not None else s.tail

    def paths(self) -> Iterable[str]:
        for (bucket, path), uid in self.state.paths.items():
            if bucket == DEFAULT_BUCKET and not is_reserved(path) and self._live(self.state.streams.get(uid)):
                yield path

    def retained(self, path: str) -> tuple[int, int] | None:
        s = self.state.find(DEFAULT_BUCKET, path)
        if s is None or not self._live(s):
            return None
        return retained_of(s)


class CombinedStreams:
    """This engine's streams, then the ones other shards reported (cluster mode: ``tiered.cluster.features.sub_feed``)."""

    def __init__(self, local: StreamsView, remote: StreamsView) -> None:
        self.local = local
        self.remote = remote

    def tail(self, path: str) -> int | None:
        tail = self.local.tail(path)
        return tail if tail is not None else self.remote.tail(path)

    def paths(self) -> Iterable[str]:
        seen = set(self.local.paths())
        yield from seen
        for path in self.remote.paths():
            if path not in seen:
                yield path

    def retained(self, path: str) -> tuple[int, int] | None:
        got = self.local.retained(path)
        return got if got is not None else self.remote.retained(path)
