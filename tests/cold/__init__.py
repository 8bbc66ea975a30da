"""Tests of tiered.cold (object stores and the Parquet format)."""
