"""Tests of tiered.engine.jobs."""
