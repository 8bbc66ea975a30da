"""The cold prefix of a stream: ``cold_end`` moved over cold references that reach it (pure).

A large body stored by reference (``payloads``) may be referenced past
``cold_end`` while hot bytes below it wait for the flusher. Whatever moves
``cold_end`` (a flush commit, retention, a payload landing right at it) calls
``settle`` so the prefix runs on over such references.
"""

from __future__ import annotations

from operator import attrgetter

from tiered.engine.streams.model import Stream

_START = attrgetter("start")


def settle(s: Stream) -> None:
    """Move ``cold_end`` over cold references that reach it, keeping ``cold_refs`` sorted by offset.

    A flush commits its range after a payload reference that lies beyond it,
    hence the sort (only when the last two are out of order).
    """
    refs = s.cold_refs
    if len(refs) > 1 and refs[-2].start > refs[-1].start:
        refs.sort(key=_START)  # only the last one can be out of place: each commit appends one
    if not refs or refs[-1].end <= s.cold_end:
        return  # the common case: nothing past the cold prefix
    for ref in refs:
        if ref.start <= s.cold_end < ref.end:
            s.cold_end = ref.end
