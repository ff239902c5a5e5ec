"""The KFP pipeline compiles; the committed IR is what the code compiles to; the IR carries the cluster
settings (GPUs from train.gpus, /dev/shm, secret, retries, caching, images) and the stage table's DAG."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pipeline_helpers import REPO, run_cli, run_main

from packtrain import STAGES
from packtrain.config import PipelineConfig, RunConfig
from packtrain.pipeline.kfp_ops import compile_pipeline
from packtrain.stages.table import ARTIFACTS, stage_spec, upstream

COMMITTED = REPO / "pipelines" / "packtrain_pipeline.yaml"


def _docs(path):
    docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    return docs[0], (docs[1] if len(docs) > 1 else {})


def test_committed_ir_matches_a_fresh_compile(tmp_path):
    """The committed IR is the tiny-cpu recipe's with the package version as code_version's default (a checkout's
    own compile stamps its git sha instead)."""
    from packtrain import __version__

    out = tmp_path / "p.yaml"
    r = run_cli(["pipeline", "compile", "--out", str(out), "--code-version", __version__], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == COMMITTED.read_text(), (
        "pipelines/packtrain_pipeline.yaml is stale: run `packtrain pipeline compile --out "
        f"pipelines/packtrain_pipeline.yaml --code-version {__version__}` and commit it")


def test_ir_has_every_stage_in_dag_order_with_artifacts():
    spec, _ = _docs(COMMITTED)
    tasks = spec["root"]["dag"]["tasks"]
    assert set(tasks) == set(STAGES)
    deps = {t: set(tasks[t].get("dependentTasks", [])) for t in tasks}
    assert deps["ingest"] == set()
    assert deps["tokenize"] == {"ingest", "validate"}          # validation gates tokenize
    assert deps["train"] == {"pack", "tokenize"}
    assert deps["register"] == {"train", "evaluate"}
    for s in STAGES:   # the wiring is the stage table's: each input artifact from its producer, same name
        assert deps[s] == set(upstream(s))
        arts = tasks[s]["inputs"].get("artifacts", {})
        assert {a: (v["taskOutputArtifact"]["producerTask"], v["taskOutputArtifact"]["outputArtifactKey"])
                for a, v in arts.items()} == {a: (ARTIFACTS[a], a) for a in stage_spec(s).inputs}
        assert stage_spec(s).output in spec["components"][f"comp-{s}"]["outputDefinitions"]["artifacts"]
    assert spec["root"]["inputDefinitions"]["parameters"]["config"]["parameterType"] == "STRING"
    comps = spec["components"]
    assert comps["comp-train"]["outputDefinitions"]["artifacts"]["model"]["artifactType"]["schemaTitle"] == \
        "system.Model"
    assert comps["comp-pack"]["outputDefinitions"]["artifacts"]["packs"]["artifactType"]["schemaTitle"] == \
        "system.Dataset"
    for s in STAGES:
        assert comps[f"comp-{s}"]["outputDefinitions"]["artifacts"]["metrics"]["artifactType"]["schemaTitle"] \
            == "system.Metrics"
        # cached unless the output depends on the registry now (evaluate) or changes it (register)
        assert tasks[s]["cachingOptions"].get("enableCache", False) is (s not in ("evaluate", "register"))
        # the run id reaches every component (→ KFP_RUN_ID → MLflow tag kfp.run_id)
        assert tasks[s]["inputs"]["parameters"]["kfp_run_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"


def test_the_committed_cpu_recipe_runs_from_the_ui_without_a_gpu():
    """tiny-cpu (train.device cpu): config defaults to the recipe (nothing to paste in the KFP UI), no task asks
    for a GPU or the GPU stages' 8 CPU / 64 Gi, every task runs the CPU image."""
    import json

    from packtrain.config import load_run_config

    spec, platform = _docs(COMMITTED)
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert json.loads(params["config"]["defaultValue"]) == load_run_config("tiny-cpu").to_dict()
    pc = PipelineConfig()
    for s in STAGES:
        c = spec["deploymentSpec"]["executors"][f"exec-{s}"]["container"]
        assert c["image"] == pc.cpu_image and "accelerator" not in c["resources"], (s, c)
        assert c["resources"]["resourceCpuRequest"] == pc.cpu_request
        assert "emptyDirMounts" not in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][f"exec-{s}"]


def test_a_checkouts_compile_stamps_its_git_sha_and_images_by_digest(tmp_path):
    from packtrain.versioning import code_version

    digest = "sha256:" + "ab" * 32
    cfg = RunConfig(pipeline={"base_image_digest": digest, "cpu_image_digest": digest})
    spec, _ = _docs(compile_pipeline(tmp_path / "p.yaml", cfg))
    assert spec["root"]["inputDefinitions"]["parameters"]["code_version"]["defaultValue"] == code_version()
    execs = spec["deploymentSpec"]["executors"]
    assert execs["exec-train"]["container"]["image"] == f"ghcr.io/packtrain/packtrain@{digest}"
    assert execs["exec-ingest"]["container"]["image"] == f"ghcr.io/packtrain/packtrain-cpu@{digest}"


