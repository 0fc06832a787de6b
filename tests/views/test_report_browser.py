"""The report of the session's `ci` run, opened in real headless Chromium from a file:// URL.

Chromium is driven over the DevTools protocol through ``--remote-debugging-pipe`` (file
descriptors 3 and 4, NUL-terminated JSON: no websocket library needed). Checked:

* every plotly figure div rendered (a ``.main-svg`` inside each ``.plotly-graph-div``), and the
  number of figures is the number of ``plateauscope.views.report.report_figures``;
* every CircuitsVis view rendered (its element has child elements and text);
* no request leaves the machine: every ``Network.requestWillBeSent`` URL is ``file:``, ``data:``,
  ``blob:`` or ``about:``; and no ``<script src>`` / ``<link href>`` / ``<img src>`` in the HTML
  points to ``http(s)://``;
* no console error: no ``Runtime.exceptionThrown``, no ``console.error`` / ``console.assert``
  (``Runtime.consoleAPICalled``), no error-level ``Log.entryAdded`` (failed loads, CSP, ...);
* a full-page screenshot (1400 px wide) is written under ``tmp_path`` and is a PNG.

Skipped, loudly, only when no Chromium is installed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from plateauscope.analysis.analyze import load_analysis
from plateauscope.runs.run import Run
from plateauscope.views.report import report_figures, write_report

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
RENDER_TIMEOUT_S = 60
WIDTH = 1400

PROBE_JS = """JSON.stringify({
  figures: document.querySelectorAll('.plotly-graph-div').length,
  figuresRendered: [...document.querySelectorAll('.plotly-graph-div')].filter(d => d.querySelector('.main-svg')).length,
  views: document.querySelectorAll('.cv-view').length,
  viewsRendered: [...document.querySelectorAll('.cv-view')].filter(
      d => d.querySelectorAll('*').length > 5 && d.innerText.trim().length > 0).length,
  height: Math.ceil(document.querySelector('main') ? document.querySelector('main').getBoundingClientRect().bottom
                     + window.scrollY : document.documentElement.scrollHeight),
})"""


def find_browser() -> str | None:
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    return None


class Chromium:
    """Headless Chromium with the DevTools protocol over a pipe; one page, events recorded."""

    def __init__(self, binary: str, profile: Path):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def child_fds() -> None:  # chromium reads commands on fd 3 and writes replies on fd 4
            r, w = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--no-first-run", "--disable-component-update", "--disable-sync", "--disable-extensions",
                "--disable-default-apps", "--mute-audio", "--hide-scrollbars", f"--user-data-dir={profile}",
                f"--window-size={WIDTH},3000", "--remote-debugging-pipe", "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=child_fds, pass_fds=(3, 4), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._id = 0
        self._replies: dict[int, dict] = {}
        self.events: list[dict] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.stderr: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.session: str | None = None

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line.decode(errors="replace"))

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._from_chrome, 1 << 16):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                msg = json.loads(raw)
                with self._cond:
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                    self._cond.notify_all()

    def send(self, method: str, params: dict | None = None, timeout: float = 30.0, session: bool = True) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._id not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise TimeoutError(f"no reply to {method} (chromium stderr: {''.join(self.stderr)[-2000:]})")
                self._cond.wait(min(left, 0.5))
            reply = self._replies.pop(self._id)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def open_page(self) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": WIDTH, "height": 3000, "deviceScaleFactor": 1, "mobile": False})

    def wait_event(self, method: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for e in self.events:
                    if e.get("method") == method:
                        return e
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {method} within {timeout} s")
                self._cond.wait(min(left, 0.5))

    def evaluate(self, expression: str):
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return res["result"].get("value")

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False, timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)


def problems(events: list[dict]) -> tuple[list[str], list[str]]:
    """(requests that leave the machine, console errors) among recorded DevTools events."""
    remote, errors = [], []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Network.requestWillBeSent":
            url = p["request"]["url"]
            if not url.startswith(LOCAL_SCHEMES):
                remote.append(url)
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            errors.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description")))
                                                                  for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
    return remote, errors


def render(binary: str, html_path: Path, profile: Path, screenshot: Path | None = None) -> dict:
    """Open ``html_path`` from disk, wait until everything rendered (or the timeout), probe it."""
    browser = Chromium(binary, profile)
    try:
        browser.open_page()
        browser.send("Page.navigate", {"url": html_path.resolve().as_uri()})
        browser.wait_event("Page.loadEventFired", RENDER_TIMEOUT_S)
        deadline = time.monotonic() + RENDER_TIMEOUT_S
        while True:
            probe = json.loads(browser.evaluate(PROBE_JS))
            done = probe["figures"] == probe["figuresRendered"] and probe["views"] == probe["viewsRendered"]
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        time.sleep(0.5)  # let late errors arrive
        if screenshot is not None:
            shot = browser.send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": WIDTH, "height": probe["height"], "scale": 1}}, timeout=60)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        remote, errors = problems(list(browser.events))
        return {**probe, "remote": remote, "errors": errors}
    finally:
        browser.close()


@pytest.fixture(scope="module")
def report(ci_analysed, tmp_path_factory) -> Path:
    return write_report(ci_analysed, tmp_path_factory.mktemp("report") / "report.html")


def test_report_html_loads_nothing_from_the_network(report):
    text = report.read_text(encoding="utf-8")
    tags = re.findall(r"<(?:script|link|img|iframe|source|video|audio)\b[^>]*>", text)
    remote = [t for t in tags if re.search(r"""\b(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", t)]
    assert remote == []
    assert text.count("plotly.js v") <= 2 and "Plotly.newPlot" in text  # one inlined plotly.js
    assert text.count("var CircuitsVis=") == 1  # one inlined CircuitsVis bundle


def test_report_renders_in_headless_chromium(chromium_binary, report, ci_analysed, tmp_path):
    shot = tmp_path / "report.png"
    result = render(chromium_binary, report, tmp_path / "profile", screenshot=shot)
    run = Run(ci_analysed)
    analysis = load_analysis(ci_analysed)
    n_figures = len(report_figures(run, analysis, analysis["routing"]))
    assert result["figures"] == n_figures, result
    assert result["figuresRendered"] == result["figures"], result
    assert result["views"] >= 4 and result["viewsRendered"] == result["views"], result
    assert result["remote"] == [], result["remote"]
    assert result["errors"] == [], result["errors"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
