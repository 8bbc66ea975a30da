"""Tests of tiered.engine.groups and its routes."""
