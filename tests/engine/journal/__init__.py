"""Tests of tiered.engine.journal."""
