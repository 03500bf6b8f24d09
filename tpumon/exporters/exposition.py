"""The body of /metrics: Prometheus's text format (0.0.4), rendered by prometheus-client a
family at a time, each family's text kept from one scrape to the next while its samples
stay the same.

Why the text format whatever the scraper prefers: Prometheus asks for OpenMetrics first
(2.x: ``application/openmetrics-text;version=1.0.0,...``), and prometheus-client's
OpenMetrics writer escapes every sample's name a character at a time, which made a scrape
of the agent ~30 % dearer than the same scrape in the text format (docs/benchmarks.md,
issue 25). OpenMetrics would give tpumon's series nothing: they carry no exemplars and no
``_created`` samples. node_exporter answers Prometheus in the text format too
(client_golang serves OpenMetrics only when an exporter opts in).

Why the cache: between two scrapes 15 s apart, about half the families have not changed
(the metrics the runtime serves, HBM capacity, verdicts, owners, build and configuration),
and writing a sample's line is most of a scrape's CPU (~90 Python calls a sample in
prometheus-client 0.26, the scrape profiled). A family is written again when anything in
it differs; a scrape still collects every family afresh from the poll's snapshot, so
nothing served is older than the collectors make it.
"""

from __future__ import annotations

import gzip
from typing import Callable, Iterable, Iterator
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, gzip_accepted
from prometheus_client.metrics_core import Metric


# A body of ~40 KiB every 15 s: level 1 costs a quarter of level 9's CPU (0.24 against
# 0.92 ms warm, what prometheus-client's app uses) for ~17 % more bytes (6.3 KiB, not 5.4).
GZIP_LEVEL = 1


class _Family:
    """One family as a collector: what generate_latest takes."""

    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self._metric


class CachedExposition:
    """A registry's exposition, each family's text written again only when it changed.
    Scrapes may come on several threads at once: each reads the last scrape's texts and
    leaves its own, so a race costs a family written twice, never a wrong body."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._last: dict[str, tuple[Metric, bytes]] = {}

    def render(self) -> bytes:
        last, kept = self._last, {}
        parts = []
        for metric in self._registry.collect():
            seen = last.get(metric.name)
            text = seen[1] if seen is not None and seen[0] == metric else \
                generate_latest(_Family(metric))
            kept[metric.name] = (metric, text)
            parts.append(text)
        self._last = kept
        return b"".join(parts)


def metrics_app(registry: CollectorRegistry) -> Callable:
    """The WSGI app of /metrics (GET; the caller answers other methods): the text format,
    gzip (level GZIP_LEVEL) when the scraper accepts it, ``name[]`` narrowing the families as
    prometheus-client's own app does (then written without the cache)."""
    exposition = CachedExposition(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        body = generate_latest(registry.restricted_registry(names)) if names else \
            exposition.render()
        headers = [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    return app
