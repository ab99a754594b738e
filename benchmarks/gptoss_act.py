"""GPT-OSS 120B's per-token gap against the candidates issue 40 names, each sized at the rows' shapes
(docs/validation.md#gptoss-act).

For every scored GPT-OSS 120B mbridge-moe / bridgecard row (benchmarks/gptoss_tokens.py's per_token): the
measured less the predicted time per token per GPU ("miss", us) and what each candidate costs per token per GPU
(us; all 36 layers of one token, the stage's parts x PP as gptoss_tokens.py counts them):

priced already (what llmplan charges, from its own functions, for scale):
* clamp  - the eager clamp of the fc1 output and its backward, rerun with moe_act (GLU_CLAMP_BYTES,
           expert_activation_extra_bytes; 0 with glu_clamp_fusion), at the row's achieved HBM rate;
* act    - the compiled weighted quick-GeGLU pass, forward and backward (activation_pass_bytes x 3 on the
           k rows of f_e; 0 on the fused MXFP8 grouped MLP's share);
* fc2b   - the eager expert fc2 bias (expert_bias_bytes; 0 with expert_bias_fusion);
* sync   - the blocking offset copy of each weighted quick-GeGLU call (geglu_offset_sync_seconds);
* pbias  - the attention output projection's bias added in its own pass (Megatron-Bridge's GPT-OSS bridge sets
           bias_dropout_fusion False: bias_add_bytes, priced from docs/validation.md#gptoss-act on);

not priced:
* rbias  - the router bias's gradient (RouterGatingLinearFunction.backward, grad_output.sum(0): read 2E);
* bgrad  - the BF16 weight-gradient GEMMs that carry a bias gradient in cuBLASLt's BGRADB epilogue (linear_qkv
           and the experts' fc1; MXFP8 takes it from tex.bgrad_quantize instead), as their FLOP share of the
           priced GEMM time; "x" is how many times slower those GEMMs would have to run to carry the whole miss.

Nothing here changes a prediction: `python benchmarks/gptoss_act.py` (about 10 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A  # noqa: E402
from gptoss_tokens import label, per_token  # noqa: E402

from llmplan.cost.elementwise import (activation_pass_bytes, bias_add_bytes,  # noqa: E402
                                      expert_activation_extra_bytes, expert_bias_bytes,
                                      fused_expert_activation_bytes)
from llmplan.cost.overhead import geglu_offset_sync_seconds  # noqa: E402


def gemm_flops(m) -> dict[str, float]:
    """Forward GEMM FLOPs per token of one layer by matmul, and the output layer's per layer."""
    h, q, kv, k, f = (m.hidden_size, m.num_attention_heads * m.d_head, m.num_key_value_heads * m.d_head,
                      m.num_experts_per_tok, m.expert_ffn)
    return {"qkv": 2 * h * (q + 2 * kv), "proj": 2 * q * h, "fc1": 2 * k * h * 2 * f, "fc2": 2 * k * f * h,
            "router": 2 * h * m.num_experts, "head": 2 * h * m.vocab_size / m.num_hidden_layers}


def candidates(rec: dict, row: dict) -> dict[str, float]:
    """us per token per GPU of each candidate for one row."""
    m, c, p = A.record_setup(rec, A.family(rec["id"]))
    bw, L = c.system.gpu.hbm_achieved_bytes_per_s, m.num_hidden_layers
    rows = m.num_experts_per_tok * m.expert_ffn  # (token, expert) rows x expert-FFN columns, a token
    us = 1e6 * L / bw  # bytes per token and layer -> us per token per GPU over the model
    clamp = 3 * float(expert_activation_extra_bytes(m, p)) * rows * us
    act = 3 * (activation_pass_bytes(m) - float(fused_expert_activation_bytes(m, p))) * rows * us
    fc2b = 3 * float(expert_bias_bytes(m, p)) * us
    tok = p.micro_batch * p.seq_len
    sync = 1e6 * float(geglu_offset_sync_seconds(m, p, L / p.pp, 0.0, c.system.gpu.host_op_factor)) / (
        p.num_microbatches * tok) * p.pp
    pbias = 3 * float(bias_add_bytes(m, p, True)) * m.hidden_size * us
    rbias = 2 * m.num_experts * us
    fl = gemm_flops(m)
    share = (fl["qkv"] + fl["fc1"]) / (3 * sum(fl.values()))
    bf16 = p.dtype == "bf16"
    bgrad = share * row["gemm"] * p.pp if bf16 else 0.0
    miss = row["meas"] - row["pred"]
    return {"miss": miss, "clamp": clamp, "act": act, "fc2b": fc2b, "sync": sync, "pbias": pbias,
            "rbias": rbias, "bgrad": bgrad, "x": 1 + miss / bgrad if bgrad else float("nan"), "share": share}


def main() -> int:
    recs = yaml.safe_load(A.DEFAULT_RUNS.read_text())
    print(f"{'row':20s} {'miss':>6s} | {'clamp':>5s} {'act':>5s} {'fc2b':>5s} {'sync':>5s} {'pbias':>5s} | "
          f"{'rbias':>5s} {'bgrad':>5s} {'x':>5s}")
    seen, share = set(), 0.0
    for rec in recs:
        row = per_token(rec)
        if not row or row["id"] in seen:
            continue
        seen.add(row["id"])
        r = candidates(rec, row)
        share = r["share"]
        print(f"{label(row['id']):20s} {r['miss']:6.2f} | {r['clamp']:5.2f} {r['act']:5.2f} {r['fc2b']:5.2f} "
              f"{r['sync']:5.2f} {r['pbias']:5.2f} | {r['rbias']:5.2f} {r['bgrad']:5.2f} {r['x']:5.2f}")
    print(f"\nus per token per GPU; bgrad = {share:.3f} of the GEMM FLOPs (qkv and fc1 weight gradients)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
