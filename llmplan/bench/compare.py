"""`llmplan bench`, second half: what the ranks measured held against llmplan's predictions, one Row per
measured item (GEMMs, collectives, the reference layer's saved and sent bytes, attention cases)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmplan.bench.run import BenchConfig, BenchRun, attention_flops, layer_shape
from llmplan.cost.comm import tp_transfers
from llmplan.cost.compute import attention_fraction, attention_rate_ratio, gemm_efficiency, head_dim_attention_ratio
from llmplan.cost.memory import layer_activation_bytes
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import AttentionKernel, ParallelPlan
from llmplan.topology.collectives import bus_factor, collective_time
from llmplan.topology.placement import GroupSpan, span_of_ranks

LAYER_TOLERANCE = 0.01
"""Saved-bytes tolerance: the formula neglects the layer norms' saved mean and 1/std (2 tensors of s·b per
norm) and counts K/V at the KV-head width where unfused GQA attention keeps copies expanded to the query
heads (added to the expectation); what remains is under 1%."""


def _case_model(cfg: BenchConfig, case: dict[str, Any]) -> ModelSpec:
    if case["name"] == "model":
        return cfg.model
    return cfg.model.model_copy(update={"head_dim": case["qk"], "num_attention_heads": case["a"],
                                        "num_key_value_heads": case["kv"], "kv_lora_rank": None, "q_lora_rank": None,
                                        "qk_nope_head_dim": None, "qk_rope_head_dim": None, "v_head_dim": None})


@dataclass(frozen=True)
class Row:
    component: str
    item: str
    predicted: float
    measured: float
    unit: str
    tolerance: float | None
    """Relative tolerance of the verdict; None: no verdict (e.g. times measured on CPU)."""
    note: str = ""

    @property
    def error(self) -> float:
        return (self.measured - self.predicted) / self.predicted if self.predicted else 0.0

    @property
    def verdict(self) -> str:
        if self.tolerance is None:
            return "n/a"
        return "ok" if abs(self.error) <= self.tolerance else "MISMATCH"


def bench_model(cfg: BenchConfig) -> tuple[ModelSpec, ParallelPlan]:
    """The one-layer model and plan whose formulas describe the reference layer the workers ran."""
    sh = layer_shape(cfg)
    m = ModelSpec(name="bench-layer", model_type="gpt", hidden_size=sh["h"], intermediate_size=sh["f"],
                  num_hidden_layers=1, num_attention_heads=sh["a"], num_key_value_heads=sh["kv"], head_dim=sh["d"],
                  vocab_size=cfg.model.vocab_size, max_position_embeddings=max(sh["s"], 1), gated_mlp=sh["gated"],
                  attention_dropout=0.1, hidden_dropout=0.1)  # the reference layer uses dropout 0.1
    # the reference layer's softmax is torch.softmax over the masked scores (bench.layer), PyTorch's own kernel in the
    # scores' dtype: the eager path, never Megatron's fused kernel or its fp32 fallback
    return m, ParallelPlan(tp=cfg.nproc, micro_batch=sh["b"], global_batch=sh["b"], seq_len=sh["s"],
                           flash_attention=False, softmax_kernel="eager", dtype="bf16")


def expected_saved_bytes(cfg: BenchConfig, recompute: str, sp: bool, mask_bytes: int) -> float:
    """Korthikanti's per-layer activations for the reference layer, plus what this torch build keeps on top:
    dropout masks wider than 1 byte (CPU) and unfused GQA's expanded K/V copies. Derived: docs/formulas.md"""
    m, plan = bench_model(cfg)
    plan = plan.model_copy(update={"recompute": recompute, "sp": sp})
    expected = float(layer_activation_bytes(m, plan, False))
    if recompute == "full":
        return expected
    s, b, h, t = plan.seq_len, plan.micro_batch, m.hidden_size, plan.tp
    s_local = s / t if sp else s
    masks = 2 * s_local * b * h + (m.num_attention_heads / t * s * s * b if recompute == "none" else 0)
    heads, kvh = m.num_attention_heads // t, max(m.kv_heads // t, 1)
    # unfused GQA expands K and V to the query heads: copies of 2·s·b·d·heads bytes instead of the KV width
    gqa = 2 * 2 * s * b * m.d_head * (heads - kvh) if heads > kvh else 0.0
    return expected + (mask_bytes - 1) * masks + gqa


def expected_wire_bytes(cfg: BenchConfig, recompute: str, sp: bool) -> float:
    m, plan = bench_model(cfg)
    plan = plan.model_copy(update={"recompute": recompute, "sp": sp})
    group = GroupSpan("tp", cfg.nproc, 1, 1, cfg.nproc, 1, 1, 0)
    return sum(float(x.bytes) for x in tp_transfers(m, plan, group))


