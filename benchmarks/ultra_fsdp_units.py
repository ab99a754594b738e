"""Nemotron-3 Ultra's 26.08 rows: the per-unit Megatron-FSDP traffic against the compute window that hides it,
the fc1-output offload's copies against theirs, and the model FLOPs NVIDIA's table implies against llmplan's
(docs/validation.md#ultra-fsdp-units).

Sources (the release that ran the rows): NVIDIA-NeMo/Megatron-Bridge v0.6.0 (the 26.08 tag, 51885cf1), whose
3rdparty/Megatron-LM pin is NVIDIA/Megatron-LM cd4afffa6: `megatron/core/distributed/fsdp/src/megatron_fsdp/
param_and_grad_buffer.py` (`AllGatherPipeline.all_gather_params`: the prefetch of `suggested_AG_prefetch_size`
elements, 500 M by default, the DP-Outer gather on its own stream before the unit's DP-Shard gather;
`GradReducePipeline._bucket_group_gradient_reduce`: the DP-Outer reduce-scatter chained after the DP-Shard one),
`megatron_fsdp.py` (`all_gather_and_wait_parameters_ready`: DP-Outer gathers at `microbatch_count == 0`, forward and
backward; `_process_post_backward_gradients`: DP-Outer reduce-scatter at `is_last_microbatch`, which
`MegatronFSDP.no_sync` sets for the last micro-batch only), `pipeline_parallel/fine_grained_activation_offload.py`
(`OffloadTensorGroup`: the "fused_group_mlp" group bypasses the CPU pool, so each copy takes
`torch.empty(..., pin_memory=True)`, PyTorch's caching host allocator, which rounds each block up to a power of
two: pytorch/pytorch `aten/src/ATen/core/CachingHostAllocator.h`, `allocate`).

Every number below is derived from the built-in spec and llmplan's own priced step; nothing is fitted. The unit
windows split each row's priced compute per micro-batch (GEMM + attention + memory-bound, as
`benchmarks/hybrid_gap.py` prints it) by each unit's share of the forward FLOPs a token (2 x its active
parameters, plus the causal score and value products for an attention unit), one third forward and two thirds
backward: a reading for orders of magnitude, not a schedule.

    python benchmarks/ultra_fsdp_units.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A
import hybrid_gap as H

from llmplan.cost.flops import model_flops_per_step
from llmplan.cost.offload import moe_act_offload_bytes

OUTER_DOMAINS = 4  # 256 GPUs / 64-GPU HSDP domains (_apply_nemotron_3_ultra_fsdp_hsdp, num_distributed_optimizer_instances)


def unit_params(m) -> dict[str, dict[str, float]]:
    """Parameters of one FSDP unit of each kind (MambaLayer, attention TransformerLayer, MoETransformerLayer):
    'dense' (sharded over the 64-GPU domain, DP-Outer over the domains) and 'experts' (all 512: a rank holds
    512 / EP of them, DP-Shard 1 inside a domain at EP64); 'active' the parameters a token meets."""
    h = m.hidden_size
    d_in = m.mamba_num_heads * m.mamba_head_dim
    mamba = h * (2 * d_in + 2 * m.n_groups * m.ssm_state_size + m.mamba_num_heads) + d_in * h
    attn = h * m.num_attention_heads * m.head_dim * 2 + 2 * h * m.num_key_value_heads * m.head_dim
    lat = m.moe_latent_size
    dense_moe = m.num_experts * h + 2 * h * lat + 2 * h * m.shared_expert_intermediate_size
    expert = 2 * lat * m.moe_intermediate_size
    return {"mamba": {"dense": mamba, "experts": 0.0, "active": mamba},
            "attention": {"dense": attn, "experts": 0.0, "active": attn},
            "moe": {"dense": dense_moe, "experts": m.num_experts * expert,
                    "active": dense_moe + m.num_experts_per_tok * expert}}


def forward_flops_per_token(m, kind: str, p: dict[str, float], seq: int) -> float:
    """2 x active parameters; an attention unit adds its causal QK^T and AV (2 x 2 x s/2 x heads x head_dim)."""
    extra = 2 * 2 * (seq / 2) * m.num_attention_heads * m.head_dim if kind == "attention" else 0.0
    return 2 * p["active"] + extra


def main() -> int:
    recs = {r["id"]: r for r in yaml.safe_load(A.DEFAULT_RUNS.read_text())}
    print("model FLOPs a token: NVIDIA's table (Model TFLOP/s / tokens/s) against llmplan's model_flops_per_step")
    for (model, gpu), rid in H.ROWS.items():
        rec = recs[rid]
        m, cl, plan = A.record_setup(rec, A.family(rid))
        pub = 1e12 * rec["measured"]["tflops_per_gpu"] / rec["measured"]["tokens_per_s_per_gpu"]
        ours = float(model_flops_per_step(m, plan)) / (plan.global_batch * plan.seq_len)
        print(f"  {model} {gpu}: table {pub:.4e}, llmplan {ours:.4e}, table / llmplan {pub / ours:.3f}")

    for gpu in ("gb300", "gb200"):
        rec = recs[H.ROWS[("ultra", gpu)]]
        m, cl, plan = A.record_setup(rec, "mbridge-moe")
        _, parts = H.terms(m, cl, plan)
        mb = plan.num_microbatches
        compute = (parts["gemm"] + parts["attention"] + parts["memory_bound"]) / mb  # ms a micro-batch
        units = unit_params(m)
        kinds = [t if t != "none" else "" for t in m.layer_types]
        n = {"mamba": sum(k == "mamba" for k in kinds), "attention": sum(k == "full_attention" for k in kinds),
             "moe": sum(t == "moe" for t in m.mlp_layer_types)}
        mtp = 2  # mtp_num_layers 2, mtp_use_repeated_layer: the "*E" block runs twice a micro-batch
        f = {k: forward_flops_per_token(m, k, units[k], plan.seq_len) for k in units}
        head = 2 * m.hidden_size * m.vocab_size
        total = sum(n[k] * f[k] for k in f) + mtp * (f["attention"] + f["moe"]) + (1 + mtp) * head
        nic = cl.system.nic_bytes_per_s
        nvl = cl.system.intra_node_bytes_per_s * cl.system.ring_efficiency
        ep = plan.ep
        dom = cl.num_gpus // OUTER_DOMAINS
        print(f"\nUltra {gpu} TP{plan.tp} EP{ep}: {mb} micro-batch(es), priced compute {compute:.0f} ms a micro-batch; "
              f"NIC {nic / 1e9:.0f} GB/s one way, NVLink ring {nvl / 1e9:.0f} GB/s")
        print(f"  {'unit':9s} {'n':>3s} {'fwd ms':>7s} {'bwd ms':>7s} {'DP-Outer RS ms':>15s} {'DP-Outer AG ms':>15s} "
              f"{'DP-Shard RS+AG ms':>18s} {'RS/bwd':>7s} {'AG/fwd':>7s}")
        for k in ("mamba", "attention", "moe"):
            share = f[k] / total
            fwd, bwd = compute * share / 3, compute * share * 2 / 3
            dense = units[k]["dense"] / plan.tp  # TP shards the dense linears (SP: the latent projections are
            # duplicated, Megatron-LM moe_layer.py; a bound either way)
            experts = units[k]["experts"] / ep  # the rank's experts, whole inside the domain (DP-Shard 1)
            shard = dense / (dom // plan.tp)  # the rank's DP-Shard slice of the dense unit
            outer = (OUTER_DOMAINS - 1) / OUTER_DOMAINS
            rs = 1e3 * outer * 2 * (shard + experts) / nic  # bf16 gradients (megatron_fsdp_grad_comm_dtype)
            ag = 1e3 * outer * 1 * (shard + experts) / nic  # MXFP8 data, one byte an element (fp8_param_gather)
            inner = 1e3 * (2 + 1) * dense * (1 - 1 / (dom // plan.tp)) / nvl  # bf16 RS + one MXFP8 gather
            print(f"  {k:9s} {n[k]:3d} {fwd:7.2f} {bwd:7.2f} {rs:15.2f} {ag:15.2f} {inner:18.2f} "
                  f"{rs / bwd:7.2f} {ag / fwd:7.2f}")
        # The prefetch: at a Mamba unit's forward hook the next MoE unit and the Mamba unit after it are asked for
        # (dense 205 M + experts 168 M + Mamba 422 M > 500 M), so a MoE unit's DP-Outer gather has the forward of
        # the unit before it and its own predecessor pair to run in.
        moe_ag = 1e3 * (OUTER_DOMAINS - 1) / OUTER_DOMAINS * (units["moe"]["experts"] / ep
                                                                + units["moe"]["dense"] / plan.tp / (dom // plan.tp)) / nic
        pair_fwd = compute * (f["moe"] + f["mamba"]) / total / 3
        print(f"  a MoE unit's DP-Outer gather {moe_ag:.2f} ms against one Mamba + MoE forward {pair_fwd:.2f} ms "
              f"({moe_ag / pair_fwd:.0%} of the NIC; the gathers queue on one stream and communicator)")
        copy = float(moe_act_offload_bytes(m, plan))
        pinned = float(1 << int(copy - 1).bit_length())  # the caching host allocator's PowerOf2Ceil
        moe_step = compute / (n["moe"] + mtp)
        host = cl.system.host_bytes_per_s
        print(f"  fc1-output offload: {copy / 1e9:.2f} GB a MoE layer, {1e3 * copy / host:.1f} ms at "
              f"{host / 1e9:.0f} GB/s ({1e3 * copy / 450e9:.1f} ms at NVLink-C2C's 450); MoE-layer interval "
              f"forward {moe_step / 3:.1f} ms, backward {2 * moe_step / 3:.1f} ms; pinned block {pinned / 2**30:.0f} GiB "
              f"(power-of-two rounding, {pinned / copy:.2f}x), {(n['moe'] + mtp - 1) * pinned / 1e9:.0f} GB a GPU "
              f"at the end of the forward")
        mtp_units = 1e3 * (units["attention"]["dense"] + units["moe"]["dense"]) / plan.tp * (1 + 2) / nvl
        print(f"  the repeated MTP block (one attention + one MoE unit used twice): a second DP-Shard gather "
              f"forward and backward and a second reduce-scatter, at most {mtp_units:.1f} ms of NVLink traffic "
              f"a micro-batch, beside compute")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
