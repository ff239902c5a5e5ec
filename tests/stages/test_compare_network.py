"""compare draws MLflow's network counters in their own group (not under memory) and never below zero: the
host-wide byte sum those series come from falls when an interface goes away during the run (a container's veth),
which MLflow logged as −62 MB. Real sqlite MLflow store, the series as MLflow's monitor logs them."""

from __future__ import annotations

from mlflow import MlflowClient
from mlflow.entities import Metric

from packtrain.gate.compare import curve_metrics, fetch_curves


def test_network_series_are_their_own_group_and_never_negative(tmp_path):
    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.create_experiment("net")
    runs = []
    for drop in (False, True):
        r = c.create_run(exp)
        rx = [0.0, 4.0, 9.0, -62.0, -55.0] if drop else [0.0, 1.0, 2.0, 3.0, 4.0]   # an interface gone at t=3
        c.log_batch(r.info.run_id, metrics=[
            *(Metric("system/network_receive_megabytes", v, 1_000_000 + 1000 * i, i) for i, v in enumerate(rx)),
            *(Metric("system/system_memory_usage_megabytes", 900.0 + i, 1_000_000 + 1000 * i, i) for i in range(5)),
            *(Metric("loss", 5.0 - i, 0, i + 1) for i in range(3))])
        runs.append(c.get_run(r.info.run_id))
    groups = curve_metrics(set(runs[0].data.metrics))
    assert groups["memory"] == ["system/system_memory_usage_megabytes"]
    assert groups["network"] == ["system/network_receive_megabytes"]
    curves, histories, notes = fetch_curves(c, runs)
    assert curves["network"] == ["system/network_receive_megabytes"] and "network" not in " ".join(notes)
    steady, dropped = histories["system/network_receive_megabytes"]
    assert [y for _, y in steady] == [0.0, 1.0, 2.0, 3.0, 4.0]                 # unchanged where nothing fell
    assert [y for _, y in dropped] == [0.0, 4.0, 9.0, 9.0, 16.0]              # the fall counts as no traffic
    assert [x for x, _ in dropped] == [0.0, 1.0, 2.0, 3.0, 4.0]               # seconds since the first sample
    # runs without MLflow's network series: no network group, no note about it
    curves, _, notes = fetch_curves(c, [c.get_run(c.create_run(exp).info.run_id)])
    assert "network" not in curves and not any("network" in n for n in notes)
