"""`packtrain run --runner kfp`: the compiled KFP DAG through kfp.local, each component in its own process as a pod
runs it — the runner's own tests (every other test of a whole run uses the default in-process runner).

1. Both runners give the same stage results on the tiny recipe (its task suite included), each in its own
   workdir, every stage computed (none restored from a stage cache): the same tokenizer and token ids, the same
   packs, the same model weights, the same losses and held-out loss to the last bit (CPU), and v1 → champion;
   the kfp run leaves no `tmp.*` folder in $TMPDIR. The in-process side is the session's shared `tiny_pipeline`
   (tests/pipelines/conftest.py: the first run in a fresh workdir, its `--json` record taken right after it),
   not a second in-process run of the same settings.
2. A failing validation under kfp comes back through the component's error record: exit 4, the stage's own
   message, nothing after validate ran.
3. A component's command removes the folder it writes the program into, whatever the program's exit status.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from pipeline_helpers import REPO, as_args, run_main, tiny_settings


@pytest.fixture(scope="module")
def both(tiny_pipeline, tmp_path_factory):
    """The in-process run: the shared tiny pipeline's; the kfp run: the same settings in a workdir of its own."""
    assert tiny_pipeline["result"].returncode == 0, tiny_pipeline["result"].stderr[-3000:]
    root = tmp_path_factory.mktemp("runners")
    record = json.loads(tiny_pipeline["json"].read_text())
    out = {"in-process": {"result": tiny_pipeline["result"], "stats": record["stages"],
                          "wd": tiny_pipeline["workdir"], "parent_run_id": record["parent_run_id"]}}
    assert record["runner"] == "in-process"
    tmp = root / "tmp-kfp"
    tmp.mkdir()
    settings = [f"workdir={root / 'kfp'}" if s.startswith("workdir=") else s for s in tiny_pipeline["settings"]]
    assert settings != tiny_pipeline["settings"] and len(settings) == len(tiny_pipeline["settings"])
    r = run_main(["run", "--runner", "kfp", "--no-cache", *as_args(settings), "--json", str(root / "kfp.json")],
                 cwd=root, env={"TMPDIR": str(tmp)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    record = json.loads((root / "kfp.json").read_text())
    out["kfp"] = {"result": r, "stats": record["stages"], "tmp": tmp, "wd": root / "kfp",
                  "parent_run_id": record["parent_run_id"]}
    return {"root": root, "corpus": tiny_pipeline["corpus"], **out}


@pytest.mark.slow
def test_both_runners_give_the_same_stage_results(both):
    a, b = both["in-process"]["stats"], both["kfp"]["stats"]
    assert list(a) == list(b) == ["ingest", "validate", "tokenize", "pack", "train", "evaluate", "register"]
    assert [s["cache"] for s in (*a.values(), *b.values())] == ["miss"] * 14   # every stage computed, both runs
    assert a["ingest"]["documents"] == b["ingest"]["documents"] == len(list(both["corpus"].glob("*.txt"))) == 60
    for key in ("tokens_md5", "tokenizer_hash", "tokens", "vocab_size"):
        assert a["tokenize"][key] == b["tokenize"][key], key
    assert a["pack"]["n_packs"] == b["pack"]["n_packs"] and a["pack"]["fill"] == b["pack"]["fill"]
    # the packs (train split) and the saved model, byte for byte (their md5 in the next stage's lineage)
    assert a["train"]["lineage"]["input_md5"] == b["train"]["lineage"]["input_md5"]
    assert a["evaluate"]["lineage"]["input_md5"]["model"] == b["evaluate"]["lineage"]["input_md5"]["model"]
    assert a["train"]["loss_curve"] == b["train"]["loss_curve"] and len(a["train"]["loss_curve"]) == 2
    assert a["train"]["final_loss"] == b["train"]["final_loss"]
    assert a["evaluate"]["eval_loss"] == b["evaluate"]["eval_loss"]
    assert (a["register"]["version"], a["register"]["decision"]) == (b["register"]["version"],
                                                                      b["register"]["decision"]) == ("1", "champion")
    # the same terminal lines, status by status
    lines = [re.findall(r"^\[\d/7\] (\w+)\s+(success|failure)", r["result"].stdout, re.M) for r in
             (both["in-process"], both["kfp"])]
    assert lines[0] == lines[1] == [(s, "success") for s in a], lines
    # the parent run names its runner
    import mlflow

    for runner, tag in (("in-process", "in-process"), ("kfp", "kfp.local")):
        client = mlflow.MlflowClient(f"sqlite:///{both[runner]['wd'] / 'mlflow.db'}")
        parents = client.search_runs([client.get_experiment_by_name("packtrain").experiment_id],
                                     "tags.`packtrain.kind` = 'pipeline'")
        (parent,) = [p for p in parents if p.info.run_id == both[runner]["parent_run_id"]]
        assert parent.data.tags["packtrain.runner"] == tag
        # and the same MLflow layout (docs/tracking.md): named by data version, the model is the train run's
        assert parent.info.run_name == f"tiny-cpu · data {a['ingest']['lineage']['data_version'][:8]}"
        (train,) = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = "
                                      f"'{parent.info.run_id}' and attributes.run_name = 'train'")
        assert {k for k in train.data.metrics if not k.startswith("system/")} == {"loss", "real_tokens_per_s",
                                                                                 "useful_mfu"}
        assert client.get_model_version("packtrain-lm", "1").run_id == train.info.run_id
    assert len(parents) == 1   # the kfp workdir's one run (the shared workdir has later tests' runs too)


@pytest.mark.slow
def test_kfp_run_leaves_no_program_folder(both):
    """Each component's `mktemp -d` folder is removed (seven tmp.* folders per run before)."""
    assert sorted(p.name for p in both["kfp"]["tmp"].glob("tmp.*")) == []


@pytest.mark.slow
def test_failing_validation_under_kfp_is_exit_4_with_the_stage_message(both):
    wd = both["root"] / "kfp"
    old = set((wd / "kfp").glob("packtrain-*"))
    settings = [*tiny_settings(wd, both["corpus"]), "validate.min_rows=10000"]
    r = run_main(["run", "--runner", "kfp", *as_args(settings)], cwd=both["root"])
    assert r.returncode == 4, r.stdout + r.stderr
    assert "stage validate failed: " in r.stderr and "Traceback" not in r.stderr
    assert re.search(r"report\.json", r.stderr) and "(full log: " in r.stderr, r.stderr
    assert re.search(r"validate\s+failure", r.stdout), r.stdout
    (new_run,) = set((wd / "kfp").glob("packtrain-*")) - old
    assert {p.name for p in new_run.iterdir()} == {"ingest", "validate"}   # nothing after validate ran
    record = json.loads((wd / "kfp" / "last_error.json").read_text())
    assert (record["stage"], record["exit_code"], record["type"]) == ("validate", 4, "ValidationFailed")


@pytest.mark.parametrize("code", [0, 3])
def test_component_command_removes_its_program_folder(tmp_path, code):
    """The pack component's real command, with a program that exits `code`: the shell exits `code` too, and the
    folder it wrote the program into is gone (kfp's command alone leaves it in $TMPDIR)."""
    from packtrain.components import COMPONENTS

    sh, flag, script, _source = COMPONENTS["pack"].component_spec.implementation.container.command
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run([sh, flag, script.replace("python3", sys.executable), f"import sys; sys.exit({code})",
                        "--executor_input", "{}", "--function_to_execute", "pack"], env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stdout + r.stderr
    assert list(tmp.iterdir()) == []


def test_every_compiled_component_removes_its_program_folder():
    """The committed IR (what a cluster runs) has the removal in every executor's command."""
    spec = next(yaml.safe_load_all((REPO / "pipelines" / "packtrain_pipeline.yaml").read_text(encoding="utf-8")))
    executors = spec["deploymentSpec"]["executors"]
    assert len(executors) == 7
    for name, ex in executors.items():
        script = ex["container"]["command"][2]
        assert script.startswith("program_path=$(mktemp -d)\ntrap 'rm -rf \"$program_path\"' EXIT\n"), (name, script)
