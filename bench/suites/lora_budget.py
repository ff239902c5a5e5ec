"""LoRA in a 40 GiB budget: what a Llama-3-8B layer keeps for backward under every recompute policy (CPU, exact).

    python -m bench lora-budget --out bench/results/lora_budget_8b.json      # CPU, ~1-2 min
    python -m bench lora-budget --smoke --out /tmp/lb                         # tiny shape, seconds

Round 3 asks for ≥ 16,000 real tok/s at ≤ 40 GiB for LoRA r 16 on all linears of the 8B shape, 8 × 2048 packed
tokens. The speeds are GPU measurements (`lora_bench_packtrain.json`: full recompute; the no-recompute speed is an
input, `--no-ac-tok-s`); this suite measures the other half of the question, which needs no GPU: the bytes.

One decoder layer of the 8B shape (the product's `apply_adapter`: frozen bf16 base, fp32 adapter, bf16
autocast, SDPA causal attention: flash on the CPU, like varlen on the GPU it keeps only q, k, v, output and the
log-sum-exp) runs one forward at two token counts under bench/saved_graph.py, which sees every aten op and every
tensor autograd saves. Bytes per token are the difference of the two (what is constant, the adapter's bf16 weight
copies, drops out); FLOPs per token are the larger forward's (attention at one causal sequence of that length).
From that one graph, as the product's GPU path runs it (inside torch.compile: SavedGraph.policy(compiled=True)):

  none          what autograd keeps (eager; inductor's partitioner keeps less by recomputing element-wise ops)
  selective     the outputs of every matrix product and the attention kept, everything else recomputed: the
                fewest bytes without recomputing a matrix product (train.activation_checkpointing=selective)
  frontier      every subset of those 8 ops kept, Pareto-optimal in (bytes, recompute FLOPs)
  full          the layer's input only, the forward recomputed as far as backward needs

and with peft's per-branch input cast off (`cast_input_dtype_enabled=False`, what packtrain's bf16 LoRA training
does: model.lora.adapter_input_casts; bitwise the same loss and gradients under autocast, checked here) as a
second variant. Each policy is projected to the step — the measured full-recompute step's peak plus what its
layers keep beyond their inputs — and its recompute FLOPs priced at the measured matrix rate on top of the
no-recompute step: an optimistic estimate of its speed. The cheapest mix within the budget puts k layers on one
frontier policy and the rest on another. Offload to host memory is priced as the bandwidth it needs (what must
leave the GPU during the forward) and, at the link's rate, combined with recompute for the rest.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.harness import GIB, Record, machine_info, measure_host_link
from bench.lora_flops import LORA_TARGETS
from bench.suites.lora import SHAPES
from packtrain.train.selective_ac import ATTENTION, keeps

SUMMARY = "LoRA 8B in 40 GiB: bytes kept and FLOPs recomputed under every selective-recompute policy (exact, CPU)"
DEVICE = "cpu"
RESULTS = Path(__file__).resolve().parents[1] / "results"
GOAL = {"tok_per_s": 16_000, "peak_gib_max": 40.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", choices=list(SHAPES), default="llama3-8b")
    p.add_argument("--tokens", default="512,1024",
                   help="two token counts of the layer's forward (bytes: the per-token slope; attention FLOPs: the "
                        "larger, one causal sequence — about the packed lognormal documents' Σs²/Σs)")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--gib", type=float, default=GOAL["peak_gib_max"], help="the memory budget")
    p.add_argument("--goal-tok-s", type=float, default=GOAL["tok_per_s"])
    p.add_argument("--no-ac-tok-s", type=float, default=16_239.0,
                   help="the measured no-recompute speed of the same run (docs/design.md, field notes, third "
                        "round: 8B LoRA, no AC, 96.1 GiB)")
    p.add_argument("--matmul-tflops", type=float, default=790.0,
                   help="the measured bf16 matrix rate of the GPU (recompute priced at it: an optimistic bound)")
    p.add_argument("--host-link-gbs", type=float, default=64.0,
                   help="host↔GPU bandwidth per direction, GB/s, where no GPU is there to measure it (PCIe 5.0 x16 "
                        "by specification); on a CUDA machine the suite measures it (pinned device→host copies on "
                        "a side stream while bf16 matmuls run)")
    p.add_argument("--full-ac-record", type=Path, default=RESULTS / "lora_bench_packtrain.json")


def _layer(spec: dict, r: int):
    """One decoder layer of `spec` with the product's LoRA (frozen bf16 base, fp32 adapter), its RoPE module."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from packtrain.config.train import AdapterConfig
    from packtrain.model.lora import apply_adapter

    torch.manual_seed(0)
    cfg = LlamaConfig(**{**spec, "num_hidden_layers": 1, "vocab_size": 256}, attn_implementation="sdpa",
                      use_cache=False)
    model = LlamaForCausalLM(cfg)
    peft_model = apply_adapter(model, AdapterConfig(type="lora", r=r, alpha=2.0 * r, dropout=0.0,
                                                    target_modules=LORA_TARGETS), base_dtype=torch.bfloat16)
    return peft_model, model.model.layers[0], model.model.rotary_emb


