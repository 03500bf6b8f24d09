"""The runtime's other metrics (bandwidth, idle time, HLO queue and timings, megascale/DCN
distributions) through the runtime source, against a real gRPC server from tpu-info's
stubs: what is listed is asked, on the slow cadence, again after a restart; bad entries
are counted, never raised."""

import math
import time

import pytest

from fake_runtime import chips_metrics
from prometheus_client.parser import text_string_to_metric_families
from tpu_info.metrics import MetricName
from tpumon.common.samples import Distribution
from tpumon.sim.runtime_entries import (buffer_attribute, device_attribute, distribution_entry,
                                        gauge_entry, hlo_attribute)
from tpumon.sources.chips import inventory_for
from tpumon.sources.health import SourceUnavailable
from tpumon.sources.runtime_catalog import CATALOG
from tpumon.sources.tpu_runtime import METRICS, USAGE, TpuRuntimeSource

BW = MetricName.HBM_BW_UTIL.value
IDLE = MetricName.TENSORCORE_IDLE_DURATION.value
QUEUE = MetricName.HLO_QUEUE_SIZE.value
HLO = MetricName.HLO_EXECUTION_TIMING_DISTRIBUTION_MICROSECONDS.value
DCN = MetricName.BUFFER_TRANSFER_LATENCY_US.value
RATE = MetricName.GRPC_TCP_DELIVERY_RATE_MBPS.value


def full_metrics(dcn_counts=(0, 1, 3, 0)):
    metrics = chips_metrics({0: 100, 1: 200})
    metrics[BW] = [gauge_entry(device_attribute(d), 40.0 + d) for d in (0, 1)]
    metrics[IDLE] = [gauge_entry(device_attribute(d), 0.5) for d in (0, 1)]
    metrics[QUEUE] = [gauge_entry(hlo_attribute(d), 2 + d) for d in (0, 1)]
    metrics[HLO] = [distribution_entry(hlo_attribute(d), [0, 2, 2, 0], mean=3.0) for d in (0, 1)]
    metrics[DCN] = [distribution_entry(buffer_attribute("8MiB"), list(dcn_counts), mean=2.5),
                    distribution_entry(buffer_attribute("8MiB"), list(dcn_counts), mean=2.5),
                    distribution_entry(buffer_attribute("1KiB"), [1, 0, 0, 0], mean=0.5)]
    metrics[RATE] = [distribution_entry(buffer_attribute("all"), [0, 0, 4], mean=8.0)]
    return metrics


def source(port, slow_interval=0.0):
    return TpuRuntimeSource("localhost", [port], 1.0, inventory_for("v4", 2),
                            slow_interval=slow_interval)


def by_family(reading):
    out = {}
    for s in reading.series:
        out.setdefault(s.family, {})[s.labels] = s
    return out


def test_lists_what_the_runtime_serves_and_reads_each_in_its_unit(runtime_servers):
    server = runtime_servers(full_metrics())
    server.runtime.supported = [*METRICS, BW, IDLE, QUEUE, HLO, DCN, RATE, "tpu.future.metric"]
    src = source(server.port)
    reading = src.poll()
    assert server.runtime.list_calls == 1
    assert "tpu.future.metric" in reading.supported and BW in reading.supported
    fam = by_family(reading)
    assert fam["tpumon_hbm_bandwidth_utilization_ratio"][("1",)].value == pytest.approx(0.41)
    assert fam["tpumon_tensorcore_idle_seconds"][("0",)].value == 0.5
    queue = fam["tpumon_hlo_queue_size"]
    assert queue[("1", "TPU_CORE_TYPE_TENSOR_CORE")].value == 3
    hlo = fam["tpumon_hlo_execution_seconds"][("0", "TPU_CORE_TYPE_TENSOR_CORE")].histogram
    assert hlo.bounds == pytest.approx((1e-6, 2e-6, 4e-6))  # microseconds -> seconds
    assert hlo.counts == (0, 2, 2, 0) and hlo.sum == pytest.approx(4 * 3.0e-6)
    dcn = fam["tpumon_dcn_transfer_latency_seconds"]
    assert set(dcn) == {("8MiB",), ("1KiB",)}
    assert dcn[("8MiB",)].histogram.counts == (0, 2, 6, 0)  # two entries of a size added
    rate = fam["tpumon_dcn_tcp_delivery_rate_bytes_per_second"][("all",)].histogram
    assert rate.bounds == pytest.approx((125000.0, 250000.0))  # Mbps -> bytes/s
    assert src.malformed_total == 0
    assert server.runtime.requested.count("tpu.future.metric") == 0  # unknown: not asked


