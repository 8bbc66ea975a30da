"""``RsgiHeaders`` copies granian's headers once and answers as granian's own look-ups did.

granian's header object lists every name (``keys``), leaves out of ``items`` the values it cannot decode,
and answers ``get`` with a name's first value (None when that value is hidden). A stand-in with those
rules checks the copy: a hidden value reads as ``UNDECODABLE`` (refused downstream), also when it is the
first of a repeated name and a later one is clean.
"""

from __future__ import annotations

from tiered.api.kit.rsgi_server import UNDECODABLE, RsgiHeaders


class GranianLike:
    def __init__(self, pairs: list[tuple[str, str | None]]) -> None:
        self.pairs = pairs  # (lower-case name, value or None: not decodable)
        self.calls = 0

    def items(self) -> list[tuple[str, str]]:
        self.calls += 1
        return [(n, v) for n, v in self.pairs if v is not None]

    def keys(self) -> list[str]:
        self.calls += 1
        return list(dict.fromkeys(n for n, _ in self.pairs))

    def get(self, name: str, default: str | None = None) -> str | None:
        self.calls += 1
        for n, v in self.pairs:
            if n == name:
                return v
        return default


def test_headers_are_read_once_per_name_sent_and_answer_case_insensitively() -> None:
    raw = GranianLike([("content-type", "application/json"), ("content-length", "2"), ("host", "h")])
    h = RsgiHeaders(raw)
    assert h.get("Content-Type") == "application/json"
    assert h.get("Stream-Seq") is None and h.get("If-Match", "d") == "d"
    assert h["content-length"] == "2" and "HOST" in h and len(h) == 3
    assert sorted(h) == ["content-length", "content-type", "host"]
    assert raw.calls == 4  # keys, then each name sent, once, however many look-ups follow


def test_a_hidden_value_reads_as_undecodable() -> None:
    h = RsgiHeaders(GranianLike([("host", "h"), ("producer-id", None)]))
    assert h.get("Producer-Id") == UNDECODABLE
    assert "producer-id" in h


def test_a_repeated_name_reads_as_its_first_value_hidden_or_not() -> None:
    hidden_first = RsgiHeaders(GranianLike([("authorization", None), ("authorization", "Bearer ok")]))
    assert hidden_first.get("Authorization") == UNDECODABLE
    clean_first = RsgiHeaders(GranianLike([("x-a", "1"), ("x-a", "2"), ("x-b", None)]))
    assert clean_first.get("X-A") == "1" and clean_first.get("X-B") == UNDECODABLE


def test_a_plain_dict_as_forwarded_frames_carry_it() -> None:
    h = RsgiHeaders({"content-type": "text/plain", "stream-seq": "7"})
    assert h.get("Stream-Seq") == "7" and h.get("Producer-Id") is None
