"""Tests of tiered.engine.subscriptions and its routes."""
