"""What-if: Megatron-Core's MXFP8 LM head (fp8_output_proj) on the mbridge-moe rows whose recipe sets it
(docs/validation.md#qwen235). Nothing priced, nothing written.

Megatron-Core builds the output layer as TELMHeadColumnParallelLinear (a Transformer Engine Linear, so an MXFP8
GEMM on cuBLASLt) when fp8_output_proj is set with the mxfp8 recipe (NVIDIA/Megatron-LM 3f6a2ed844, #4825,
in Megatron-Bridge v0.5.0's pin d0b3b775 and v0.6.0's cd4afffa). Megatron-Bridge's performance configs set it for
DeepSeek-V3 and GPT-OSS 120B on GB200 / GB300 under MXFP8 from v0.5.0 (26.06: scripts/performance/configs/
deepseek/deepseek_llm_pretrain.py, gpt_oss/gpt_oss_llm_pretrain.py), and at v0.6.0 (26.08) also DeepSeek-V3 on
B300 (perf_recipes/deepseek/{gb200,gb300,b300}/deepseek_v3.py, gpt_oss/common.py); never for Qwen3. llmplan prices
every LM head in bf16 (cost.compute.output_seconds). The what-if re-prices those rows' output GEMM (every head: MTP
runs it again) at the MXFP8 rate and shape efficiency times block_scaled_gemm_factor, as mtp_projection_seconds
prices a TE Linear; the loss is unchanged.

    python benchmarks/lmhead_mxfp8_whatif.py [--family]   (about 30 s; --family: the mbridge-moe family's median
    |error| over every scored row, with and without the what-if on the rows above, about 3 min)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A

import llmplan.cost.compute as C
import llmplan.cost.step as S
from llmplan.cost.flops import logits_flops
from llmplan.cost.gemm import block_scaled_gemm_factor, gemm_shape_efficiency
from llmplan.cost.params import padded_vocab
from llmplan.estimate import estimate_training

BF16_HEAD = C.output_seconds


def recipe_sets_it(rec: dict) -> bool:
    """Whether the row's Megatron-Bridge release sets fp8_output_proj for its model, GPU and precision."""
    rid, gpu = rec["id"], str(rec["hardware"]["gpu"]).lower()
    if "mxfp8" not in rid or not rid.startswith(("mbridge-26.06", "mbridge-26.08")):
        return False
    rack = gpu.startswith(("gb200", "gb300"))
    if "deepseekv3" in rid:
        return rack or (gpu.startswith("b300") and rid.startswith("mbridge-26.08"))
    return "gpt-oss-120b" in rid and rack


def mxfp8_head(m, plan, gpu):  # type: ignore[no-untyped-def]
    """output_seconds with the head's GEMMs at the MXFP8 rate (a TE Linear on cuBLASLt)."""
    head, loss = BF16_HEAD(m, plan, gpu)
    rows, cols = plan.seq_len / plan.cp * plan.micro_batch, padded_vocab(m.vocab_size, plan.tp) / plan.tp
    flops = (1 + m.num_nextn_predict_layers) * logits_flops(m, plan)
    bf16 = flops / (gpu.sustained_flops("bf16") * gemm_shape_efficiency(gpu, "bf16", rows, cols, m.hidden_size))
    mx = flops / (gpu.sustained_flops("mxfp8") * gemm_shape_efficiency(gpu, "mxfp8", rows, cols, m.hidden_size))
    return head - bf16 + mx * block_scaled_gemm_factor(m, plan, "mxfp8", "lm_head"), loss


def signed(rec: dict, head) -> float:  # type: ignore[no-untyped-def]
    C.output_seconds = S.output_seconds = head
    try:
        m, c, p = A.record_setup(rec, "mbridge-moe")  # type: ignore[misc]
        return float(estimate_training(m, c, p).throughput.tokens_per_s) / c.num_gpus \
            / rec["measured"]["tokens_per_s_per_gpu"] - 1
    finally:
        C.output_seconds = S.output_seconds = BF16_HEAD


def family_median() -> tuple[int, float, float]:
    """(rows, median |error| %, the same with the what-if) over every scored mbridge-moe time row."""
    base: list[float] = []
    what: list[float] = []
    for rec in yaml.safe_load(A.DEFAULT_RUNS.read_text()):
        if A.family(rec["id"]) != "mbridge-moe":
            continue
        try:
            rows = [(p, m) for q, p, m in A.predict(rec, "mbridge-moe") if q != "fits"]
        except (A.LlmplanError, ValueError):  # the rows accuracy.py skips with a reason
            continue
        base += [abs(p - m) / m for p, m in rows]
        if rows and recipe_sets_it(rec):
            C.output_seconds = S.output_seconds = mxfp8_head
            try:
                rows = [(p, m) for q, p, m in A.predict(rec, "mbridge-moe") if q != "fits"]
            finally:
                C.output_seconds = S.output_seconds = BF16_HEAD
        what += [abs(p - m) / m for p, m in rows]
    return len(base), 100 * statistics.median(base), 100 * statistics.median(what)


def main(argv: list[str]) -> int:
    if "--family" in argv:
        n, before, after = family_median()
        print(f"mbridge-moe: {n} rows, median |error| {before:.2f}% -> {after:.2f}%")
        return 0
    moved: dict[str, list[tuple[float, float]]] = {}
    for rec in yaml.safe_load(A.DEFAULT_RUNS.read_text()):
        if A.family(rec["id"]) != "mbridge-moe" or not recipe_sets_it(rec) or not A.predict(rec, "mbridge-moe"):
            continue
        before, after = signed(rec, BF16_HEAD), signed(rec, mxfp8_head)
        moved.setdefault(rec["model"]["name"].split(" ")[0], []).append((before, after))
        print(f"{rec['id'][7:80]:73s} {100 * before:+6.1f}% -> {100 * after:+6.1f}%")
    for name, pairs in moved.items():
        print(f"{name}: {len(pairs)} rows, median signed {100 * statistics.median(b for b, _ in pairs):+.1f}% -> "
              f"{100 * statistics.median(a for _, a in pairs):+.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
