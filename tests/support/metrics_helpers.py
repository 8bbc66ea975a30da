"""Reading ``/metrics`` the way Prometheus does: through prometheus_client's own text parser.

``samples(text)`` maps each sample to its value, keyed ``name`` or
``name{a="x",b="y"}`` (labels sorted by name), so
``samples(text)['tiered_integrity_errors_total{tier="hot"}']`` reads one series.
A scrape that the parser refuses fails the test.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess


def families(text: str) -> dict[str, Metric]:
    """Metric families by name (a counter's family name has no ``_total``)."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample_key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = sample_key(s.name, s.labels)
            assert key not in out, f"duplicate sample {key}"
            out[key] = s.value
    return out


def scrape_text(srv: ServerProcess, headers: dict[str, str] | None = None) -> str:
    token = srv.env.get("TIERED_ADMIN_TOKEN")
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    status, response_headers, body = request("GET", srv.url + "/metrics", {**auth, **(headers or {})})
    assert status == 200, (status, body[:200])
    assert response_headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return body.decode()


def scrape(srv: ServerProcess) -> dict[str, float]:
    """Every sample of a live server's ``/metrics``."""
    return samples(scrape_text(srv))