def _graph(peft_model, layer, rope, h: int, tokens: int):
    import torch

    from bench.saved_graph import record

    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(1, tokens, h, generator=g).to(torch.bfloat16).requires_grad_()
    pos = torch.arange(tokens)[None]
    cos, sin = rope(x, pos)

    def forward(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))

    return record(forward, x, shared=(cos, sin), params=list(peft_model.parameters()), module=layer), forward, x


def _bitwise_same_without_cast(peft_model, forward, x) -> bool:
    """Loss, input gradient and adapter gradients with peft's input cast on and off: bitwise equal?"""
    import torch

    from packtrain.model.lora import adapter_input_casts, lora_layers

    out = []
    for on in (True, False):
        with adapter_input_casts(lora_layers(peft_model), on):
            xx = x.detach().clone().requires_grad_()
            loss = forward(xx).float().pow(2).mean()
            loss.backward()
        out.append([loss.detach(), xx.grad] + [p.grad for p in peft_model.parameters() if p.requires_grad])
        for p in peft_model.parameters():
            p.grad = None
    return all(torch.equal(a, b) for a, b in zip(*out, strict=True))


def _policies(g_small, g_big, t_small: int, t_big: int, rank: int) -> list[dict]:
    """Per-token bytes (the slope between the two token counts) and FLOPs of each policy, as compiled."""
    def per_token(cached_small, cached_big):
        a, b = g_small.policy(cached_small, compiled=True), g_big.policy(cached_big, compiled=True)
        return ((b.kept_bytes - a.kept_bytes) / (t_big - t_small), b.recompute_flops / t_big, b.kept)

    ex_s, ex_b = g_small.expensive(rank), g_big.expensive(rank)
    names = [g_big.ops[i].where or g_big.ops[i].name for i in ex_b]
    if [g_small.ops[i].where for i in ex_s] != [g_big.ops[i].where for i in ex_b]:
        raise RuntimeError(f"the two forwards differ in their expensive ops: {names}")
    eager = (g_big.policy(set(ex_b)).kept_bytes - g_small.policy(set(ex_s)).kept_bytes) / (t_big - t_small)
    rows = []
    for label, cs, cb in (("none", None, None), ("selective", set(ex_s), set(ex_b)), ("full", set(), set())):
        bpt, fpt, kept = per_token(cs, cb)
        rows.append({"policy": label, "kept_bytes_per_token": bpt, "recompute_flops_per_token": fpt,
                     "kept_by_op": kept, **({"eager_kept_bytes_per_token": eager} if label == "selective" else {})})
    by_big = dict(zip(ex_b, ex_s, strict=True))
    for cached, _ in g_big.frontier(rank, compiled=True):
        bpt, fpt, _kept = per_token({by_big[i] for i in cached}, set(cached))
        rows.append({"policy": "frontier", "cached": sorted(g_big.ops[i].where or g_big.ops[i].name
                                                            for i in cached),
                     "kept_bytes_per_token": bpt, "recompute_flops_per_token": fpt})
    return rows


def _full_plan_components_gib(spec: dict, args) -> dict:
    """The memory planner's components at its peak phase for the measured run's configuration, full recompute."""
    from bench.lora_variants import packtrain_overrides
    from bench.packtrain_runs import planner_prediction
    from packtrain.config import load_run_config

    ns = argparse.Namespace(budget=args.budget, rows=args.rows, attention="varlen", loss="fused", no_compile=False,
                            ac="full", lr=2e-4, r=args.r, alpha=2.0 * args.r, dropout=0.0, peak_tflops=790.0,
                            packtrain_set=[])
    cfg = load_run_config("tiny-cpu", packtrain_overrides(spec, ns, argparse.Namespace(type="cuda")))
    return planner_prediction(cfg, args.budget, spec["vocab_size"], "cuda").get("planner_components_gib") or {}


