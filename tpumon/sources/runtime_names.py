"""The runtime metric service's metric names, as tpu-info 0.14.2 spells them
(``tpu_info.metrics.MetricName``; ``tests/test_runtime_names.py`` holds them equal).

A copy rather than an import: ``tpu_info.metrics`` imports grpcio, urllib and
prometheus_client's parser at import time, ~17 MiB of RSS the agent has no other use for
(it talks to the runtime through :mod:`tpumon.sources.grpc_unary`)."""

from __future__ import annotations

import enum

SERVICE = "tpu.monitoring.runtime.RuntimeMetricService"
GET_RUNTIME_METRIC = f"/{SERVICE}/GetRuntimeMetric"
LIST_SUPPORTED_METRICS = f"/{SERVICE}/ListSupportedMetrics"


class MetricName(enum.Enum):
    """Metric names defined in libtpu."""

    TOTAL_MEMORY = "tpu.runtime.hbm.memory.total.bytes"
    MEMORY_USAGE = "tpu.runtime.hbm.memory.usage.bytes"
    DUTY_CYCLE_PCT = "tpu.runtime.tensorcore.dutycycle.percent"
    BUFFER_TRANSFER_LATENCY_US = \
        "megascale.dcn_transfer_latencies.microsecond.cumulative.distribution"
    INBOUND_BUFFER_TRANSFER_LATENCY_US = \
        "megascale.dcn_inbound_transfer_latencies.microsecond.cumulative.distribution"
    HOST_TO_DEVICE_TRANSFER_LATENCY_US = \
        "megascale.host_to_device_transfer_latencies.microsecond.cumulative.distribution"
    DEVICE_TO_HOST_TRANSFER_LATENCY_US = \
        "megascale.device_to_host_transfer_latencies.microsecond.cumulative.distribution"
    COLLECTIVE_E2E_LATENCY_US = \
        "megascale.collective_end_to_end_latencies.microsecond.cumulative.distribution"
    HOST_COMPUTE_LATENCY_US = \
        "megascale.mxla_compute_latencies.microsecond.cumulative.distribution"
    GRPC_TCP_MIN_RTT_US = "megascale.grpc_tcp_min_rtt.microsecond.cumulative.distribution"
    GRPC_TCP_DELIVERY_RATE_MBPS = \
        "megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution"
    HBM_BW_UTIL = "tpu.runtime.hbm.utilization.percent"
    TENSORCORE_IDLE_DURATION = "tpu.runtime.tensorcore.idle_duration.seconds"
    HLO_QUEUE_SIZE = "hlo.queue.size.gauge"
    HLO_EXECUTION_TIMING_DISTRIBUTION_MICROSECONDS = \
        "hlo.execution.timing.distribution.microseconds"
