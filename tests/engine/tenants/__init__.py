"""Tests of tiered.engine.tenants and its routes."""
