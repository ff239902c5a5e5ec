"""The `packtrain compare` HTML report opened in a real headless Chromium (Debian's package; `make test` installs
it, see the Makefile's `chromium` target): the page renders, every <img> decoded (naturalWidth > 0), neither the
page nor any figure is blank, and the screenshot is kept as a test artifact (its path is printed).

Chromium is driven over the DevTools protocol (tests/chromium.py; websocket-client, already installed with kfp's
kubernetes client): navigate to file://…/compare.html, wait for the load event, read the DOM, capture the page and each image's
region. The report comes from two pipeline run trees (parent `pipeline` + `train` stage child with metric
histories and final values under a real train run's names) in a sqlite store: what the browser checks is the HTML, not MLflow.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from chromium import ARTIFACTS, CHROMIUM, SKIP_REASON, Browser, colours, keep

from packtrain.cli import main


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """compare.html of two pipeline run trees (train.lr differs; histories of every curve group)."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("compare_html")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    c = MlflowClient(uri)
    exp = c.create_experiment("packtrain", artifact_location=str(root / "artifacts"))
    parents = []
    for i, lr in enumerate(("0.003", "0.001")):
        parent = c.create_run(exp, run_name="pipeline", tags={"packtrain.kind": "pipeline",
                                                               "packtrain.gpu": "NVIDIA H200"}).info.run_id
        c.log_batch(parent, params=[Param("train.lr", lr), Param("pack.budget", "64"), Param("model.hidden_size", "32")])
        train = c.create_run(exp, run_name="train", tags={"packtrain.kind": "stage", "packtrain.stage": "train",
                                                          "mlflow.parentRunId": parent}).info.run_id
        t0, m = 1_700_000_000_000, []
        for step in range(1, 21):
            m += [Metric("loss", 5.0 / (1 + (0.2 - 0.05 * i) * step), t0 + step, step),
                  Metric("real_tokens_per_s", 8000 - 1500 * i + 40 * (step % 4), t0 + step, step),
                  Metric("useful_mfu", 0.022 - 0.004 * i + 0.001 * (step % 3), t0 + step, step),
                  Metric("dense_mfu", 0.026 - 0.004 * i, t0 + step, step)]
            if step % 5 == 0:   # evaluation during training (train.eval_every_steps)
                m.append(Metric("eval_loss", 5.2 / (1 + (0.18 - 0.05 * i) * step), t0 + step, step))
        for k in range(12):   # system series: step = ms since the sampler started
            m.append(Metric("system.utilization_pct", 40 + 30 * (k % 2) - 10 * i, t0 + k, 250 * k))
        # one memory sample per run (a train stage shorter than two telemetry intervals): drawn as dots + a note
        m.append(Metric("system.memory_used_gib", 0.55 + 0.05 * i, t0, 260 - 200 * i))
        finals = {"throughput.real_tokens_per_s": 8000 - 1500 * i, "throughput.useful_mfu": 0.022 - 0.004 * i,
                  "throughput.dense_mfu": 0.026 - 0.004 * i, "throughput.step_time_p50_s": 0.016 + 0.003 * i,
                  "system.utilization": 0.55 - 0.1 * i, "memory.cpu_peak_rss_gib": 0.66 + 0.05 * i,
                  "final_loss": 1.0 + 0.25 * i}
        m += [Metric(k, v, t0, 0) for k, v in finals.items()]
        m += [Metric(f"summary.{k.split('.')[-1]}", v, t0, 0) for k, v in finals.items() if "." in k]
        c.log_batch(train, metrics=m, tags=[RunTag("mlflow.runName", "train"), RunTag("packtrain.gpu", "NVIDIA H200")])
        c.set_terminated(train)
        c.set_terminated(parent)
        parents.append(parent)
    out = root / "report"
    assert main(["compare", *parents, "--no-log", "--set", f"tracking.tracking_uri={uri}", "--out", str(out)]) == 0
    return out / "compare.html"


@pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason=SKIP_REASON)
def test_report_renders_in_headless_chromium(report, tmp_path, request, capsys):
    pytest.importorskip("websocket", reason="websocket-client (installed with kfp's kubernetes client) drives Chromium")
    browser = Browser(tmp_path / "profile")
    try:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=report.as_uri())
        browser.wait_event("Page.loadEventFired")
        dom = browser.evaluate("""(async () => {
            await Promise.all([...document.images].map(i => i.decode().catch(() => null)));
            return {title: document.title, h1: document.querySelector('h1').innerText,
                    text: document.body.innerText.length, height: document.documentElement.scrollHeight,
                    tables: document.querySelectorAll('table').length,
                    headline: [...[...document.querySelectorAll('h2')].find(h => h.innerText === 'Headline')
                                .nextElementSibling.querySelectorAll('th')].map(th => th.innerText),
                    cells: [...document.querySelectorAll('td')].map(td => td.innerText),
                    gate: [...document.querySelectorAll('p.gate')].map(p => p.innerText),
                    notes: [...document.querySelectorAll('.curves p.note')].map(p => p.innerText),
                    images: [...document.images].map(i => {const r = i.getBoundingClientRect();
                        return {alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,
                                x: r.left + scrollX, y: r.top + scrollY, cw: r.width, ch: r.height}})};
        })()""")
        shot = browser.screenshot(dom["height"])
        crops = [base64.b64decode(browser.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                                               clip={"x": im["x"], "y": im["y"], "width": im["cw"],
                                                     "height": im["ch"], "scale": 1})["data"])
                 for im in dom["images"]]
    finally:
        browser.close()

    kept = keep(shot, tmp_path, "compare-report.png")
    request.node.user_properties.append(("screenshot", str(ARTIFACTS / "compare-report.png")))
    with capsys.disabled():   # in the test output even without -s
        print(f"\ncompare report screenshot: {ARTIFACTS / 'compare-report.png'} (and {kept})")

    assert dom["title"] == "packtrain compare" and dom["h1"] == "packtrain compare: 2 runs"
    assert dom["tables"] >= 4 and dom["text"] > 500 and dom["height"] > 600
    assert len(dom["gate"]) == 1 and dom["gate"][0].startswith("REGRESSION")   # the 2nd run is 19% slower (GPU-tagged runs: the H200 noise rules gate throughput)
    assert [im["alt"] for im in dom["images"]] == [f"{g} curves" for g in
                                                   ("loss", "eval loss", "tokens/s", "MFU", "utilization", "memory")]
    assert dom["headline"][-1].startswith("Δ ") and dom["headline"][-1].endswith(" vs baseline"), dom["headline"]
    assert not any("inf" in c for c in dom["cells"]), [c for c in dom["cells"] if "inf" in c]
    assert dom["notes"] == ["memory: one system.memory_used_gib point per run (the train stage took less than two "
                            "telemetry samples, telemetry.interval_s)"]
    for im in dom["images"]:
        assert im["complete"] and im["w"] > 200 and im["h"] > 100 and im["cw"] > 200, im   # decoded and laid out
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and colours(shot) > 50           # a page, not one colour
    for im, crop in zip(dom["images"], crops, strict=True):
        assert colours(crop) > 20, f"{im['alt']}: figure region is blank"    # each figure drew lines and text
