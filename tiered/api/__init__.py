"""HTTP in front of one engine: the route table (table.py, where a request starts), the access it derives, the kit (types, router, error mapper, middleware, server adapters), the routes, the app."""
