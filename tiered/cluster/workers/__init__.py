"""One node served by several worker processes (``tiered serve --workers N``): docs/workers.md."""
