"""HTTP requests, counted where they are answered: ``tiered_http_requests_total{route,status}`` and
``tiered_http_client_disconnects_total{route,phase}``.

The outermost layer (``tiered.api.kit.middleware.request_id``) calls
``count_answer`` or ``count_disconnect`` once per request, on the event loop,
so refusals and 500s count with the status the client got. Plain Python
numbers, exposed by ``collect`` (a prometheus-client collector): no lock and
no object per request. A single server's ``/metrics`` is its engine's registry
followed by these; a cluster node's are its own (``tiered.cluster.node_metrics``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import prometheus_client
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric

from tiered.api.kit.types import UNMATCHED, Request, Response

__all__ = ["RequestCounts", "disconnects_family"]


class RequestCounts:
    def __init__(self, label_unrouted: Callable[[Request], str] | None = None) -> None:
        #: The router's labelling, for requests answered before they reached it (auth refusals).
        self.label_unrouted = label_unrouted
        self.requests: dict[str, dict[int, int]] = {}  # route -> status -> requests answered
        self.disconnects: dict[tuple[str, str], int] = {}  # (route, phase) -> clients that left

    def count_answer(self, request: Request, response: Response) -> None:
        """One answered request, by the route the router named and the status sent.

        A request whose client left before its answer is counted by
        ``count_disconnect`` instead. The label is kept in ``request.route``
        for the access log.
        """
        route = request.route
        if route == UNMATCHED:
            route = self._label(request)  # refused before the router (auth): label it now
        by_status = self.requests.get(route)
        if by_status is None:
            by_status = self.requests[route] = {}
        status = response.status
        by_status[status] = by_status.get(status, 0) + 1

    def count_disconnect(self, request: Request, phase: str) -> None:
        """A client that left: before its answer (``request``) or during a streamed one (``response``)."""
        key = (self._label(request), phase)
        self.disconnects[key] = self.disconnects.get(key, 0) + 1

    def _label(self, request: Request) -> str:
        route = request.route
        if route == UNMATCHED and self.label_unrouted is not None:
            route = request.route = self.label_unrouted(request)  # refused before the router (auth)
        return route

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "tiered_http_requests",
            "HTTP requests answered, by route (the router's name for it, never the path) and status",
            labels=["route", "status"],
        )
        for route, by_status in sorted(self.requests.items()):
            for status, n in sorted(by_status.items()):
                requests.add_metric([route, str(status)], n)
        yield requests
        yield disconnects_family(self.disconnects)

    def exposition(self) -> bytes:
        """These two families in the Prometheus text format, to follow an engine's registry."""
        registry = CollectorRegistry()
        registry.register(self)
        return prometheus_client.generate_latest(registry)


def disconnects_family(disconnects: dict[tuple[str, str], int]) -> CounterMetricFamily:
    """``tiered_http_client_disconnects_total{route,phase}`` (a single server's and a cluster node's)."""
    family = CounterMetricFamily(
        "tiered_http_client_disconnects",
        "Requests whose client closed the connection: before the answer (phase=request: while sending its body "
        "or waiting for a long-poll; not in tiered_http_requests_total) or during a streamed answer "
        "(phase=response)",
        labels=["route", "phase"],
    )
    for (route, phase), n in sorted(disconnects.items()):
        family.add_metric([route, phase], n)
    return family
