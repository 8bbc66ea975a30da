"""Tests of tiered.engine.auth and its routes."""