def test_unlisted_metrics_are_not_asked_and_an_old_runtime_gets_the_core_three(runtime_servers):
    server = runtime_servers(full_metrics())
    server.runtime.supported = [*METRICS, BW]
    reading = source(server.port).poll()
    assert set(by_family(reading)) == {"tpumon_hbm_bandwidth_utilization_ratio"}
    assert HLO not in server.runtime.requested
    old = runtime_servers(full_metrics())  # ListSupportedMetrics UNIMPLEMENTED
    reading = source(old.port).poll()
    assert reading.series == () and reading.supported == tuple(sorted(METRICS))
    assert set(old.runtime.requested) == set(METRICS)


def test_distributions_on_the_slow_cadence_usage_every_poll(runtime_servers):
    server = runtime_servers(full_metrics())
    server.runtime.supported = [*METRICS, HLO, DCN]
    src = source(server.port, slow_interval=3600)
    first = src.poll()
    asked = len(server.runtime.requested)
    second = src.poll()
    assert server.runtime.requested[asked:] == [USAGE]
    assert second.series == first.series  # the last values stand between their turns


def test_asked_again_after_a_runtime_restart(runtime_servers):
    server = runtime_servers(full_metrics())
    server.runtime.supported = [*METRICS, BW]
    src = source(server.port, slow_interval=3600)
    assert set(by_family(src.poll())) == {"tpumon_hbm_bandwidth_utilization_ratio"}
    port = server.port
    server.stop()
    with pytest.raises(SourceUnavailable):
        src.poll()
    restarted = runtime_servers(full_metrics(), port=port)  # another libtpu: more metrics
    restarted.runtime.supported = [*METRICS, BW, HLO]
    reading = None
    deadline = time.monotonic() + 10
    while (reading is None or not reading.series) and time.monotonic() < deadline:
        try:
            reading = src.poll()
        except SourceUnavailable:
            time.sleep(0.1)
    assert restarted.runtime.list_calls == 1
    assert set(by_family(reading)) == {"tpumon_hbm_bandwidth_utilization_ratio",
                                       "tpumon_hlo_execution_seconds"}


def test_a_listed_metric_that_is_not_found_is_dropped_the_rest_read(runtime_servers):
    metrics = full_metrics()
    del metrics[IDLE]
    server = runtime_servers(metrics)
    server.runtime.supported = [*METRICS, BW, IDLE]
    src = source(server.port)
    src.poll()
    reading = src.poll()
    assert server.runtime.requested.count(IDLE) == 1  # not asked again
    assert set(by_family(reading)) == {"tpumon_hbm_bandwidth_utilization_ratio"}


def test_unreadable_entries_are_counted_not_raised(runtime_servers):
    metrics = full_metrics()
    metrics[BW].append(gauge_entry(device_attribute(2), math.nan))  # NaN
    metrics[BW].append(gauge_entry(hlo_attribute(3), 1.0))  # no device id where expected
    metrics[QUEUE].append(distribution_entry(hlo_attribute(2), [1], mean=1.0))  # not a gauge
    metrics[HLO].append(distribution_entry(hlo_attribute(2), [1, 1, 1, 1, 1, 1], mean=1.0,
                                           finite=2))  # more counts than buckets
    metrics[HLO].append(distribution_entry(hlo_attribute(3), [1, -1, 0, 0], mean=1.0))
    bad_growth = distribution_entry(hlo_attribute(4), [0, 1, 0, 0], mean=1.0, growth=1.0)
    metrics[HLO].append(bad_growth)
    metrics[DCN].append(distribution_entry(buffer_attribute("8MiB"), [0, 1, 0], mean=1.0))
    server = runtime_servers(metrics)
    server.runtime.supported = [*METRICS, BW, QUEUE, HLO, DCN]
    src = source(server.port)
    reading = src.poll()
    assert src.malformed_total == 7  # the DCN entry of other buckets cannot be added
    fam = by_family(reading)
    assert set(fam["tpumon_hbm_bandwidth_utilization_ratio"]) == {("0",), ("1",)}
    assert fam["tpumon_dcn_transfer_latency_seconds"][("8MiB",)].histogram.count == 8


def test_every_catalogue_metric_has_a_unit_suffix_and_a_tpu_info_name():
    from tpu_info.metrics import LIBTPU_METRIC_MAP
    for spec in CATALOG:
        assert spec.family.startswith("tpumon_")
        assert LIBTPU_METRIC_MAP[spec.short] == spec.runtime_name
        assert spec.family.endswith(("_bytes", "_seconds", "_ratio", "_per_second", "_size"))


def test_histogram_quantiles_interpolate_within_the_bucket():
    h = Distribution((1.0, 2.0, 4.0), (0, 2, 2, 0), 6.0)
    assert h.quantile(0.5) == pytest.approx(2.0)
    assert h.quantile(0.75) == pytest.approx(3.0)
    assert Distribution((1.0,), (0, 0), 0.0).quantile(0.5) is None
    assert Distribution((1.0,), (0, 3), 9.0).quantile(0.99) == 1.0  # overflow: its lower bound