def _anchor(spec: dict, args) -> tuple[float, str]:
    """The step peak with full recompute that the projections start from: the GPU record's measured one when it is
    this configuration, else the planner's."""
    rec = json.loads(args.full_ac_record.read_text(encoding="utf-8")) if args.full_ac_record.exists() else {}
    ov = rec.get("overrides") or []
    same = (rec.get("shape", {}).get("hidden_size") == spec["hidden_size"] and rec.get("rows") == args.rows
            and rec.get("budget") == args.budget and rec.get("activation_checkpointing") == "full"
            and f"train.adapter.r={args.r}" in ov and "train.compile=true" in ov
            and next((o for o in reversed(ov) if o.startswith("train.precision=")), "") == "train.precision=bf16")
    if same and rec.get("peak_alloc_gib"):
        return rec["peak_alloc_gib"], f"measured: {args.full_ac_record.name} (full recompute, peak allocated)"
    comps = _full_plan_components_gib(spec, args)
    return sum(comps.values()), "the memory planner at full recompute (no GPU record of this configuration)"


def _tok_s(args, recompute_flops_per_token: float) -> int:
    """The speed estimate: the no-recompute step plus `recompute_flops_per_token` (all layers) at the matrix rate."""
    return round(1.0 / (1.0 / args.no_ac_tok_s + recompute_flops_per_token / (args.matmul_tflops * 1e12)))


def _full_kept(pols: list[dict]) -> float:
    """Bytes per token a layer keeps under full recompute (its input): what the anchor's layers keep."""
    return next(r for r in pols if r["policy"] == "full")["kept_bytes_per_token"]


def _allowed_kept(args, gib: float, anchor_gib: float, full_kept: float, layers: int) -> float:
    """Kept bytes per token, summed over the layers, that keep the step within `gib` (from the anchor)."""
    return (gib - anchor_gib) * GIB / (args.rows * args.budget) + full_kept * layers


def _project(rows: list[dict], spec: dict, args, anchor_gib: float) -> None:
    """Each policy at the step: peak GiB = the full-recompute anchor + what its layers keep beyond their inputs,
    and the speed estimate (its recompute at the matrix rate on top of the no-recompute step)."""
    tokens, layers = args.rows * args.budget, spec["num_hidden_layers"]
    full = _full_kept(rows)
    for r in rows:
        r["activations_gib"] = round(r["kept_bytes_per_token"] * tokens * layers / GIB, 2)
        r["peak_gib"] = round(anchor_gib + (r["kept_bytes_per_token"] - full) * tokens * layers / GIB, 2)
        rec = r["recompute_flops_per_token"] * layers
        r["recompute_gflop_per_token"] = round(rec / 1e9, 3)
        r["tok_per_s_bound"] = _tok_s(args, rec)
        r["fits"] = r["peak_gib"] <= args.gib


def _cheapest_mix(frontier: list[dict], allowed_bytes_per_token: float, layers: int) -> dict | None:
    """The least recompute with every layer on one of two frontier policies (k layers on one, the rest on the
    other) whose kept bytes per token, summed over the layers, stay within `allowed_bytes_per_token`."""
    best = None
    for lo in frontier:
        for hi in frontier:
            for k in range(layers + 1):
                kept = k * hi["kept_bytes_per_token"] + (layers - k) * lo["kept_bytes_per_token"]
                rec = k * hi["recompute_flops_per_token"] + (layers - k) * lo["recompute_flops_per_token"]
                if kept <= allowed_bytes_per_token and (best is None or rec < best["rec"]):
                    best = {"rec": rec, "low": lo.get("cached"), "high": hi.get("cached"), "layers_high": k}
    if best is None:
        return None
    rec = best.pop("rec")
    return {**best, "layers": layers, "recompute_gflop_per_token": round(rec / 1e9, 3)}


def _forward_share(g, rank: int) -> float:
    """The forward's share of the step's FLOPs without recompute: the frozen base's products cost as much again
    in backward (input gradients only), the adapter's twice (input and weight gradients), attention 2.5×. A time
    share would be smaller still (backward has more memory-bound work), so offload bandwidth from it is a floor."""
    fwd = bwd = 0.0
    for o in g.ops:
        fwd += o.flops
        if o.name in ATTENTION:
            bwd += 2.5 * o.flops
        elif o.flops:
            bwd += (1.0 if keeps(o.name, o.inner, o.out, rank) else 2.0) * o.flops
    return fwd / (fwd + bwd)


def _token_counts(text: str) -> tuple[int, int]:
    """--tokens "A,B" → (A, B): two whole token counts, 0 < A < B (SystemExit naming the option otherwise)."""
    parts = [t.strip() for t in text.split(",")]
    if len(parts) != 2 or not all(t.isdigit() for t in parts) or not 0 < int(parts[0]) < int(parts[1]):
        raise SystemExit(f"--tokens {text!r}: two whole token counts A,B with 0 < A < B (e.g. 512,1024)")
    return int(parts[0]), int(parts[1])


