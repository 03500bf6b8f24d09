"""The agent's run, from a configuration to SIGTERM: the HTTP endpoint bound first, the
agent assembled (``bootstrap.build``), polls until told to stop, SIGHUP's reloads applied
between polls, systemd told how it goes; then everything stopped in reverse."""

from __future__ import annotations

import logging
import threading
from typing import Callable

from tpumon import __version__
from tpumon.agent.bootstrap import build
from tpumon.agent.reload import reload_config
from tpumon.agent.systemd import SystemdNotify
from tpumon.common.config import Config
from tpumon.state import PollState
from tpumon.web.http import MetricsServer
from tpumon.web.report_page import ReportPage

log = logging.getLogger("tpumon.agent")


def run_agent(config: Config, simulate: bool, stop: threading.Event,
              reload: threading.Event | None = None,
              load: Callable[[], Config] | None = None) -> None:
    """Bind the exporter first (a port clash fails before a simulator starts), then poll.
    When ``reload`` is set (SIGHUP), the configuration is read again with ``load`` after
    the poll in progress, and what can change while running is applied (tpumon.agent.reload)."""
    server = MetricsServer(config["exporter.listen_address"], config["exporter.web_config_file"])
    host, port = server.start()
    try:
        assembly = build(config, simulate=simulate)
    except BaseException:
        server.stop()
        raise
    try:
        report = None if assembly.store is None else \
            ReportPage(assembly.store.state_dir, assembly.identity.host,
                       worker=assembly.identity.worker)
        server.attach(assembly.registry, lambda: assembly.state.current, report,
                      None if assembly.reporters is None else
                      assembly.reporters.request_snapshot, assembly.readers())
        shown = f"[{host}]" if ":" in host else host
        labels = ", ".join(f"{k}={v or '?'}" for k, v in assembly.identity.labels().items())
        secured = f"; {server.describe()}" if server.describe() else ""
        log.info("tpumon %s serving metrics on %s://%s:%d/metrics (%s%s)", __version__,
                 server.scheme, shown, port, labels, secured)
        systemd = SystemdNotify(store=assembly.readers().store)
        running = [config]

        def after_poll(snap: PollState) -> None:
            systemd.after_poll(snap)
            if reload is not None and load is not None and reload.is_set():
                reload.clear()
                running[0] = reload_config(assembly, running[0], load)

        assembly.agent.run(stop, after_poll=after_poll)
        log.info("stopping")
        systemd.stopping()
    finally:
        server.stop()
        assembly.close()