def test_exported_buckets_span_the_used_range_only_with_cumulative_counts():
    from prometheus_client import CollectorRegistry, generate_latest
    from tpumon.metrics.runtime_families import RuntimeMetricsCollector
    from tpumon.common.identity import Identity
    from tpumon.common.samples import RuntimeReading, RuntimeSeries
    from tpumon.state import PollState
    h = Distribution(tuple(2.0 ** i for i in range(10)), (0, 0, 0, 3, 0, 5, 0, 0, 0, 0, 0), 40.0)
    empty = Distribution(h.bounds, (0,) * 11, 0.0)
    series = (RuntimeSeries("tpumon_dcn_transfer_latency_seconds", ("8MiB",), histogram=h),
              RuntimeSeries("tpumon_dcn_transfer_latency_seconds", ("1KiB",), histogram=empty))
    snap = PollState(0.0, Identity("h", "0", "v4-8", "s"), inventory_for("v4", 1),
                    runtime=RuntimeReading(0.0, {}, (), series, (DCN, *METRICS)))
    registry = CollectorRegistry()
    registry.register(RuntimeMetricsCollector(lambda: snap))
    text = generate_latest(registry).decode()
    [family] = [f for f in text_string_to_metric_families(text)
                if f.name == "tpumon_dcn_transfer_latency_seconds"]

    def samples(size, suffix):
        return [(s.labels.get("le"), s.value) for s in family.samples
                if s.labels["buffer_size"] == size and s.name.endswith(suffix)]
    # below the first used bucket (0 so far), each bucket up to the last used one, +Inf
    assert samples("8MiB", "_bucket") == [("4.0", 0), ("8.0", 3), ("16.0", 3), ("32.0", 8),
                                          ("+Inf", 8)]
    assert samples("8MiB", "_count") == [(None, 8)] and samples("8MiB", "_sum") == [(None, 40)]
    assert samples("1KiB", "_bucket") == [("+Inf", 0)]
    assert 'runtime_metric="' + DCN + '"' in text


def test_linear_explicit_and_unknown_bucket_layouts():
    from tpu_info.proto import tpu_metric_service_pb2 as pb
    from tpumon.sources.runtime_catalog import BY_RUNTIME_NAME, histogram_of
    spec = BY_RUNTIME_NAME[HLO]  # microseconds

    def entry(counts, **options):
        opts = pb.Distribution.BucketOptions(**options)
        return pb.Metric(distribution=pb.Distribution(count=sum(counts), mean=10.0,
                                                      bucket_options=opts, bucket_counts=counts))
    linear = histogram_of(spec, entry([0, 1, 2, 1], linear_buckets=pb.Distribution.BucketOptions
                                      .Linear(num_finite_buckets=2, width=5.0, offset=10.0)))
    assert linear.bounds == pytest.approx((10e-6, 15e-6, 20e-6)) and linear.count == 4
    explicit = histogram_of(spec, entry([1, 1], explicit_buckets=pb.Distribution.BucketOptions
                                        .Explicit(bounds=[100.0])))
    assert explicit.bounds == pytest.approx((1e-4,)) and explicit.sum == pytest.approx(20e-6)
    falling = entry([1, 1, 1], explicit_buckets=pb.Distribution.BucketOptions.Explicit(
        bounds=[100.0, 50.0]))
    no_growth = entry([1, 1, 1], exponential_buckets=pb.Distribution.BucketOptions
                      .Exponential(num_finite_buckets=1, growth_factor=0.0, scale=1.0))
    regular = entry([1], regular_buckets=pb.Distribution.BucketOptions.Regular(
        num_finite_buckets=1))
    too_many = entry([1], exponential_buckets=pb.Distribution.BucketOptions.Exponential(
        num_finite_buckets=10**6, growth_factor=2.0, scale=1.0))
    for bad in (falling, no_growth, regular, too_many):
        assert histogram_of(spec, bad) is None


def test_a_failure_keeps_that_metrics_last_values_and_the_rest_are_read(runtime_servers):
    server = runtime_servers(full_metrics())
    server.runtime.supported = [*METRICS, BW, QUEUE, HLO, DCN]
    src = source(server.port)
    first = by_family(src.poll())

    def fail_queue(request):
        if request.metric_name == QUEUE:
            raise RuntimeError("runtime hiccup")
    server.runtime.hook = fail_queue
    server.runtime.metrics[BW] = [gauge_entry(device_attribute(d), 90.0) for d in (0, 1)]
    second = by_family(src.poll())
    assert src.malformed_total == 0
    assert second["tpumon_hlo_queue_size"] == first["tpumon_hlo_queue_size"]  # last values
    # asked in the same round as the failing call, and read: the round's calls run at once
    assert second["tpumon_hbm_bandwidth_utilization_ratio"][("0",)].value == pytest.approx(0.9)
    server.runtime.hook = None
    server.runtime.metrics[QUEUE] = [gauge_entry(hlo_attribute(d), 7) for d in (0, 1)]
    third = by_family(src.poll())
    assert {series.value for series in third["tpumon_hlo_queue_size"].values()} == {7}
