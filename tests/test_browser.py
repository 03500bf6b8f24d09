"""The agent's web pages as a person sees them: headless Chromium loads each page from a
running agent (make demo's leak, 4x faster) at 1280 and 390 px wide (a desk, a phone at
3 a.m.): no console errors, every image loads, every link resolves, nothing runs off the
right edge, plots stay readable. Screenshots are kept under pytest's tmp dir."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request

import numpy as np
import pytest

from browser import Chromium
from tools import TPUMON, AgentProcess, clean_env, wait_for

pytestmark = pytest.mark.e2e  # real agents (and a browser): seconds each

DEMO = ("--scenario", "fast-leak", "--acceleration", "240", "--poll-interval", "0.0625")
PAGES = ("/", "/report")
WIDTHS = (1280, 390)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent")
    a = AgentProcess(tmp, tmp / "state", *DEMO)
    try:
        wait_for(lambda: all(c["verdict"] == "leak" for c in
                             json.loads(a.get("/api/status"))["chips"]), 120, 0.5)
        yield a
    finally:
        a.stop()


@pytest.fixture(scope="module")
def chromium():
    browser = Chromium()
    yield browser
    browser.close()


def resolves(url: str) -> bool:
    if url.startswith(("data:", "mailto:")):
        return True
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("path", PAGES)
def test_page_in_a_browser(agent, chromium, tmp_path, path, width):
    shot = tmp_path / f"{path.strip('/') or 'index'}-{width}.png"
    view = chromium.load(f"http://{agent.url}{path}", width, shot)
    assert shot.stat().st_size > 1000  # kept as the test's artifact
    assert view.errors == [], view.errors
    assert view.scroll_width <= view.width, \
        f"{path} is {view.scroll_width} px wide on a {view.width} px screen ({shot})"
    for image in view.images:
        assert image["ok"], image
        assert image["shown"] >= min(width - 40, 600), (image, shot)  # readable, not shrunk
    local = {link for link in view.links
             if urllib.parse.urlsplit(link).netloc in ("", agent.url)}
    for link in local:
        assert resolves(link), link
    assert "=?" not in view.text, view.text[:300]  # identity labels nobody knows
    # nothing scrolls sideways inside the page either (a scrollbar ran under the plot at
    # 1280 px; at 390 the chips table scrolled), but the plot on a phone, kept readable
    inside = [s for s in view.sideways if not (width < 760 and s["holds"].startswith("img"))]
    assert inside == [], f"{path} at {width} px: {inside} ({shot})"


def test_index_and_report_say_the_same_size(agent, chromium, tmp_path):
    """The report said HBM per chip 34.09 GB where the index said 31.75 GiB."""
    index = chromium.load(f"http://{agent.url}/", 1280, tmp_path / "index.png").text
    report = chromium.load(f"http://{agent.url}/report", 1280, tmp_path / "report.png").text
    assert "31.75 GiB" in index and "31.75 GiB" in report


def test_the_report_names_the_worker_the_index_does(agent, chromium, tmp_path):
    """The single-host report said "Worker: -" where every other view said worker 0."""
    index = chromium.load(f"http://{agent.url}/", 1280, tmp_path / "index.png").text
    report = chromium.load(f"http://{agent.url}/report", 1280, tmp_path / "report.png").text
    worker = re.search(r"worker=([^,\s]+)", index)
    assert worker is not None, index[:300]
    assert re.search(rf"^Worker\s+{re.escape(worker.group(1))}$", report, re.M), report[:600]
    # and `tpumon report` of the agent's store by hand: the agent noted its worker there
    out = tmp_path / "by-hand"
    made = subprocess.run([*TPUMON, "report", "--state-dir", str(agent.state_dir), "-o",
                           str(out)], capture_output=True, text=True, env=clean_env(),
                          timeout=120)
    assert made.returncode == 0, made.stderr
    [page] = out.glob("*.html")
    assert f"<th>Worker</th><td>{worker.group(1)}</td>" in page.read_text()


def test_the_report_on_a_phone_shows_each_chip_as_a_card(agent, chromium, tmp_path):
    """At 390 px the chips table is cards, each cell named, none wider than the screen."""
    view = chromium.load(f"http://{agent.url}/report", 390, tmp_path / "report-390.png")
    assert len(view.rows) == 4, view.rows
    for row in view.rows:
        assert row["display"] == "block" and row["right"] <= view.width, (row, view.width)
    assert [s for s in view.sideways if not s["holds"].startswith("img")] == []


def test_the_report_page_draws_the_raw_sample_band(agent):
    """/report's picture (make demo's leak) draws the band of raw samples along the floor,
    as its legend and "How to read the picture" say: it drew the floor alone."""
    import base64

    from test_report import colour_columns
    from tpumon.report.render import FLOOR, RAW

    page = agent.get("/report", timeout=120)
    png = base64.b64decode(re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1))
    floor, band = colour_columns(png, FLOOR), colour_columns(png, RAW)
    data = np.flatnonzero(floor)
    inside = band[data.min():data.max() + 1]
    assert inside.mean() > 0.9, f"band in {inside.mean():.0%} of the floor's columns"
