"""tpumon's copy of the runtime's metric names is tpu-info's (tpu_info.metrics imports
grpcio, so the agent cannot import it for them)."""

from tpu_info import metrics as tpu_info_metrics
from tpu_info.proto import tpu_metric_service_pb2 as pb

from tpumon.sources import runtime_names


def test_every_name_is_tpu_infos():
    theirs = {m.name: m.value for m in tpu_info_metrics.MetricName}
    ours = {m.name: m.value for m in runtime_names.MetricName}
    assert ours == theirs


def test_the_method_paths_are_the_services_own():
    service = pb.DESCRIPTOR.services_by_name["RuntimeMetricService"]
    assert runtime_names.SERVICE == service.full_name
    for path, method in ((runtime_names.GET_RUNTIME_METRIC, "GetRuntimeMetric"),
                         (runtime_names.LIST_SUPPORTED_METRICS, "ListSupportedMetrics")):
        assert path == f"/{service.full_name}/{service.methods_by_name[method].name}"
