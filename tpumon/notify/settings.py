"""The [alerts] thresholds, in a module of their own: the alert trackers hold them (a
SIGHUP reload changes them) and the metrics read them from there, so the exported
thresholds the Prometheus rules compare against are the ones the agent pages on."""

from __future__ import annotations

from dataclasses import dataclass

from tpumon.common.config import Config


@dataclass(frozen=True)
class AlertSettings:
    """Thresholds from the [alerts] configuration section."""

    oom_horizon_seconds: float = 6 * 3600.0
    hbm_used_ratio_threshold: float = 0.95
    training_stall_seconds: float = 600.0
    resolve_after_seconds: float = 600.0
    dashboard_url: str = ""
    report_url: str = ""
    wait_for_snapshots: bool = True  # reporter.snapshot_on_leak: a leak alert waits for them

    @classmethod
    def from_config(cls, config: Config) -> "AlertSettings":
        return cls(oom_horizon_seconds=config["alerts.oom_horizon_hours"] * 3600,
                   hbm_used_ratio_threshold=config["alerts.hbm_used_ratio_threshold"],
                   training_stall_seconds=config["alerts.training_stall_minutes"] * 60,
                   resolve_after_seconds=config["alerts.resolve_after_minutes"] * 60,
                   dashboard_url=config["alerts.dashboard_url"],
                   report_url=config["alerts.report_url"],
                   wait_for_snapshots=config["reporter.snapshot_on_leak"])
