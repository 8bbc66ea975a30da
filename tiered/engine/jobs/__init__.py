"""The engine's background jobs over the stores: the cold flusher and its plan, the prefix claim, the store's health probe."""
