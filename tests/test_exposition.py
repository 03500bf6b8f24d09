"""/metrics' body: prometheus-client's text format, each family's text kept while it stays
the same, and what a real scraper's request gets."""

import gzip
import random
from typing import Iterator

import pytest

from prometheus_client import CollectorRegistry, Counter, generate_latest, make_wsgi_app
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, InfoMetricFamily, Metric)
from prometheus_client.parser import text_string_to_metric_families

from tools import PROMETHEUS_HEADERS
from tpumon.metrics import exposition
from tpumon.metrics.exposition import CachedExposition, metrics_app


class Chips:
    """A collector whose values a test changes between scrapes."""

    def __init__(self) -> None:
        self.used = {"0": 1.0, "1": 2.0}
        self.total = 32.0
        self.latency = [0.1, 0.2]

    def collect(self) -> Iterator[Metric]:
        used = GaugeMetricFamily("t_used_bytes", "used", labels=["chip"])
        for chip, value in self.used.items():
            used.add_metric([chip], value)
        total = GaugeMetricFamily("t_total_bytes", 'total "quoted"\nline', labels=["chip"])
        total.add_metric(["0"], self.total)
        latency = HistogramMetricFamily("t_latency_seconds", "latency", labels=["chip"])
        latency.add_metric(["0"], [("0.1", 1), ("+Inf", len(self.latency))],
                           sum(self.latency))
        yield from (used, total, latency)


def registry_with(chips: Chips) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(chips)
    Counter("t_scrapes", "a counter the library keeps", registry=registry).inc()
    return registry


def test_each_scrape_is_the_libraries_own_text_of_the_registry_as_it_is_now():
    chips = Chips()
    registry = registry_with(chips)
    cached = CachedExposition(registry)
    assert cached.render() == generate_latest(registry)
    chips.used["1"] = 3.0  # one sample of one family
    chips.latency.append(0.3)
    assert cached.render() == generate_latest(registry)
    chips.used["2"] = 4.0  # a series more
    del chips.used["0"]
    assert cached.render() == generate_latest(registry)
    assert cached.render() == generate_latest(registry)  # nothing changed
    values = {s.labels["chip"]: s.value for f in text_string_to_metric_families(
        cached.render().decode()) if f.name == "t_used_bytes" for s in f.samples}
    assert values == {"1": 3.0, "2": 4.0}


def test_the_library_writes_a_family_again_only_when_its_series_changed(monkeypatch):
    chips = Chips()
    registry = registry_with(chips)
    cached = CachedExposition(registry)
    cached.render()
    written: list[str] = []
    real = exposition.generate_latest

    def counting(family):
        written.extend(m.name for m in family.collect())
        return real(family)

    monkeypatch.setattr(exposition, "generate_latest", counting)
    cached.render()
    assert written == []
    chips.total = 64.0  # a value: the family's lines are kept up to their values
    chips.used["1"] = float("nan")
    assert cached.render() == generate_latest(registry)
    assert written == []
    chips.used["2"] = 1.0  # a series more: the library writes the family again
    assert cached.render() == generate_latest(registry)
    assert written == ["t_used_bytes"]


class Varied:
    """Families of every type the agent serves, with awkward labels, changed at random."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.labels = ["0", "a b", 'q"uote', "back\\slash", "new\nline", "é ünïcode", ""]
        # (not -0.0: a sample equal to the last keeps its text, and -0.0 == 0.0)
        self.values = [0.0, 1.0, 1e-300, 123456789.0, 1e22, 2.0**63, -3.5,
                       float("inf"), float("-inf"), float("nan"), 7, True]
        self.series = {"0": 1.0}
        self.stamped = False

    def change(self) -> None:
        pick, r = self.random.random(), self.random
        if pick < 0.6:
            self.series[r.choice(list(self.series))] = r.choice(self.values)
        elif pick < 0.8:
            self.series[r.choice(self.labels)] = r.choice(self.values)
        elif pick < 0.9 and len(self.series) > 1:
            del self.series[r.choice(list(self.series))]
        else:
            self.stamped = not self.stamped

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily("v_gauge", "help with \\ and\nnewline", labels=["chip"])
        counter = CounterMetricFamily("v_events", "a counter", labels=["chip"])
        info = InfoMetricFamily("v_build", "an info")
        info.add_metric([], {"version": str(len(self.series))})
        stamp = 1700000000.5 if self.stamped else None
        for chip, value in self.series.items():
            gauge.add_metric([chip], value, timestamp=stamp)
            counter.add_metric([chip], abs(float(value)) if value == value else 0.0)
        histogram = HistogramMetricFamily("v_seconds", "a histogram", labels=["chip"])
        histogram.add_metric(["0"], [("0.5", len(self.series)), ("+Inf", 9)], 4.25)
        yield from (gauge, counter, info, histogram)


@pytest.mark.parametrize("seed", range(5))
def test_values_written_into_kept_lines_read_as_the_libraries_text(seed):
    varied = Varied(seed)
    registry = CollectorRegistry()
    registry.register(varied)
    cached = CachedExposition(registry)
    for _ in range(200):
        varied.change()
        assert cached.render() == generate_latest(registry)


def test_prometheus_asking_for_openmetrics_gets_the_text_format_gzipped():
    app = metrics_app(registry_with(Chips()))
    answer: list = []
    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics",
                         "HTTP_ACCEPT": PROMETHEUS_HEADERS["Accept"],
                         "HTTP_ACCEPT_ENCODING": "gzip"},
                        lambda status, headers: answer.extend((status, dict(headers)))))
    status, headers = answer
    assert status == "200 OK"
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(body).decode()
    assert "# EOF" not in text and "t_scrapes_total 1.0" in text


def test_name_narrows_the_families_as_prometheus_clients_app_does():
    """(prometheus-client narrows to the families of collectors that describe themselves.)"""
    registry = registry_with(Chips())
    app = metrics_app(registry)
    query = "name[]=t_scrapes_total&name[]=t_total_bytes"
    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics",
                         "QUERY_STRING": query}, lambda *_: None))
    library = b"".join(make_wsgi_app(registry)({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics",
                                                "QUERY_STRING": query}, lambda *_: None))
    assert body == library
    assert [f.name for f in text_string_to_metric_families(body.decode())] == ["t_scrapes"]

