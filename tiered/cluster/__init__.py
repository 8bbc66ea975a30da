"""Scale-out: many tiered nodes on one object store, coordinated only by its conditional writes.

Shards (``shards``) are owned through leases (``lease``) fenced by epochs in
each shard's manifest chain (``manifest``); nodes judge each other alive by
heartbeats read on their own clocks (``heartbeat``); placement names the
intended owner of each shard (``placement``). All of that is pure; the
store interface (``cas``) and one node's loop (``node_shell``) are the shell.
See docs/cluster.md.
"""
