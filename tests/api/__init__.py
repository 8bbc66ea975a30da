"""Tests of tiered.api: the protocol over HTTP, both adapters, HTTP/2 and TLS, the official conformance suite and clients."""
