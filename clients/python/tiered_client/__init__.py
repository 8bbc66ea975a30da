"""Python clients of a tiered server, outside the server package: the consumer-group client (tiered_client.groups)."""
