"""Middleware, one per file: request ids, security headers, CORS preflight, auth, usage, the admin guard."""
