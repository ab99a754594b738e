"""A hybrid model (Mamba-2 / Gated DeltaNet / attention layers, mixer-only and MLP-only blocks) in Megatron-LM's
vocabulary: `pretrain_hybrid.py` with --hybrid-layer-pattern, one symbol per Megatron layer, '|' between
pipeline segments. Source: Megatron-LM megatron/core/models/hybrid/hybrid_layer_allocation.py (Symbols: M
mamba, G gdn, * attention, + MLA, - mlp, E moe, | pipeline segment, / MTP) and megatron/training/arguments.py
(--hybrid-layer-pattern, which --hybrid-override-pattern is a deprecated alias of; segments replace
--pipeline-model-parallel-layout, the first/last stage flags and the virtual-stage flags), at d98e8a6."""

from __future__ import annotations

from llmplan.export.common import refuse, virtual_stage_layers
from llmplan.planfile import PlanFile
from llmplan.specs.model import ModelSpec

TARGET = "megatron"
MIXER_SYMBOLS = {"mamba": "M", "linear_attention": "G", "full_attention": "*", "none": ""}
FFN_SYMBOLS = {"dense": "-", "moe": "E", "none": ""}


def layer_symbols(m: ModelSpec) -> list[str]:
    """Megatron symbols of each llmplan layer: its mixer's (MLA attention: +), then its MLP's."""
    kinds = m.layer_types or ("full_attention",) * m.num_hidden_layers
    ffns = m.mlp_layer_types or tuple("moe" if i >= m.first_k_dense_replace and m.is_moe else "dense"
                                      for i in range(m.num_hidden_layers))
    mixer = {**MIXER_SYMBOLS, "full_attention": "+" if m.is_mla else "*"}
    return [mixer[k] + FFN_SYMBOLS[f] for k, f in zip(kinds, ffns, strict=True)]


def check_hybrid(pf: PlanFile) -> None:
    """What the hybrid pattern cannot say: sliding-window or chunked attention layers (no symbol), MTP layers of
    a hybrid (their own '/' pattern, not derived here), an empty pipeline segment."""
    m = pf.model
    odd = sorted({k for k in (m.layer_types or ()) if k not in MIXER_SYMBOLS})
    if odd:
        raise refuse(TARGET, f"{', '.join(odd)} layers in a hybrid stack (Megatron-LM's --hybrid-layer-pattern has "
                     "symbols for Mamba-2, Gated DeltaNet, full attention, MLA, MLP and MoE layers only)",
                     "export a model whose attention layers are full attention")
    if m.count_layers("linear_attention") and m.linear_attention_rule == "lightning":
        raise refuse(TARGET, f"the lightning-attention layers of {m.name} (Megatron-LM's linear-attention symbol G "
                     "is Gated DeltaNet; it has no lightning attention mixer)", "export to vllm or sglang to serve it")
    if m.num_nextn_predict_layers:
        raise refuse(TARGET, f"MTP layers of a hybrid model ({m.name}: Megatron-LM describes them by a '/' pattern "
                     "of their own, which llmplan does not derive)", "set num_nextn_predict_layers 0 in the spec")
    if 0 in virtual_stage_layers(pf):
        raise refuse(TARGET, "a pipeline chunk without layers (a --hybrid-layer-pattern segment cannot be empty)",
                     "re-plan without --pp-layout or with layers in every chunk")


def hybrid_pattern(pf: PlanFile) -> str:
    """The model's symbols, split by '|' at the plan's virtual pipeline stages (model order) when pp x vpp > 1."""
    symbols = layer_symbols(pf.model)
    if pf.plan.pp * pf.plan.vpp == 1:
        return "".join(symbols)
    out, start = [], 0
    for n in virtual_stage_layers(pf):
        out.append("".join(symbols[start:start + n]))
        start += n
    return "|".join(out)


def hybrid_model_pairs(pf: PlanFile) -> list[tuple[str, object]]:
    """The pattern and the recurrent mixers' dimensions (Megatron-LM TransformerConfig mamba_* and linear_*
    fields, exposed as flags), the attention output gate (Qwen3-Next)."""
    m = pf.model
    mamba = m.count_layers("mamba") > 0
    gdn = m.count_layers("linear_attention") > 0
    return [("--hybrid-layer-pattern", f'"{hybrid_pattern(pf)}"'),
            ("--mamba-num-heads", m.mamba_num_heads if mamba else None),
            ("--mamba-head-dim", m.mamba_head_dim if mamba else None),
            ("--mamba-state-dim", m.ssm_state_size if mamba else None),
            ("--mamba-num-groups", m.n_groups if mamba else None),
            ("--linear-num-key-heads", m.linear_num_key_heads if gdn else None),
            ("--linear-num-value-heads", m.linear_num_value_heads if gdn else None),
            ("--linear-key-head-dim", m.linear_key_head_dim if gdn else None),
            ("--linear-value-head-dim", m.linear_value_head_dim if gdn else None),
            ("--linear-conv-kernel-dim", m.linear_conv_kernel_dim if gdn else None),
            ("--attention-output-gate", m.attention_output_gate),
            ("--squared-relu", m.model_type == "nemotron_h" and not m.gated_mlp)]


def megatron_layer_count(m: ModelSpec) -> int:
    """Megatron layers of the model: one per pattern symbol (a layer with a mixer and an MLP is two)."""
    return sum(len(s) for s in layer_symbols(m))
