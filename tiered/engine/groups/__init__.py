"""Consumer groups (our extension of the protocol): records, pure state, views, service."""
