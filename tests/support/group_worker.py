"""A consumer-group worker process for ``test_groups_e2e``.

    python tests/support/group_worker.py URL GROUP MEMBER LOGFILE

Uses ``tiered_client.groups.GroupConsumer``: for every batch it appends one line
``<stream> <offset> <fence>`` per message (messages are newline-terminated) to
LOGFILE and flushes it to the OS *before* committing, so a SIGKILL can lose
commits (the messages are then processed again) but never a processed record.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from tiered.core.ids import format_offset, parse_offset
from tiered_client.groups import GroupConsumer, GroupFenced


async def main(url: str, group: str, member: str, log_path: str) -> int:
    with open(log_path, "a", buffering=1) as log:
        async with GroupConsumer(
            url, group, member, auto_commit=False, wait_ms=1000, commit_interval_s=0.1
        ) as consumer:
            try:
                async for batch in consumer:
                    base = parse_offset(batch.offset)
                    assert base is not None and batch.data.endswith(b"\n"), batch
                    lines, pos = [], 0
                    while pos < len(batch.data):
                        nl = batch.data.index(b"\n", pos)
                        lines.append(f"{batch.stream} {base + pos} {batch.fence}\n")
                        pos = nl + 1
                    log.write("".join(lines))
                    log.flush()
                    consumer.commit_offset(batch.stream, batch.fence, format_offset(base + pos))
            except GroupFenced:
                print(f"{member}: superseded by a newer instance", file=sys.stderr)
                return 3
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {sys.argv[3]} %(levelname)s %(message)s")
    sys.exit(asyncio.run(main(*sys.argv[1:5])))
