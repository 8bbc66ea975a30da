"""The stream listing's merge (issue 22): shards' pages merged equal one engine's page of every stream.

Pure: streams spread over shards at random, each shard answers the page ``listing.page`` gives
for its own streams, and ``merge_stream_list`` must give exactly the page of all streams, so
paging through the merge lists every stream once, in order.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.cluster.gateway.scatter import Answer, merge_stream_list
from tiered.engine.streams.listing import Entry, ListQuery, page, page_sorted


def entry(path: str) -> Entry:
    return Entry(path, "text/plain", 0, 0, 1, False)


@settings(max_examples=200, deadline=None)
@given(
    streams=st.dictionaries(st.text("abc/", min_size=1, max_size=5), st.integers(0, 3), max_size=40),
    limit=st.integers(1, 6),
    prefix=st.sampled_from(["", "a", "b/", "c"]),
)
def test_paging_through_merged_pages_lists_every_stream_once_in_order(
    streams: dict[str, int], limit: int, prefix: str
) -> None:
    listed: list[str] = []
    after = ""
    for _ in range(len(streams) + 2):
        query = ListQuery(prefix, after, limit)
        answers = [
            Answer(shard, 200, page([p for p, s in streams.items() if s == shard], query, None, entry))
            for shard in range(4)
        ]
        status, merged = merge_stream_list(answers, lambda bucket: 0)
        single = page(list(streams), query, None, entry)
        assert (status, merged) == (200, single)
        # The engine's own page over its sorted directory is the same page.
        assert page_sorted(sorted(streams), query, None, lambda p: True, entry) == single
        listed += [row["path"] for row in merged["streams"]]
        if not merged["has_more"]:
            break
        after = merged["next_after"]
    assert listed == sorted(p for p in streams if p.startswith(prefix))


def test_grant_prefixes_cover_whole_segments() -> None:
    paths = ["app1", "app1/x", "app10", "app2", "b"]
    got = page(paths, ListQuery(), ("app1", "b"), entry)
    assert [row["path"] for row in got["streams"]] == ["app1", "app1/x", "b"]
    assert page(paths, ListQuery(), (), entry)["streams"] == []
