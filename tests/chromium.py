"""Headless Chromium for the tests (Debian's package; `make chromium` installs it, `make test` does it first), driven
over the DevTools protocol (websocket-client, already installed with kfp's kubernetes client): one page, its DOM
read with `evaluate`, screenshots with `Page.captureScreenshot`. Used by the compare report's test
(tests/stages/test_compare_html.py) and the MLflow UI's (tests/pipelines/test_mlflow_layout.py).

    browser = Browser(tmp_path / "profile")
    browser.call("Page.enable"); browser.call("Page.navigate", url=url); browser.wait_event("Page.loadEventFired")
    text = browser.evaluate("document.body.innerText"); png = browser.screenshot(); browser.close()
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("PACKTRAIN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# as root, in a container without network or GPU; a fresh profile each run
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1280,1600", "--remote-debugging-port=0"]
ARTIFACTS = Path(os.environ.get("PACKTRAIN_TEST_ARTIFACTS") or Path(tempfile.gettempdir()) / "packtrain-test-artifacts")
"""Where screenshots are also copied, so they outlive pytest's temporary directories (their path is printed)."""
SKIP_REASON = (f"no Chromium at {CHROMIUM}: `make chromium` installs Debian's package (apt-get install chromium); "
               "`make test` does it first")


class Browser:
    """Headless Chromium in its own process group, one page driven over the DevTools protocol."""

    def __init__(self, profile: Path):
        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=open(profile.parent / "chromium.log", "w"),  # noqa: SIM115
                                     start_new_session=True)
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"chromium did not start: {(profile.parent / 'chromium.log').read_text()[-2000:]}")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(t for t in targets if t["type"] == "page")
        import websocket

        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self.events.append(msg)

    def wait_event(self, method: str, timeout_s: float = 60) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(method)

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return r["result"].get("value")

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def screenshot(self, height: int | None = None) -> bytes:
        """PNG of the page: the whole document (or its first `height` pixels), 1280 px wide."""
        if height is None:
            height = int(self.evaluate("document.documentElement.scrollHeight"))
        return base64.b64decode(self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                                          clip={"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1})["data"])

    def wait_text(self, needles: list[str], timeout_s: float = 90.0) -> str:
        """The page's innerText once every needle is in it (a single-page app renders after the load event);
        raises TimeoutError naming what is still missing, with the text seen."""
        deadline, text = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline:
            text = self.evaluate("document.body ? document.body.innerText : ''") or ""
            if all(n in text for n in needles):
                return text
            time.sleep(0.5)
        raise TimeoutError(f"not on the page after {timeout_s:.0f} s: {[n for n in needles if n not in text]}; "
                           f"text: {text[:3000]!r}")


def colours(png: bytes) -> int:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    return len(img.getcolors(maxcolors=1 << 20) or [])


def keep(png: bytes, tmp_path: Path, name: str) -> Path:
    """Write a screenshot under the test's tmp dir and copy it to ARTIFACTS; returns the kept copy's path."""
    kept = tmp_path / name
    kept.write_bytes(png)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(kept, ARTIFACTS / name)
    return kept
