"""Operating the service: the admin API (retention, GC), metrics, health and readiness."""
