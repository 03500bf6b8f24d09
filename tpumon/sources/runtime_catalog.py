"""What libtpu's runtime metrics mean: their tpumon names, units and keys, and how an entry
of a response becomes a series.

One table (:data:`CATALOG`) maps each runtime metric tpumon knows beyond HBM usage, total
and duty cycle (read by :mod:`tpumon.sources.tpu_runtime` itself) to a stable tpumon family
with its unit in the name, the factor to that base unit, and how its entries are keyed: by
device id (``device``), by ``device_ordinal`` and ``core_type`` in a key-value attribute
(``hlo``, as tpu-info reads the HLO metrics), or by the transfer's ``buffer-size`` (the
megascale/DCN distributions). The names are tpu-info 0.14.2's (``tpu_info.metrics``).

Parsing never raises: an entry that cannot be read (no key, wrong measure, NaN, buckets
that do not fit their options) is counted by the caller as malformed.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from tpumon.sources.runtime_names import MetricName
from tpu_info.proto import tpu_metric_service_pb2 as pb

from tpumon.common.samples import Distribution

MAX_BUCKETS = 128  # finite buckets per distribution: bounds cardinality, whatever is sent
MAX_LABEL = 64  # characters of a label value taken from the runtime (buffer size, core type)
_DIGITS = re.compile(r"[0-9]{1,18}")

KEY_LABELS = {"device": ("chip",), "hlo": ("chip", "core_type"), "buffer": ("buffer_size",)}


@dataclass(frozen=True)
class MetricSpec:
    """One runtime metric as tpumon exports it."""

    runtime_name: str
    family: str  # tpumon's metric family name (histograms: without _bucket/_sum/_count)
    kind: str  # "gauge" or "histogram"
    key: str  # "device", "hlo" or "buffer": see KEY_LABELS
    scale: float  # runtime unit -> the family's base unit
    short: str  # tpu-info's --metric name
    doc: str

    @property
    def labels(self) -> tuple[str, ...]:
        return KEY_LABELS[self.key]


US = 1e-6  # microseconds -> seconds
MBPS = 1e6 / 8  # megabits per second -> bytes per second


def _megascale(name: MetricName, family: str, short: str, what: str,
               scale: float = US) -> MetricSpec:
    return MetricSpec(name.value, family, "histogram", "buffer", scale, short,
                      f"{what} (megascale, cumulative; by transfer buffer size).")


CATALOG: tuple[MetricSpec, ...] = (
    MetricSpec(MetricName.HBM_BW_UTIL.value, "tpumon_hbm_bandwidth_utilization_ratio", "gauge",
               "device", 0.01, "runtime_hbm_utilization",
               "Fraction of the chip's HBM bandwidth in use (0-1)."),
    MetricSpec(MetricName.TENSORCORE_IDLE_DURATION.value, "tpumon_tensorcore_idle_seconds",
               "gauge", "device", 1.0, "tensorcore_idle_duration",
               "How long the TensorCore has been idle, as the runtime reports it."),
    MetricSpec(MetricName.HLO_QUEUE_SIZE.value, "tpumon_hlo_queue_size", "gauge", "hlo", 1.0,
               "hlo_queue_size", "Programs (HLO executions) queued on the core."),
    MetricSpec(MetricName.HLO_EXECUTION_TIMING_DISTRIBUTION_MICROSECONDS.value,
               "tpumon_hlo_execution_seconds", "histogram", "hlo", US, "hlo_exec_timing",
               "Duration of HLO program executions on the core (cumulative)."),
    _megascale(MetricName.BUFFER_TRANSFER_LATENCY_US, "tpumon_dcn_transfer_latency_seconds",
               "buffer_transfer_latency", "Latency of outbound DCN buffer transfers"),
    _megascale(MetricName.INBOUND_BUFFER_TRANSFER_LATENCY_US,
               "tpumon_dcn_inbound_transfer_latency_seconds",
               "inbound_buffer_transfer_latency", "Latency of inbound DCN buffer transfers"),
    _megascale(MetricName.HOST_TO_DEVICE_TRANSFER_LATENCY_US,
               "tpumon_host_to_device_transfer_latency_seconds",
               "host_to_device_transfer_latency", "Latency of host-to-device transfers"),
    _megascale(MetricName.DEVICE_TO_HOST_TRANSFER_LATENCY_US,
               "tpumon_device_to_host_transfer_latency_seconds",
               "device_to_host_transfer_latency", "Latency of device-to-host transfers"),
    _megascale(MetricName.COLLECTIVE_E2E_LATENCY_US,
               "tpumon_collective_end_to_end_latency_seconds", "collective_e2e_latency",
               "End-to-end latency of cross-slice collectives"),
    _megascale(MetricName.HOST_COMPUTE_LATENCY_US, "tpumon_host_compute_latency_seconds",
               "host_compute_latency", "Latency of host-side (MXLA) compute"),
    _megascale(MetricName.GRPC_TCP_MIN_RTT_US, "tpumon_dcn_tcp_min_rtt_seconds",
               "grpc_tcp_min_rtt", "Minimum TCP round-trip time of the DCN gRPC connections"),
    _megascale(MetricName.GRPC_TCP_DELIVERY_RATE_MBPS,
               "tpumon_dcn_tcp_delivery_rate_bytes_per_second", "grpc_tcp_delivery_rate",
               "TCP delivery rate of the DCN gRPC connections", scale=MBPS),
)
BY_RUNTIME_NAME = {spec.runtime_name: spec for spec in CATALOG}
BY_SHORT_NAME = {spec.short: spec for spec in CATALOG}


@dataclass(frozen=True, slots=True)
class EntryKey:
    """Where an entry belongs: a device (id and core type) or a transfer buffer size."""

    device_id: int | None
    core_type: str = ""
    buffer_size: str = ""


def entry_key(spec: MetricSpec, metric: pb.Metric) -> EntryKey | None:
    """The entry's key as the spec says it is keyed; None if it has none."""
    value = metric.attribute.value
    if spec.key == "device":
        return _device_key(value)
    attrs = {a.key: a.value for a in value.kvlist_attr.attributes}
    if spec.key == "hlo":
        ordinal = attrs.get("device_ordinal")
        key = None if ordinal is None else _device_key(ordinal)
        if key is None:
            return None
        core = attrs.get("core_type")
        return EntryKey(key.device_id, _text(core) if core is not None else "")
    size = attrs.get("buffer-size")
    if size is None and value.kvlist_attr.attributes:  # tpu-info takes the first attribute
        size = value.kvlist_attr.attributes[0].value
    return EntryKey(None, buffer_size=_text(size) if size is not None else "")


