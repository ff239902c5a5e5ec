"""`dvc plots show` renders offline: the repository's .dvc/config names .dvc/plots.html (Vega, Vega-Lite and
Vega-Embed inlined by tools/vendor_vega.py) as its HTML template, so the page draws the plot in a browser with no
network — DVC's own template loads Vega from a CDN and stays blank. Checked in headless Chromium (its --dump-dom
after the scripts ran: the plot's <svg>/<canvas> exists only if Vega drew it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_helpers import REPO

CHROMIUM = os.environ.get("PACKTRAIN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def test_the_repos_plots_template_inlines_vega_and_is_configured():
    page = (REPO / ".dvc" / "plots.html").read_text(encoding="utf-8")
    assert "{plot_divs}" in page and "cdn.jsdelivr" not in page and "<script src" not in page
    assert all(f"<!-- {lib}@" in page for lib in ("vega", "vega-lite", "vega-embed"))
    assert "html_template = plots.html" in (REPO / ".dvc" / "config").read_text(encoding="utf-8")


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="headless Chromium (make test installs it)")
def test_dvc_plots_show_draws_without_network(tmp_path):
    repo = tmp_path / "repo"
    (repo / "plots").mkdir(parents=True)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=repo, check=True, env=env)
    shutil.copyfile(REPO / ".dvc" / "plots.html", repo / ".dvc" / "plots.html")
    with open(repo / ".dvc" / "config", "a", encoding="utf-8") as f:   # as the repository's .dvc/config says
        f.write("[plots]\n    html_template = plots.html\n")
    (repo / "plots" / "train_steps.csv").write_text("step,loss\n" + "".join(f"{s},{5 / s:.4f}\n" for s in range(1, 21)))
    (repo / "dvc.yaml").write_text("plots:\n  - plots/train_steps.csv:\n      x: step\n      y: loss\n")
    r = subprocess.run([*dvc, "plots", "show", "-o", str(tmp_path / "out")], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    page = tmp_path / "out" / "index.html"
    assert "cdn.jsdelivr" not in page.read_text(encoding="utf-8")
    # no network: a proxy that does not exist, so a CDN fetch would fail rather than reach anything
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--proxy-server=http://127.0.0.1:9", "--virtual-time-budget=10000",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<svg" in dom.stdout or "<canvas" in dom.stdout, dom.stdout[-2000:]
