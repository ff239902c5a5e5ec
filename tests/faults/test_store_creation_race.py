"""Two registrations into one fresh sqlite MLflow store at the same instant both land: the store's creation (tables
+ alembic migrations) is serialised by a file lock beside the sqlite file (packtrain.tracking.store_creation). Before, one
of the two processes crashed with `table latest_metrics already exists` / `duplicate column name: step` / "Online
migration expected to match one row" (4 times out of 4 here) and its registration was lost. Real processes, a real
sqlite store, packtrain's own stage run + registration path; the two start together on a barrier file."""

from __future__ import annotations

import os
import subprocess
import sys

REGISTER = """
import os, sys, time
from pathlib import Path
from packtrain.config import load_run_config
from packtrain.registry import install_handlers
from packtrain.registry.outcome import RegisterOutcome
from packtrain.registry.op import build_registration
from packtrain.tracking.run_lifecycle import stage_run
install_handlers()   # the register stage's path: the op submitted through the stage run, applied by the handler
db, model, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
cfg = load_run_config("tiny-cpu", [f"workdir={Path(db).parent}", f"tracking.tracking_uri=sqlite:///{db}",
                                   "register.model_name=raced", "tracking.system_metrics=false"])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.002)
with stage_run("register", cfg) as run:
    r = RegisterOutcome(**run.submit(build_registration(model, {"eval_loss": 3.0, "perplexity": 20.1}, None,
                                                       cfg.register_)))
print("registered", r.version, r.decision, flush=True)
"""


def test_two_registrations_into_a_fresh_store_both_survive(tmp_path):
    from mlflow import MlflowClient

    from packtrain.testing.tiny_model import build_tiny_model_dir

    texts = ["def area(r):\n    return 3.14159 * r * r\n", "The quick brown fox jumps over the lazy dog. "] * 4
    models = [build_tiny_model_dir(tmp_path / f"model-{s}", texts, init_std=s) for s in (0.02, 0.3)]
    db, go = tmp_path / "store" / "mlflow.db", tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    procs = [subprocess.Popen([sys.executable, "-c", REGISTER, str(db), str(m), str(go)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for m in models]
    for p in procs:   # both imported everything and wait on the barrier
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    assert not db.exists()
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "registered" in out
    client = MlflowClient(tracking_uri=f"sqlite:///{db}", registry_uri=f"sqlite:///{db}")
    versions = client.search_model_versions("name = 'raced'")
    assert sorted(str(v.version) for v in versions) == ["1", "2"]
    assert {r.info.status for r in client.search_runs([e.experiment_id for e in client.search_experiments()])} \
        == {"FINISHED"}
    from packtrain.tracking.store_creation import store_lock_path

    assert store_lock_path(db).exists() and store_lock_path(db).stat().st_size == 0   # the lock file, beside it
