"""The body of /metrics: Prometheus's text format (0.0.4), rendered by prometheus-client a
family at a time, each family's text kept from one scrape to the next while its samples
stay the same.

Why the text format whatever the scraper prefers: Prometheus asks for OpenMetrics first
(2.x: ``application/openmetrics-text;version=1.0.0,...``), and prometheus-client's
OpenMetrics writer escapes every sample's name a character at a time, which made a scrape
of the agent ~30 % dearer than the same scrape in the text format (docs/benchmarks.md).
OpenMetrics would give tpumon's series nothing: they carry no exemplars and no
``_created`` samples. node_exporter answers Prometheus in the text format too
(client_golang serves OpenMetrics only when an exporter opts in).

Why the cache: between two scrapes 15 s apart, about half the families have not changed
(the metrics the runtime serves, HBM capacity, verdicts, owners, build and configuration),
and writing a sample's line is most of a scrape's CPU (~90 Python calls a sample in
prometheus-client 0.26, the scrape profiled), nearly all of them for the name and labels
(each label name checked and escaped, each value escaped). Most families that did change
have the same series with new values (HBM used, duty cycle, counters): their lines keep
the library's text up to the value, and only the values are written again, by the
library's own ``floatToGoString``, as ``generate_latest`` writes them. Anything else
that differs (a series more or less, other labels, a timestamp, a family the library
does not write one line per sample in order) is written whole by ``generate_latest``.
A scrape still collects every family afresh from the poll's snapshot, so nothing served
is older than the collectors make it. (Samples are compared as values: a 0 that became
-0.0 keeps its text, the same number to Prometheus.)
"""

from __future__ import annotations

import gzip
from typing import Callable, Iterable, Iterator, NamedTuple
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString


# A body of ~40 KiB every 15 s: level 1 costs a quarter of level 9's CPU (0.24 against
# 0.92 ms warm, what prometheus-client's app uses) for ~17 % more bytes (6.3 KiB, not 5.4).
GZIP_LEVEL = 1


class _Family:
    """One family as a collector: what generate_latest takes."""

    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self._metric


class _Written(NamedTuple):
    """A family as last written, and its text cut where each sample's value begins:
    ``head`` (the HELP and TYPE lines) and each sample's line up to its value, or
    ``lines`` None where the text is not one line per sample, in order, ending in the
    value."""

    metric: Metric
    text: bytes
    head: str
    lines: tuple[str, ...] | None


def _cut(metric: Metric, text: bytes) -> _Written:
    """The library's text of a family, cut before each sample's value where it can be."""
    lines = text.decode().split("\n")  # label values and help have theirs escaped
    head, samples = lines[:2], lines[2:-1]
    if len(samples) != len(metric.samples) or \
            any(s.timestamp is not None for s in metric.samples):
        return _Written(metric, text, "", None)
    cut = []
    for line, sample in zip(samples, metric.samples, strict=True):
        value = " " + floatToGoString(sample.value)
        if not line.endswith(value):
            return _Written(metric, text, "", None)
        cut.append(line[:-len(value) + 1])
    return _Written(metric, text, "\n".join(head) + "\n", tuple(cut))


def _same_series(old: Metric, new: Metric) -> bool:
    """Whether two collections of a family differ at most in their samples' values."""
    return old.name == new.name and old.type == new.type and \
        old.documentation == new.documentation and old.unit == new.unit and \
        len(old.samples) == len(new.samples) and \
        all(a.name == b.name and a.labels == b.labels and b.timestamp is None
            for a, b in zip(old.samples, new.samples, strict=True))


def write_family(metric: Metric, last: _Written | None) -> _Written:
    """The family's text: the last one if nothing changed, the last lines with new values
    if only values did, else prometheus-client's."""
    if last is not None and last.metric == metric:
        return last
    if last is not None and last.lines is not None and _same_series(last.metric, metric):
        pairs = zip(last.lines, metric.samples, strict=True)
        text = last.head + "".join([line + floatToGoString(sample.value) + "\n"
                                    for line, sample in pairs])
        return _Written(metric, text.encode(), last.head, last.lines)
    return _cut(metric, generate_latest(_Family(metric)))


class CachedExposition:
    """A registry's exposition, each family's text written again only where it changed.
    Scrapes may come on several threads at once: each reads the last scrape's texts and
    leaves its own, so a race costs a family written twice, never a wrong body."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._last: dict[str, _Written] = {}

    def render(self) -> bytes:
        last, kept = self._last, {}
        parts = []
        for metric in self._registry.collect():
            written = kept[metric.name] = write_family(metric, last.get(metric.name))
            parts.append(written.text)
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
