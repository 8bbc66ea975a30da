"""Object-store durability: a shard's journal shipped to the store as create-only WAL objects (step c)."""

from __future__ import annotations


class WalShipper:
    async def durable(self) -> None:
        return None
