"""Register speed: logging an exported model the old way (load, then MLflow re-saves every weight) and the new
way (register.flavor=files: the files copied as they are), into one sqlite MLflow store, in one process.

    python -m bench register-speed --out bench/results/register_speed.json     # ~2 min on 2 cores
    python -m bench register-speed --smoke --out /tmp/rs                       # the tiny model only, seconds

Models, random weights saved in bf16 with save_pretrained (a GPU run's export) next to a tiny byte-level BPE
(packtrain.testing.tiny_model.train_tiny_tokenizer: ~300 tokens; the model's vocab is its own):
    tiny   Llama hidden 32, 2 layers, 4 heads, vocab 300                                      ~0.04M parameters
    350m   Llama hidden 1024, intermediate 2816, 24 layers, 16 heads, vocab 32768, tied       ~342M parameters

Each way, as the register stage runs it (packtrain.registry.model.log_model_dir), into its own run:
    old    register.flavor=transformers: load_model_dir (fp32) + mlflow.transformers.log_model of the components
    files  register.flavor=files: the directory's files into MLflow's transformers flavor
Rows: seconds (the whole step: what log_model_s records now), load_s (old: the part before MLflow; the register
stage's log_model_s used to leave it out), the logged model's size, and whether its model.safetensors is the
exported file byte for byte. Both ways run once on the tiny model first, unrecorded, so neither pays the one-time
imports (mlflow.transformers ~1.4 s) inside its numbers.
"""

from __future__ import annotations

import filecmp
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import Record, machine_info

SUMMARY = "register: log a 350M model the old way (load + re-save) and as its files (register.flavor=files)"
DEVICE = "cpu"
SHAPES = {
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=300),
    "350m": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=24, num_attention_heads=16,
                 vocab_size=32768),
}
WAYS = {"old": "transformers", "files": "files"}
GOALS = {"files_seconds_max_350m": 10.0}
"""The 350M model logged as its files in at most 10 s (the old way took 39.8 s on a GPU host)."""
TEXTS = ["def area(r):\n    return 3.14159 * r * r\n", "import os\nimport sys\nprint(sys.argv)\n",
         "The quick brown fox jumps over the lazy dog. "] * 4


def add_arguments(p) -> None:
    p.add_argument("--shapes", default="tiny,350m", help="comma-separated: tiny, 350m (--smoke: tiny)")


def export_model(out: Path, shape: str) -> tuple[Path, int]:
    """A random-weight Llama of `shape` saved in bf16 with its tokenizer into `out`; (out, parameters)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from packtrain.model.saving import save_pretrained
    from packtrain.testing.tiny_model import train_tiny_tokenizer

    tok = train_tiny_tokenizer(TEXTS)
    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=None,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    save_pretrained(model, str(out))   # as packtrain exports: without importing deepspeed (~1.9 CPU-s) to unwrap
    tok.save_pretrained(str(out))
    return out, sum(p.numel() for p in model.parameters())


def log_once(model_dir: Path, way: str, exp_id: str) -> dict:
    """Log `model_dir` the way `way` into a new run of experiment `exp_id`; the row (module doc)."""
    import mlflow
    from mlflow import MlflowClient

    from packtrain.registry import model as registry

    load_s = 0.0
    if way == "old":   # time the load apart: the stage used to report only what follows it
        from packtrain.evaluate.loading import load_model_dir

        t0 = time.perf_counter()
        model, tok = load_model_dir(model_dir, "cpu")
        load_s = time.perf_counter() - t0
    with mlflow.start_run(experiment_id=exp_id, run_name=f"register-{way}") as run:
        t0 = time.perf_counter()
        if way == "old":
            info, flavor, _, _ = registry.log_model(model, tok, model_dir, "transformers",
                                                    registry.default_pip_requirements(), "bench", run_id=run.info.run_id)
        else:
            info, flavor, _, _ = registry.log_model_dir(model_dir, "files", registry.default_pip_requirements(),
                                                        "bench", run_id=run.info.run_id)
        log_s = time.perf_counter() - t0
    where = Path(MlflowClient().get_logged_model(info.model_id).artifact_location.removeprefix("file://"))
    size = sum(p.stat().st_size for p in where.rglob("*") if p.is_file())
    logged = where / "model" / "model.safetensors"   # the old way re-saves (fp32: maybe in shards)
    same = logged.is_file() and filecmp.cmp(logged, model_dir / "model.safetensors", shallow=False)
    return {"way": way, "flavor": flavor, "seconds": round(load_s + log_s, 3), "load_s": round(load_s, 3),
            "log_s": round(log_s, 3), "logged_mib": round(size / 2**20, 1), "weights_byte_identical": same}


def run(a, out: Path) -> Record:
    import mlflow

    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    shapes = ["tiny"] if a.smoke else [s.strip() for s in a.shapes.split(",") if s.strip()]
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        raise SystemExit(f"--shapes: {', '.join(unknown)} not allowed (allowed: {', '.join(SHAPES)})")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="packtrain-register-speed-") as tmp:
        root = Path(tmp)
        before = mlflow.get_tracking_uri()
        set_fluent_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
        try:
            exp_id = mlflow.create_experiment("register-speed", artifact_location=str(root / "artifacts"))
            if not a.smoke:   # the one-time imports of both ways, outside every number
                warm, _ = export_model(root / "warm", "tiny")
                for way in WAYS:
                    log_once(warm, way, exp_id)
            for shape in shapes:
                model_dir, params = export_model(root / shape, shape)
                mib = round(sum(p.stat().st_size for p in model_dir.iterdir()) / 2**20, 1)
                for way in ("files", "old"):
                    row = {"shape": shape, "params": params, "exported_mib": mib, **log_once(model_dir, way, exp_id)}
                    print(f"{shape} {way}: {row['seconds']:.2f} s (load {row['load_s']:.2f}), "
                          f"{row['logged_mib']} MiB logged", file=sys.stderr)
                    rows.append(row)
        finally:
            set_fluent_tracking_uri(before)
    by = {(r["shape"], r["way"]): r for r in rows}
    for shape in shapes:   # the speed-up, on the new row
        by[(shape, "files")]["speedup_vs_old"] = round(by[(shape, "old")]["seconds"] / by[(shape, "files")]["seconds"], 1)
    met = {"files_weights_byte_identical": all(r["weights_byte_identical"] for r in rows if r["way"] == "files")}
    if "350m" in shapes:
        met["files_350m_within_10s"] = by[("350m", "files")]["seconds"] <= GOALS["files_seconds_max_350m"]
    return Record(suite="register-speed", study="register: load + re-save vs the exported files as they are",
                  command=a.command, machine=machine_info(), rows=rows, goals=GOALS, goal_met=met,
                  settings={"shapes": {s: SHAPES[s] for s in shapes}, "dtype": "bfloat16", "store": "sqlite",
                            "warm_up": not a.smoke})
