"""The HTTP layer: framework-neutral requests and responses, routing, the one error mapper,
one middleware per file, and adapters to the HTTP servers that run it."""
