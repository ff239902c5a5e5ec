"""`packtrain pipeline submit`: the cron is checked before anything is contacted; an unreachable host is a
clear error naming it. (No KFP cluster here: the real submission is exercised in docs/pipeline.md.)"""

from __future__ import annotations

import socket

from pipeline_helpers import run_cli

from packtrain.config import load_run_config
from packtrain.pipeline.kfp_ops import pipeline_arguments


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_five_field_cron_is_rejected_before_contacting_the_host(tmp_path):
    r = run_cli(["pipeline", "submit", "--host", "http://127.0.0.1:1", "--schedule", "0 3 * * 1"], cwd=tmp_path)
    assert r.returncode == 2
    assert "has 5 fields" in r.stderr and "did you mean '0 0 3 * * 1'" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_host_is_a_clear_error(tmp_path):
    r = run_cli(["pipeline", "submit"], cwd=tmp_path)
    assert r.returncode == 2 and "--host" in r.stderr


def test_unreachable_host_names_the_host(tmp_path):
    host = f"http://127.0.0.1:{_closed_port()}"
    r = run_cli(["pipeline", "submit", "--host", host, "--schedule"], cwd=tmp_path, timeout=120)
    assert r.returncode == 1, r.stderr
    assert f"could not submit to KFP at {host}" in r.stderr and "Traceback" not in r.stderr


def test_arguments_carry_the_whole_config_as_one_string():
    cfg = load_run_config("tiny-cpu", ["pack.budget=1024"])
    args = pipeline_arguments(cfg, data_version="abc.dir")
    assert set(args) == {"config", "data_version", "code_version"}
    import json

    assert json.loads(args["config"]) == cfg.to_dict()
    assert args["data_version"] == "abc.dir" and args["code_version"].startswith("0.")