def _device_key(value: pb.AttrValue) -> EntryKey | None:
    kind = value.WhichOneof("attr")
    if kind == "int_attr" and value.int_attr >= 0:
        return EntryKey(value.int_attr)
    if kind == "string_attr" and _DIGITS.fullmatch(value.string_attr):
        return EntryKey(int(value.string_attr))
    return None


def _text(value: pb.AttrValue) -> str:
    kind = value.WhichOneof("attr")
    raw = str(getattr(value, kind)) if kind in ("string_attr", "int_attr", "double_attr",
                                                  "bool_attr") else ""
    return "".join(c for c in raw[:MAX_LABEL] if c.isprintable())


def gauge_value(spec: MetricSpec, metric: pb.Metric) -> float | None:
    """The entry's gauge (or counter) in the base unit; None if absent or not finite."""
    measure = metric.WhichOneof("measure")
    if measure not in ("gauge", "counter"):
        return None
    holder = getattr(metric, measure)
    which = holder.WhichOneof("value")
    if which not in ("as_int", "as_double"):
        return None
    value = float(getattr(holder, which)) * spec.scale
    return value if math.isfinite(value) and value >= 0 else None


def histogram_of(spec: MetricSpec, metric: pb.Metric) -> Distribution | None:
    """The entry's distribution with its bucket bounds in the base unit; None if it has no
    distribution or one whose buckets cannot be laid out (unknown options, too many
    buckets, negative counts, more counts than buckets)."""
    if metric.WhichOneof("measure") != "distribution":
        return None
    dist = metric.distribution
    bounds = _bounds(dist.bucket_options)
    counts = list(dist.bucket_counts)
    if bounds is None or len(counts) > len(bounds) + 1 or min(counts, default=0) < 0:
        return None
    counts += [0] * (len(bounds) + 1 - len(counts))
    if not counts[:-1] and dist.count:  # no buckets at all: the count is all there is
        counts = [dist.count]
    total = sum(counts) * dist.mean * spec.scale
    if not math.isfinite(total):
        return None
    return Distribution(_scaled(tuple(bounds), spec.scale), tuple(counts), total)


@functools.lru_cache(maxsize=64)
def _scaled(bounds: tuple[float, ...], scale: float) -> tuple[float, ...]:
    """Bounds in the base unit; cached, as each slow round brings every distribution's
    bounds again, unchanged (~20 distributions of ~36 buckets in the simulator)."""
    return tuple(b * scale for b in bounds)


def _bounds(options: pb.Distribution.BucketOptions) -> list[float] | None:
    """Upper bounds of the finite buckets (bucket 0 is the underflow bucket below the first
    bound, as in Google's Distribution); None when they cannot be laid out."""
    kind = options.WhichOneof("options")
    if kind == "exponential_buckets":
        e = options.exponential_buckets
        return _laid_out(e.num_finite_buckets, 0.0, e.scale, e.growth_factor, True)
    if kind == "linear_buckets":
        lin = options.linear_buckets
        return _laid_out(lin.num_finite_buckets, lin.offset, lin.width, 1.0, False)
    if kind == "explicit_buckets":
        bounds = list(options.explicit_buckets.bounds)
        rising = all(a < b for a, b in zip(bounds, bounds[1:], strict=False))
        finite = all(math.isfinite(b) for b in bounds)
        return bounds if rising and finite and len(bounds) <= MAX_BUCKETS + 1 else None
    return [] if kind is None else None  # none: one bucket; "regular": not laid out here


@functools.lru_cache(maxsize=64)
def _laid_out(n: int, offset: float, step: float, growth: float,
              exponential: bool) -> list[float] | None:
    """Exponential (step * growth**i) or linear (offset + step * i) bounds, i = 0..n;
    cached, as every entry of a metric repeats its options (callers leave it unchanged)."""
    if not 0 <= n <= MAX_BUCKETS or not step > 0 or (exponential and not growth > 1):
        return None
    bounds = [step * growth ** i if exponential else offset + step * i for i in range(n + 1)]
    return bounds if all(math.isfinite(b) for b in bounds) else None


def find_spec(name: str) -> MetricSpec | None:
    """The catalogue entry for tpu-info's name, tpumon's family name or the runtime's name."""
    return BY_SHORT_NAME.get(name) or BY_RUNTIME_NAME.get(name) or next(
        (spec for spec in CATALOG if spec.family == name), None)
