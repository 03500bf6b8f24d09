"""Entries of runtime metric responses as libtpu shapes them, for the simulator and tests.

Gauges keyed by device id (HBM, duty cycle, bandwidth, idle time); HLO metrics keyed by a
key-value list with ``device_ordinal`` and ``core_type``; megascale distributions keyed by
``buffer-size``; distributions with exponential buckets (bucket 0 below ``scale``, bucket i
up to ``scale * growth**i``, the last one above all), as Google's Distribution message.
"""

from __future__ import annotations

from typing import Sequence

from tpu_info.proto import tpu_metric_service_pb2 as pb


def device_attribute(device_id: int) -> pb.Attribute:
    return pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=device_id))


def hlo_attribute(device_id: int, core_type: str = "TPU_CORE_TYPE_TENSOR_CORE") -> pb.Attribute:
    """The key-value attribute tpu-info reads the HLO metrics' device from."""
    kv = pb.KeyValueList(attributes=[
        pb.Attribute(key="device_ordinal", value=pb.AttrValue(string_attr=str(device_id))),
        pb.Attribute(key="core_type", value=pb.AttrValue(string_attr=core_type))])
    return pb.Attribute(key="hlo", value=pb.AttrValue(kvlist_attr=kv))


def buffer_attribute(size: str) -> pb.Attribute:
    kv = pb.KeyValueList(attributes=[
        pb.Attribute(key="buffer-size", value=pb.AttrValue(string_attr=size))])
    return pb.Attribute(key="megascale", value=pb.AttrValue(kvlist_attr=kv))


def gauge_entry(attribute: pb.Attribute, value: int | float,
                timestamp: float | None = None) -> pb.Metric:
    """A gauge entry (as_int for an int, as_double otherwise), stamped if asked."""
    gauge = pb.Gauge(as_int=value) if isinstance(value, int) else pb.Gauge(as_double=value)
    metric = pb.Metric(attribute=attribute, gauge=gauge)
    if timestamp is not None:
        metric.timestamp.FromNanoseconds(int(timestamp * 1e9))
    return metric


def distribution_entry(attribute: pb.Attribute, counts: Sequence[int], mean: float,
                       scale: float = 1.0, growth: float = 2.0,
                       finite: int | None = None) -> pb.Metric:
    """A cumulative distribution with exponential buckets; ``finite`` defaults to
    len(counts) - 2 (underflow and overflow around them)."""
    options = pb.Distribution.BucketOptions(exponential_buckets=pb.Distribution.BucketOptions
                                            .Exponential(num_finite_buckets=max(
                                                len(counts) - 2, 0) if finite is None
                                                else finite, growth_factor=growth,
                                                scale=scale))
    dist = pb.Distribution(count=sum(counts), mean=mean, bucket_options=options,
                           bucket_counts=list(counts))
    return pb.Metric(attribute=attribute, distribution=dist)