def _measure_variants(spec: dict, r: int, t_small: int, t_big: int) -> tuple[dict, dict, dict]:
    """The layer's saved-tensor graphs at both token counts with peft's input cast on and off:
    ({variant: its policies}, {"input_cast_off_bitwise_equal": bool}, {variant: the larger graph})."""
    from packtrain.model.lora import adapter_input_casts, lora_layers

    peft_model, layer, rope = _layer(spec, r)
    variants, checks, graphs = {}, {}, {}
    for name, cast in (("peft input cast (peft's default)", True), ("input cast off", False)):
        with adapter_input_casts(lora_layers(peft_model), cast):
            g_small, _, _ = _graph(peft_model, layer, rope, spec["hidden_size"], t_small)
            g_big, forward, x = _graph(peft_model, layer, rope, spec["hidden_size"], t_big)
        variants[name], graphs[name] = _policies(g_small, g_big, t_small, t_big, r), g_big
        if not cast:
            checks["input_cast_off_bitwise_equal"] = _bitwise_same_without_cast(peft_model, forward, x)
    return variants, checks, graphs


def run(args, out: Path) -> Record:
    spec = SHAPES["smoke" if args.smoke else args.shape]
    t_small, t_big = (32, 64) if args.smoke else _token_counts(args.tokens)
    variants, checks, graphs = _measure_variants(spec, args.r, t_small, t_big)
    anchor_gib, anchor_source = _anchor(spec, args)
    tokens, layers = args.rows * args.budget, spec["num_hidden_layers"]
    rows, mixes = [], {}
    goal_s = 1.0 / args.goal_tok_s - 1.0 / args.no_ac_tok_s
    allowed_gflop = max(0.0, goal_s) * args.matmul_tflops * 1e12 / 1e9
    for name, pols in variants.items():
        _project(pols, spec, args, anchor_gib)
        allowed = _allowed_kept(args, args.gib, anchor_gib, _full_kept(pols), layers)
        mixes[name] = _cheapest_mix([p for p in pols if p["policy"] == "frontier"], allowed, layers)
        for p in pols:
            p["variant"] = name
        rows += pols
    sel = next(r for r in rows if r["policy"] == "selective" and r["variant"] == "input cast off")
    share = _forward_share(graphs["input cast off"], args.r)
    fwd_s = share * tokens / args.goal_tok_s
    must_leave_gib = max(0.0, sel["peak_gib"] - args.gib)
    offload_gbs = must_leave_gib * GIB / 1e9 / fwd_s
    link = None if args.smoke else measure_host_link()
    link_gbs = link["d2h_beside_matmuls_gb_per_s"] if link else args.host_link_gbs
    full_rec = _full_ac_check(args, spec, rows)

    def bound(mix: dict | None) -> int | None:
        return _tok_s(args, mix["recompute_gflop_per_token"] * 1e9) if mix else None

    mix_bound = bound(mixes.get("input cast off"))
    # offload at the link's rate during the forward, the rest by recompute: the offloaded bytes come off the budget
    pols = variants["input cast off"]
    full_kept = _full_kept(pols)
    offloadable_gib = link_gbs * 1e9 * fwd_s / GIB
    allowed_off = _allowed_kept(args, args.gib + offloadable_gib, anchor_gib, full_kept, layers)
    off_mix = _cheapest_mix([p for p in pols if p["policy"] == "frontier"], allowed_off, layers)
    off_bound = bound(off_mix)
    summary = {
        "anchor_gib": anchor_gib, "anchor": anchor_source,
        "allowed_kept_kib_per_token_layer": round(_allowed_kept(args, args.gib, anchor_gib, full_kept, layers)
                                                  / layers / 1024, 1),
        "recompute_allowed_gflop_per_token": round(allowed_gflop, 3),
        "cheapest_mix_within_budget": mixes, "cheapest_mix_tok_per_s_bound": mix_bound,
        "offload": {"must_leave_gib_per_step": round(must_leave_gib, 2), "forward_share": round(share, 3),
                    "forward_s_at_goal": round(fwd_s, 3), "needed_gb_per_s": round(offload_gbs, 1),
                    "host_link_gb_per_s": link_gbs,
                    "host_link_source": ("measured: pinned device→host copies beside bf16 matmuls" if link
                                         else "by specification: PCIe 5.0 x16, not measured"), "host_link": link,
                    "from": "the selective policy (input cast off): what exceeds the budget leaves the GPU during "
                            "the forward, at the goal's speed; the forward's share of the step is its FLOP share "
                            "(an upper bound on its time share, so the bandwidth is a floor)"},
        "offload_and_recompute": {"offloadable_gib_per_step": round(offloadable_gib, 2), "mix": off_mix,
                                  "tok_per_s_bound": off_bound,
                                  "assumes": "the link's full rate during the whole forward (and back during "
                                             "backward), perfectly overlapped with compute"},
        "full_ac_check": full_rec, **checks,
    }
    goal_met = {"tok_per_s_at_budget": bool(mix_bound and mix_bound >= args.goal_tok_s),
                "offload_within_host_link": offload_gbs <= link_gbs,
                "offload_and_recompute_bound": bool(off_bound and off_bound >= args.goal_tok_s)}
    print(json.dumps({k: summary[k] for k in ("anchor_gib", "recompute_allowed_gflop_per_token",
                                              "cheapest_mix_tok_per_s_bound", "offload")}, indent=1))
    png = plot_frontier(rows, args.goal_tok_s, args.gib, args.record_path.with_suffix(".png"))
    summary["plot"] = png.name
    return Record(suite="lora-budget", command=args.command, machine=machine_info(),
                  study="LoRA 8B at ≤ 40 GiB: the bytes each recompute policy keeps, measured on the CPU",
                  settings={"shape": spec, "tokens": [t_small, t_big], "rows": args.rows, "budget": args.budget,
                            "r": args.r, "gib": args.gib, "no_ac_tok_s": args.no_ac_tok_s,
                            "matmul_tflops": args.matmul_tflops, "host_link_gbs": args.host_link_gbs},
                  rows=rows, goals={**GOAL, "offload_gbs_max": link_gbs}, goal_met=goal_met,
                  extra={"summary": summary})


