"""A heartbeat whose commits are on their way to disk while a newer instance joins under the same member id.

The heartbeat is decided and applied at once, then waits for the journal;
meanwhile a join with a new ``join_id`` supersedes the instance (a new
generation takes its streams). The heartbeat must then answer ``FENCED``
(``generation``): it used to answer with the member's view as it was after the
wait, that is the *new* instance's generation and fences, so the superseded
instance carried on as the new one and both consumed the same streams
(``test_groups_e2e``: "the superseded consumer kept going").
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.gc_support import Harness, VirtualClock, make_config
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.groups.state import CommitRequest, GroupSpec


def test_a_heartbeat_superseded_while_its_commit_is_made_durable_is_fenced(tmp_path: Path) -> None:
    async def main() -> None:
        h = Harness(make_config(tmp_path / "data"), clock=VirtualClock())
        await h.start()
        try:
            await h.create("default", "h/s0", b"0123456789", content_type="text/plain")
            groups = h.s.groups
            await groups.create("g", GroupSpec(pattern="h/*"))
            old = await groups.join("g", "a", "first-instance")
            [assignment] = old["assignments"]
            commit = CommitRequest("h/s0", assignment["fence"], 4)

            heartbeat = asyncio.create_task(
                groups.heartbeat("g", "a", old["incarnation"], old["generation"], [commit], [], None, 0, None)
            )
            await asyncio.sleep(0)  # the heartbeat runs until it waits for the disk
            uid = h.s.streams.lookup("default", "h/s0").uid
            # Applied, not yet durable.
            assert not heartbeat.done() and groups.groups.get("g").cursors[uid] == 4
            new = await groups.join("g", "a", "second-instance")
            assert new["generation"] > old["generation"]

            with pytest.raises(TieredError) as refused:
                await heartbeat
            assert refused.value.code == ErrorCode.FENCED
            assert refused.value.context == {"reason": "generation", "generation": new["generation"]}
        finally:
            await h.stop()

    asyncio.run(main())
