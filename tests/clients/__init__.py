"""Tests of tiered_client, the Python consumer-group client, against a scripted server."""
