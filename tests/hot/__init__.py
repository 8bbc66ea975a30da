"""Tests of tiered.hot."""
