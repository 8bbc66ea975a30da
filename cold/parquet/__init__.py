"""The cold object format: Parquet chunks, their index with digests, the read cache and the reader."""