def test_ir_resources_images_retries_secret_shm(tmp_path):
    spec, platform = _docs(compile_pipeline(tmp_path / "gpu.yaml", RunConfig()))   # train.device auto: a GPU
    pc = PipelineConfig()
    execs = spec["deploymentSpec"]["executors"]
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    tasks = spec["root"]["dag"]["tasks"]
    for s in STAGES:
        c = execs[f"exec-{s}"]["container"]
        gpu = s in ("train", "evaluate")
        assert c["image"] == (pc.base_image if gpu else pc.cpu_image)
        res = c["resources"]
        assert res["resourceCpuRequest"] == (pc.gpu_cpu_request if gpu else pc.cpu_request)
        if gpu:
            assert res["accelerator"]["resourceType"] == pc.gpu_type
            assert res["accelerator"]["resourceCount"] == "1"   # train.gpus = 1 (default); evaluate: one
            assert k8s[f"exec-{s}"]["emptyDirMounts"] == [
                {"medium": "Memory", "mountPath": "/dev/shm", "sizeLimit": pc.shm_size, "volumeName": "dshm"}]
        else:
            assert "accelerator" not in res and "emptyDirMounts" not in k8s[f"exec-{s}"]
        secrets = k8s[f"exec-{s}"]["secretAsEnv"]
        envs = {kv["envVar"]: sec["optional"] for sec in secrets for kv in sec["keyToEnv"]}
        assert envs == {"MLFLOW_TRACKING_URI": False, "MLFLOW_TRACKING_USERNAME": True,
                        "MLFLOW_TRACKING_PASSWORD": True}
        assert {sec["secretName"] for sec in secrets} == {pc.mlflow_secret}
        retry = tasks[s].get("retryPolicy")
        if s in ("ingest", "train", "evaluate", "register"):
            assert retry["maxRetryCount"] == pc.retries
        else:
            assert retry is None  # deterministic stages: a retry fails the same way
    # no pip install at run time: kfp and packtrain come with the image
    assert "pip install" not in yaml.safe_dump(execs)


def test_compile_follows_the_pipeline_config(tmp_path):
    cfg = RunConfig(pipeline={"base_image": "registry.example/packtrain:9", "shm_size": "64Gi", "retries": 0},
                    train={"gpus": 4})
    spec, platform = _docs(compile_pipeline(tmp_path / "p.yaml", cfg))
    execs = spec["deploymentSpec"]["executors"]
    train = execs["exec-train"]["container"]
    assert train["image"] == "registry.example/packtrain:9"
    assert train["resources"]["accelerator"]["resourceCount"] == "4"   # the train stage's 4 ranks
    assert execs["exec-evaluate"]["container"]["resources"]["accelerator"]["resourceCount"] == "1"
    assert platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train"]["emptyDirMounts"][0][
        "sizeLimit"] == "64Gi"
    assert all("retryPolicy" not in t for t in spec["root"]["dag"]["tasks"].values())


def test_compile_cli_reads_train_gpus(tmp_path):
    """One GPU count: train.gpus is the train task's accelerator limit; train.device=cpu requests none. The CLI's
    entry point in this process (run_main: kfp is imported here already; a `packtrain` process is ~2.5 CPU-s each,
    test_committed_ir_matches_a_fresh_compile runs the console script)."""
    out, cpu = tmp_path / "gpu8.yaml", tmp_path / "cpu.yaml"
    r = run_main(["pipeline", "compile", "--out", str(out), "--set", "train.gpus=8", "--set", "train.device=auto"],
                 cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    execs = _docs(out)[0]["deploymentSpec"]["executors"]
    assert execs["exec-train"]["container"]["resources"]["accelerator"]["resourceCount"] == "8"
    assert execs["exec-evaluate"]["container"]["resources"]["accelerator"]["resourceCount"] == "1"
    r = run_main(["pipeline", "compile", "--out", str(cpu), "--set", "train.device=cpu"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert all("accelerator" not in e["container"]["resources"]
               for e in _docs(cpu)[0]["deploymentSpec"]["executors"].values())


@pytest.mark.parametrize("old", ["pipeline.gpus", "plan.gpus"])
def test_removed_gpu_fields_name_train_gpus(tmp_path, old):
    r = run_main(["pipeline", "compile", "--out", str(tmp_path / "x.yaml"), "--set", f"{old}=8"], cwd=tmp_path)
    assert r.returncode == 2
    assert f"--set {old}=8: {old}: removed: set train.gpus instead" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_compile_cli_bad_override_is_a_clear_error(tmp_path):
    """The CLI's entry point in this process (run_main), as for every refused setting here: the CLI refuses it
    before anything compiles, and a process of its own (~1 CPU-s) would only add start-up;
    test_committed_ir_matches_a_fresh_compile runs the console script itself."""
    r = run_main(["pipeline", "compile", "--out", str(tmp_path / "x.yaml"), "--set", "train.gpus=-1"],
                 cwd=tmp_path)
    assert r.returncode == 2
    assert "train.gpus: -1 is not allowed: must be an integer ≥ 1" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_a_bad_image_digest_is_a_clear_error_and_writes_nothing(tmp_path):
    out = tmp_path / "x.yaml"
    r = run_main(["pipeline", "compile", "--out", str(out), "--set", "pipeline.base_image_digest=sha256:abc"],
                 cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "pipeline.base_image_digest" in r.stderr and "sha256: and 64 hex digits" in r.stderr, r.stderr
    assert not out.exists()


def test_compile_without_out_writes_into_the_workdir_not_the_committed_ir(tmp_path):
    """A plain `packtrain pipeline compile` in a checkout must not rewrite pipelines/packtrain_pipeline.yaml (it
    stamps this checkout's git version): it writes <workdir>/pipelines/packtrain_pipeline.yaml and says so (the
    CLI's entry point in this process, as test_compile_cli_reads_train_gpus)."""
    committed = tmp_path / "pipelines" / "packtrain_pipeline.yaml"
    committed.parent.mkdir()
    committed.write_text("# the committed IR\n")
    r = run_main(["pipeline", "compile", "--set", "workdir=wd"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert committed.read_text() == "# the committed IR\n"
    out = tmp_path / "wd" / "pipelines" / "packtrain_pipeline.yaml"
    assert r.stdout.strip() == f"compiled {Path('wd') / 'pipelines' / 'packtrain_pipeline.yaml'}", r.stdout
    assert "pipelineInfo" in out.read_text()
