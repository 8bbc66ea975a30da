"""HTTP in front of one engine: the kit (types, router, error mapper, middleware, server adapters), the routes, the access table, the app."""
