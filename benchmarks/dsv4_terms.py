"""DeepSeek-V4 Flash's two Megatron-Bridge 26.08 rows (issue 40, docs/validation.md#dsv4): llmplan's step terms per
micro-batch against the measured step, and the size of each unpriced candidate mechanism as a what-if.

Per row: predicted and measured tokens/s per GPU, the predicted step terms per micro-batch (ms), the time the
measured step leaves unplaced per micro-batch and per layer (43 decoder layers and the MTP layer). Then, per
micro-batch, what each candidate would add if priced as its source describes (none is shipped; see the doc):

* paged_stash: Megatron-LM moe/paged_stash.py at 1e23526adc copies the fused grouped MLP's saved MXFP8 grouped
  tensors (fc1 and fc2 inputs, column-wise data and scales: w + w/32 + f_e + f_e/32 bytes a routed row) into paged
  buffers after the layer's forward and back before its backward: read + write each way, at the copy bandwidth;
* up_proj_rerun: the mla_up_proj recompute (deepseek_v4_hybrid_attention.py qkv_up_proj_and_rope_apply) reruns the
  per-head query RMS norm (read 2, write 2 bytes an element of a·d) and the in-place RoPE on the 64 rotary dims
  (0.5 bytes an element), which stage_compute charges as matmul FLOPs only;
* rope_width: DSv4's fused RoPE is in place over 64 of the 512 dims of q (and k), the output's inverse RoPE in
  place forward, and the backward un-rotates O into a fresh buffer (csa_kernels.py _undo_output_rope_for_backward):
  6.5 bytes an element of q over the step against the 12 elementwise_bytes charges (4 a pass, three passes);
* pad_256: HybridEP pads each local expert's rows to 256 on the op-fuser path (moe_utils.py
  get_align_size_for_quantization), about 127.5 rows an expert, in the grouped GEMMs;
* capacity_rows: the rows of the static 1.5 rank capacity (moe_expert_rank_capacity_factor) computed by the expert
  GEMMs, as if the fused grouped MLP ran the whole buffer (it runs use_dynamic_sched over device offsets: an upper
  bound, not a mechanism the source supports).

    python benchmarks/dsv4_terms.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A
import hybrid_gap as H

from llmplan.cost.gemm import layer_gemm_seconds

ROWS = ("mbridge-26.08-pretrain-deepseekv4-flash-dgx-gb300-128gpu-mxfp8-tp1pp1cp1ep64vpnagbs2048mbs1",
        "mbridge-26.08-pretrain-deepseekv4-flash-dgx-gb200-128gpu-mxfp8-tp1pp1cp1ep64vpnagbs2048mbs1")


def what_ifs(m, plan, gpu) -> dict[str, float]:
    """ms per micro-batch each candidate would add (negative: remove) on one rank."""
    T = plan.seq_len * plan.micro_batch
    layers = m.num_hidden_layers + m.num_nextn_predict_layers
    rows = T * m.num_experts_per_tok  # routed rows a rank computes under forced balance
    w, f = m.hidden_size, m.expert_ffn
    bw = gpu.hbm_achieved_bytes_per_s
    copy_bw = gpu.copy_achieved_bytes_per_s
    q_elems = T * m.num_attention_heads * m.d_head
    fwd, bwd = layer_gemm_seconds(m, plan, gpu, True, only="expert")
    experts = fwd + bwd
    pad_rows = m.num_experts / plan.ep * 127.5
    return {
        "paged_stash": 1e3 * layers * 4 * rows * (w + w / 32 + f + f / 32) / copy_bw,
        "up_proj_rerun": 1e3 * layers * 4.5 * q_elems / bw,
        "rope_width": 1e3 * layers * (6.5 - 12.0) * q_elems / bw,
        "pad_256": 1e3 * layers * experts * pad_rows / rows,
        "capacity_rows": 1e3 * layers * experts * 0.5,
    }


def main() -> int:
    recs = {r["id"]: r for r in yaml.safe_load(A.DEFAULT_RUNS.read_text()) if r["id"] in ROWS}
    for rid in ROWS:
        rec = recs[rid]
        m, cluster, plan = A.record_setup(rec, "mbridge-moe")
        r = H.row(rec)
        _, parts = H.terms(m, cluster, plan)
        mb = plan.num_microbatches
        layers = m.num_hidden_layers + m.num_nextn_predict_layers
        print(f"{rec['hardware']['gpu'].split()[0]}: predicted {r['pred']:.0f} measured {r['meas']:.0f} tokens/s/GPU "
              f"({100 * r['err']:+.1f}%); step {r['predicted_ms']:.0f} ms against {r['measured_ms']:.0f}")
        print("  terms per micro-batch (ms): " + " ".join(f"{k} {v / mb:.1f}" for k, v in parts.items()))
        print(f"  unplaced: {r['per_mb_ms']:.1f} ms a micro-batch, {r['per_mb_ms'] / layers:.2f} ms a layer")
        print("  what-ifs (ms a micro-batch): " + " ".join(
            f"{k} {v:+.1f}" for k, v in what_ifs(m, plan, cluster.system.gpu).items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
