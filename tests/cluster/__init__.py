"""Tests of tiered.cluster."""
