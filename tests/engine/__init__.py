"""Tests of the engine as a whole: replay, readiness, metrics, integrity, crashes, the cold tier."""
