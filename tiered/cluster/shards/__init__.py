"""One engine per served shard: the shard host, WAL shipping and its index, the operator's takeover."""
