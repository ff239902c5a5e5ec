"""recipes/sft-tiny-cpu.yaml end to end through the real `packtrain run` CLI (in process, real MLflow sqlite
store, real DVC, real GX), shortened to 4 train steps on 160 synthetic chat records:

1. LoRA run: the registered version is the merged model — it loads with plain AutoModelForCausalLM.from_pretrained
   and computes what base + adapter compute (logits equal to 1e-5); the adapter files are the register run's
   artifact adapter/ and the version names them (packtrain.adapter*, packtrain.loss_on tags).
2. The same recipe with train.adapter.type=none (a full fine-tune): ingest..pack come from the stage cache, and
   `packtrain compare` puts the two pipeline runs side by side with train.adapter.type among the differing params.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
from pipeline_helpers import as_args, run_main  # noqa: E402

pytestmark = pytest.mark.slow

LEAN = ["validate.min_rows=50", "tokenize.train_chars=200000", "tokenize.workers=1", "train.max_steps=4",
        "train.warmup_steps=1", "evaluate.max_batches=1", "tracking.system_metrics=false",
        "evaluate.sample_tokens=4"]   # 3 samples × 32 greedy tokens were ~1-2 s of each of the two evaluates


def _run_id(stdout: str) -> str:
    m = re.search(r"run id\s+([0-9a-f]{8})", stdout)
    assert m, stdout[-2000:]
    return m.group(1)


def _model_dir_with_config(root: Path) -> Path:
    """The directory of a downloaded transformers-flavor model that holds config.json."""
    found = sorted(p.parent for p in root.rglob("config.json") if (p.parent / "model.safetensors").is_file())
    assert found, sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    return found[0]


def test_sft_lora_recipe_registers_merged_model_and_adapter_and_compares(tmp_path, monkeypatch, capsys,
                                                                       seed_mlflow_store):
    import mlflow
    import torch
    from transformers import AutoModelForCausalLM

    from packtrain.cli import main
    from packtrain.data.synthetic_chat import write_synthetic_chat
    from packtrain.model.lora import load_adapter_model

    chat = write_synthetic_chat(tmp_path / "chat_tiny.jsonl", n=160)
    before = chat.read_bytes()
    wd = tmp_path / "wd"
    seed_mlflow_store(wd / "mlflow.db")   # the workdir's store, empty (its creation: not the subject)
    args = ["--recipe", "sft-tiny-cpu", *as_args([f"workdir={wd}", f"ingest.source={chat}", *LEAN])]
    uri = f"sqlite:///{wd / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)

    lora = run_main(["run", *args], cwd=tmp_path)
    assert lora.returncode == 0, lora.stdout[-3000:] + lora.stderr[-3000:]
    assert "register   packtrain-sft v1 → champion" in lora.stdout, lora.stdout
    assert chat.read_bytes() == before   # the input file is never changed

    # the version: the merged model, with the adapter named beside it
    v1 = client.get_model_version("packtrain-sft", "1")
    assert v1.tags["packtrain.adapter"] == "lora r=8 alpha=16"
    assert v1.tags["packtrain.loss_on"] == "assistant"
    reg_run = v1.tags["packtrain.adapter_artifact"].split("/")[1]
    names = {Path(a.path).name for a in client.list_artifacts(reg_run, "adapter")}
    assert {"adapter_config.json", "adapter_model.safetensors", "packtrain_adapter.json", "tokenizer.json"} <= names
    assert not {"base", "merged"} & names   # the adapter only: the merged weights are the registered model
    adapter_cfg = json.loads(Path(client.download_artifacts(reg_run, "adapter/adapter_config.json",
                                                            str(tmp_path / "dl"))).read_text())
    assert (adapter_cfg["r"], adapter_cfg["lora_alpha"]) == (8, 16)

    # the registered model loads in plain transformers and equals base + adapter
    # explicit URIs: an earlier test in this worker may have set MLflow's process-wide tracking URI
    reg = Path(mlflow.artifacts.download_artifacts(artifact_uri=client.get_model_version_download_uri(
        "packtrain-sft", "1"), tracking_uri=uri, dst_path=str(tmp_path / "reg")))
    merged = AutoModelForCausalLM.from_pretrained(str(_model_dir_with_config(reg)), dtype=torch.float32).eval()
    (train_model,) = [p.parent for p in wd.rglob("packtrain_adapter.json") if p.parent.name == "model"
                      and "kfp" in p.parts]
    ref = load_adapter_model(train_model, merge=False).eval()
    ids = torch.randint(4, merged.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = merged(input_ids=ids, use_cache=False).logits
        want = ref(input_ids=ids, use_cache=False).logits
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()

    # the same recipe as a full fine-tune, then compare
    full = run_main(["run", *args, "--set", "train.adapter.type=none"], cwd=tmp_path)
    assert full.returncode == 0, full.stdout[-3000:] + full.stderr[-3000:]
    assert "from cache: ingest, validate, tokenize, pack" in full.stdout, full.stdout
    a, b = _run_id(lora.stdout), _run_id(full.stdout)
    out = tmp_path / "cmp"
    capsys.readouterr()
    # in this process (the CLI's own entry point): a `packtrain compare` process costs ~6 s of imports on 2 cores
    assert main(["compare", a, b, "--out", str(out), *args]) == 0
    printed = capsys.readouterr().out
    differ = json.loads((out / "compare.json").read_text())["params_differ"]
    assert differ["train"]["train.adapter.type"] == ["lora", "none"], differ
    assert "train.adapter.type" in printed
