"""deploy/ as an operator meets it: install.sh --uninstall --purge leaves no user or group,
the shipped web-config example passes promtool and tpumon, and the unit verifies the way
docs/deploy.md says to verify it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tools import require_tool
from tpumon.web.webconfig.live import load_web_config

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "deploy/install.sh"
EXAMPLE = ROOT / "deploy/web-config.example.yml"


def test_uninstall_purge_removes_the_user_and_group(tmp_path):
    """--purge left the tpumon user and group behind."""
    require_tool("systemd-sysusers")
    require_tool("userdel")
    root = tmp_path / "root"
    sysusers = root / "usr/lib/sysusers.d/tpumon.conf"
    sysusers.parent.mkdir(parents=True)
    (root / "etc").mkdir()
    sysusers.write_text('u tpumon - "tpumon agent" /var/lib/tpumon\n')
    subprocess.run(["systemd-sysusers", f"--root={root}", str(sysusers)], check=True,
                   capture_output=True)
    assert "tpumon:" in (root / "etc/passwd").read_text()
    kept = subprocess.run(["bash", str(INSTALL), "--root", str(root), "--uninstall"],
                          capture_output=True, text=True, timeout=60)
    assert kept.returncode == 0, kept.stderr
    assert "tpumon:" in (root / "etc/passwd").read_text()  # without --purge: kept
    purged = subprocess.run(["bash", str(INSTALL), "--root", str(root), "--uninstall",
                             "--purge"], capture_output=True, text=True, timeout=60)
    assert purged.returncode == 0, purged.stderr
    for name in ("passwd", "group", "shadow", "gshadow"):
        path = root / "etc" / name
        assert not path.exists() or not any(line.startswith("tpumon:") for line in
                                            path.read_text().splitlines()), name


def test_the_web_config_example_passes_promtool_and_tpumon(tmp_path):
    promtool = require_tool("promtool")
    require_tool("openssl")
    (tmp_path / "tls").mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", "/CN=tpumon",
                    "-keyout", str(tmp_path / "tls/tpumon.key"),
                    "-out", str(tmp_path / "tls/tpumon.crt")], check=True, capture_output=True)
    web = tmp_path / "web.yml"
    shutil.copy(EXAMPLE, web)
    checked = subprocess.run([promtool, "check", "web-config", str(web)], capture_output=True,
                             text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = load_web_config(str(web))
    assert config is not None


def test_the_documented_unit_verification_works(tmp_path):
    """`systemd-analyze verify deploy/systemd/tpumon.service` fails on a checkout (the
    executable is installed by install.sh); docs/deploy.md gives the command that works."""
    analyze = require_tool("systemd-analyze")
    docs = (ROOT / "docs/deploy.md").read_text()
    assert "systemd-analyze verify /etc/systemd/system/tpumon.service" in docs
    assert "sed 's|/opt/tpumon/venv/bin/tpumon|" in docs
    tpumon = shutil.which("tpumon", path=str(Path(sys.executable).parent))
    unit = tmp_path / "tpumon.service"
    unit.write_text((ROOT / "deploy/systemd/tpumon.service").read_text().replace(
        "/opt/tpumon/venv/bin/tpumon", tpumon))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
