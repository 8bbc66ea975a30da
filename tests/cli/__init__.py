"""Tests of tiered.cli."""
