"""Tests of tiered.core."""
