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
    """What the hybrid pattern cannot say: sliding-window or chunked attention layers (no symbol), lightning
    attention, an empty pipeline segment. (MTP modules it says: mtp_pattern.)"""
    m = pf.model
    odd = sorted({k for k in (m.layer_types or ()) if k not in MIXER_SYMBOLS})
    if odd:
        raise refuse(TARGET, f"{', '.join(odd)} layers in a hybrid stack (Megatron-LM's --hybrid-layer-pattern has "
                     "symbols for Mamba-2, Gated DeltaNet, full attention, MLA, MLP and MoE layers only)",
                     "export a model whose attention layers are full attention")
    if m.count_layers("linear_attention") and m.linear_attention_rule == "lightning":
        raise refuse(TARGET, f"the lightning-attention layers of {m.name} (Megatron-LM's linear-attention symbol G "
                     "is Gated DeltaNet; it has no lightning attention mixer)", "export to vllm or sglang to serve it")
    if 0 in virtual_stage_layers(pf):
        raise refuse(TARGET, "a pipeline chunk without layers (a --hybrid-layer-pattern segment cannot be empty)",
                     "re-plan without --pp-layout or with layers in every chunk")


def mtp_pattern(m: ModelSpec) -> str:
    """The '/' suffix of the unified --hybrid-layer-pattern, one '/<module>' per MTP depth: each module an
    attention mixer (MLA: +) then the model's MLP (MoE: E), as llmplan prices it (cost.hybrid_stage.MTP_MIXER;
    Nemotron-3's HF mtp_hybrid_override_pattern "*E"). Megatron-LM d98e8a6 hybrid_layer_allocation.py
    parse_hybrid_pattern ("M*M*/MM/MM": two depths of "MM"); arguments.py infers --mtp-num-layers from the
    depth count; hybrid_model.py builds the MTP block on the last pipeline stage (mtp_on_this_rank)."""
    if not m.num_nextn_predict_layers:
        return ""
    module = ("+" if m.is_mla else "*") + ("E" if m.is_moe else "-")
    return ("/" + module) * m.num_nextn_predict_layers


def hybrid_pattern(pf: PlanFile) -> str:
    """The model's symbols, split by '|' at the plan's virtual pipeline stages (model order) when pp x vpp > 1,
    then its MTP modules (mtp_pattern)."""
    symbols = layer_symbols(pf.model)
    if pf.plan.pp * pf.plan.vpp == 1:
        return "".join(symbols) + mtp_pattern(pf.model)
    out, start = [], 0
    for n in virtual_stage_layers(pf):
        out.append("".join(symbols[start:start + n]))
        start += n
    return "|".join(out) + mtp_pattern(pf.model)


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


PATTERN_VARIABLE = "HYBRID_LAYER_PATTERN"
PATTERN_CHUNK = 56
"""Pattern symbols per assignment line: `HYBRID_LAYER_PATTERN+="` and the closing quote leave a line of 56
symbols within 80 columns (the pattern is one word, which export.shell_lines never splits)."""


def pattern_variable(flags: list[str]) -> tuple[list[str], list[str]]:
    """The flags with --hybrid-layer-pattern's value read from a shell variable, and the lines that build that
    variable 56 symbols at a time (bash `+=` appends to a string); flags without the pattern come back as
    they are, with no lines. The pattern's symbols (M G * + D - E | /) are literal inside double quotes."""
    out, lines = [], []
    for flag in flags:
        name, _, value = flag.partition(" ")
        if name != "--hybrid-layer-pattern":
            out.append(flag)
            continue
        pattern = value.strip('"')
        for i in range(0, len(pattern), PATTERN_CHUNK):
            op = "=" if i == 0 else "+="
            lines.append(f'{PATTERN_VARIABLE}{op}"{pattern[i:i + PATTERN_CHUNK]}"')
        out.append(f'{name} "${PATTERN_VARIABLE}"')
    return out, lines
