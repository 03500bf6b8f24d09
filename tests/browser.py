"""A headless Chromium driven over the DevTools protocol: load a page at a given width,
and say what a person would see go wrong (console errors, images that do not load,
links that do not resolve, content wider than the screen), with a screenshot."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import websocket

CHECKS = """(() => {
  const doc = document.documentElement;
  return JSON.stringify({
    width: window.innerWidth, scrollWidth: doc.scrollWidth,
    images: [...document.images].map(i => ({src: i.src.slice(0, 60), ok: i.complete &&
      i.naturalWidth > 0, shown: i.getBoundingClientRect().width})),
    links: [...document.links].map(a => a.href),
    styled: getComputedStyle(document.body).fontFamily,
    // elements a person must scroll sideways: what they hold and how much wider it is
    sideways: [...document.querySelectorAll("*")].filter(e =>
      ["auto", "scroll"].includes(getComputedStyle(e).overflowX) &&
      e.scrollWidth > e.clientWidth).map(e => ({
        holds: (e.firstElementChild || e).tagName.toLowerCase() + "." +
               ((e.firstElementChild || e).className || ""),
        by: e.scrollWidth - e.clientWidth})),
    // each row of the chips table (a card, on a phone): its height, its right edge and
    // how it is laid out
    rows: [...document.querySelectorAll("table.summary tr")].slice(1).map(r => ({
      height: Math.round(r.getBoundingClientRect().height),
      right: Math.round(r.getBoundingClientRect().right),
      display: getComputedStyle(r).display})),
    text: document.body.innerText,
  });
})()"""


@dataclass
class PageView:
    url: str
    width: int
    scroll_width: int
    images: list[dict]
    links: list[str]
    text: str
    sideways: list[dict] = field(default_factory=list)  # elements that scroll sideways
    rows: list[dict] = field(default_factory=list)  # the chips table's rows: height, right
    errors: list[str] = field(default_factory=list)


class Chromium:
    """One headless browser for a test module; each load() is a fresh tab."""

    def __init__(self) -> None:
        binary = shutil.which("chromium")
        if binary is None:
            pytest.skip("chromium not installed (scripts/ensure-system-deps test installs it)")
        self.profile = tempfile.mkdtemp(prefix="tpumon-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise AssertionError("chromium did not start")
            time.sleep(0.1)
        self.port = int(port_file.read_text().split()[0])
        self._id = 0

    def load(self, url: str, width: int, screenshot: Path) -> PageView:
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{self.port}/json/new?about:blank", method="PUT")) as r:
            target = json.loads(r.read())
        ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=60)
        errors: list[str] = []
        try:
            for method in ("Page.enable", "Runtime.enable", "Log.enable"):
                self._call(ws, method, errors)
            self._call(ws, "Emulation.setDeviceMetricsOverride", errors, width=width,
                       height=900, deviceScaleFactor=1, mobile=width < 600)
            self._call(ws, "Page.navigate", errors, url=url)
            self._wait(ws, "Page.loadEventFired", errors)
            found = json.loads(self._call(ws, "Runtime.evaluate", errors, expression=CHECKS,
                                          returnByValue=True)["result"]["value"])
            shot = self._call(ws, "Page.captureScreenshot", errors, format="png",
                              captureBeyondViewport=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        finally:
            ws.close()
        return PageView(url, found["width"], found["scrollWidth"], found["images"],
                        found["links"], found["text"], found["sideways"], found["rows"],
                        errors)

    def _call(self, ws: websocket.WebSocket, method: str, errors: list[str], **params) -> dict:
        self._id += 1
        ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._note(message, errors)

    def _wait(self, ws: websocket.WebSocket, event: str, errors: list[str]) -> None:
        while True:
            message = json.loads(ws.recv())
            self._note(message, errors)
            if message.get("method") == event:
                return

    @staticmethod
    def _note(message: dict, errors: list[str]) -> None:
        """Console errors, uncaught exceptions and failed loads, as one line each."""
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append(params["exceptionDetails"].get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(" ".join(str(a.get("value", a.get("description")))
                                   for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            errors.append(re.sub(r"\s+", " ", params["entry"]["text"]))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
