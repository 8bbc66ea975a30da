"""One shard's engine: the journal, the features' state machines and services, the background jobs, the record codec, and the Node that composes them."""
