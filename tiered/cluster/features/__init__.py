"""Features across shards: forks, subscription feeds, bucket-wide usage, issued tokens, the groups directory and engine."""
