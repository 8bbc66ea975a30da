"""Tests of tiered.engine.streams."""