def plot_frontier(rows: list[dict], goal_tok_s: float, gib: float, path: Path) -> Path:
    """The policies of the record as step peak GiB against the speed bound, the goal's corner marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.6), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for variant, style in (("input cast off", "o-"), ("peft input cast (peft's default)", "x")):
        pts = sorted((r["peak_gib"], r["tok_per_s_bound"]) for r in rows
                     if r["variant"] == variant and (r["policy"] == "none" or "off" in variant and r["policy"] == "frontier"))
        if pts:
            ax.plot(*zip(*pts, strict=True), style, ms=4, label=f"{variant}: "
                    + ("the frontier of selective policies, and no recompute" if "off" in variant else "no recompute"))
    for r in rows:
        if r["variant"] == "input cast off" and r["policy"] in ("none", "selective", "full"):
            ax.annotate(r["policy"], (r["peak_gib"], r["tok_per_s_bound"]), textcoords="offset points",
                        xytext=(6, -12), fontsize=9)
    ax.axvline(gib, color="tab:red", lw=1)
    ax.axhline(goal_tok_s, color="tab:green", lw=1)
    ax.fill_between([0, gib], goal_tok_s, ax.get_ylim()[1], color="tab:green", alpha=0.12,
                    label=f"the goal: ≥ {goal_tok_s:,.0f} tok/s at ≤ {gib:.0f} GiB")
    ax.set_xlim(0, None)
    ax.set_xlabel("step peak GiB (8 × 2048 tokens, 32 layers; from the measured full-recompute step)")
    ax.set_ylabel("tok/s estimate (recompute at the matrix rate)")
    ax.set_title("LoRA r 16 on a Llama-3-8B shape: what each recompute policy keeps and costs")
    ax.legend(fontsize=8, loc="lower right")
    from packtrain.telemetry.plots import save_figure

    return save_figure(fig, path)


def _full_ac_check(args, spec: dict, rows: list[dict]) -> dict | None:
    """The measured full-recompute run against this suite's FLOPs: the rate its recompute implies."""
    if args.smoke or not args.full_ac_record.exists():
        return None
    rec = json.loads(args.full_ac_record.read_text(encoding="utf-8"))
    full = next(r for r in rows if r["policy"] == "full" and r["variant"].startswith("peft"))
    implied = (rec["mfu_with_recompute"] - rec["useful_mfu"]) * rec["machine"].get("peak_tflops", 790.0) * 1e12 \
        / rec["real_tok_per_s"] / 1e9
    return {"record": args.full_ac_record.name, "real_tok_per_s": round(rec["real_tok_per_s"]),
            "peak_alloc_gib": round(rec["peak_alloc_gib"], 2),
            "record_recompute_gflop_per_token": round(implied, 3),
            "measured_here_gflop_per_token": full["recompute_gflop_per_token"],
            "note": "the record counts the decoder's forward (2·N + attention at its documents); this suite "
                    "the layer's matrix products and attention at one causal sequence of its token count"}
