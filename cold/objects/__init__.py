"""Object stores: the ObjectStore protocol (create-only and compare-and-set writes), local directory and S3 backends, retries, key layout."""
