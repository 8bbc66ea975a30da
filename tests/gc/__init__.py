"""Tests of tiered.gc."""