def compare(cfg: BenchConfig, run: BenchRun) -> list[Row]:
    rows: list[Row] = []
    if not run.ranks:
        return rows
    r0 = min(run.ranks, key=lambda r: r["rank"])
    on_gpu = cfg.backend == "nccl"
    gpu = cfg.cluster.system.gpu
    dtype = "bf16" if on_gpu else "fp32"
    time_note = "" if on_gpu else "CPU timing, not comparable to the profile's GPU"
    for g in r0.get("gemm", []):
        eff = gemm_efficiency(gpu, dtype if dtype in gpu.tflops else "bf16", min(g["m"], g["k"], g["n"]))
        predicted = 2 * g["m"] * g["k"] * g["n"] / (gpu.peak_flops("bf16") * eff)
        rows.append(Row("gemm", f"{g['name']} {g['m']}x{g['k']}x{g['n']}", predicted, g["seconds"], "s",
                        0.25 if on_gpu else None, time_note or f"assumed efficiency {eff:.2f}"))
    span = span_of_ranks(list(range(cfg.nproc)), cfg.cluster)
    for c in r0.get("collectives", []):
        ct = collective_time(c["op"], c["bytes"], span, cfg.cluster.system)
        rows.append(Row("collective", f"{c['op']} {c['bytes'] / 2**20:.1f} MiB x {c['ranks']}", ct.seconds,
                        c["seconds"], "s", 0.25 if on_gpu else None,
                        time_note
                        or f"busbw {c['bytes'] * bus_factor(c['op'], c['ranks']) / c['seconds'] / 1e9:.1f} GB/s"))
    for lay in r0.get("layer", []):
        label = f"recompute={lay['recompute']} sp={'on' if lay['sp'] else 'off'}"
        rows.append(Row("layer saved bytes", label,
                        expected_saved_bytes(cfg, lay["recompute"], lay["sp"], lay["mask_bytes"]),
                        lay["saved_bytes"], "B", LAYER_TOLERANCE,
                        f"dropout masks {lay['mask_bytes']} B/element here"))
        if cfg.nproc > 1:
            rows.append(Row("layer TP bytes sent", label, expected_wire_bytes(cfg, lay["recompute"], lay["sp"]),
                            lay["wire_bytes"], "B", 1e-9,
                            ", ".join(f"{k} x{v}" for k, v in sorted(lay["calls"].items()))))
        if lay.get("peak_allocated"):
            rows.append(Row("layer peak allocated", label, 0.0, lay["peak_allocated"], "B", None, "GPU only"))
    rows += attention_rows(cfg, r0.get("attention", []), on_gpu)
    return rows


def attention_rows(cfg: BenchConfig, measured: list[dict[str, Any]], on_gpu: bool) -> list[Row]:
    """Each timed attention case (forward + backward) against llmplan's price of it, 3 x its forward FLOPs at
    the kernel's rate (attention_fraction) on one call of its length (attention_rate_ratio); per kernel, the
    measured rate ratio of the model's head dimension to the reference one against head_dim_attention_ratio's. Cases a
    backend could not run say why."""
    gpu = cfg.cluster.system.gpu
    rows: list[Row] = []
    rates: dict[str, dict[str, float]] = {}
    for c in measured:
        label = f"{c['kernel']} b{c['b']} a{c['a']}/{c['kv']} s{c['s']} d{c['qk']}"
        if c.get("error"):
            rows.append(Row("attention", label, 0.0, 0.0, "s", None, c["error"][:60]))
            continue
        kind: AttentionKernel = "flash2" if c["kernel"] == "flash2" else "native"
        plan = ParallelPlan(attention_kernel=kind, seq_len=c["s"], micro_batch=c["b"], global_batch=c["b"])
        m = _case_model(cfg, c)  # the kernel's asymptote times its rate on one call of s tokens (the curve)
        frac = float(attention_fraction(gpu, plan, m) * attention_rate_ratio(m, plan, gpu))
        predicted = 3 * attention_flops(c) / (gpu.sustained_flops("bf16") * frac)
        rows.append(Row("attention", label, predicted, c["seconds"], "s", 0.25 if on_gpu else None,
                        f"{3 * attention_flops(c) / c['seconds'] / 1e12:.0f} TFLOP/s counted" if on_gpu else ""))
        rates.setdefault(c["kernel"], {})[c["name"]] = attention_flops(c) / c["seconds"]
    for kernel, r in rates.items():
        ref = next((n for n in r if n != "model"), None)
        if "model" not in r or ref is None:
            continue
        case = {c["name"]: c for c in measured if c["kernel"] == kernel}
        d0 = gpu.flash2_softmax_head_dim if kernel == "flash2" else gpu.attention_softmax_head_dim
        predicted = head_dim_attention_ratio(_case_model(cfg, case["model"]), d0) / head_dim_attention_ratio(
            _case_model(cfg, case[ref]), d0)
        rows.append(Row("attention head-dim curve", f"{kernel}: d{case['model']['qk']} / d{case[ref]['qk']} rate",
                        predicted, r["model"] / r[ref], "x", 0.1 if on_gpu else None, f"profile d0 {d0:g}"))
    return rows
