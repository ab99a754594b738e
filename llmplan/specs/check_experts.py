"""check_plan's expert-parallel rules: ep and expert tp need a mixture-of-experts model, ep divides the experts,
expert tp the expert FFN, and etp x ep the tp x cp x dp ranks (Megatron's expert grid). RULES in specs/check.py
runs them, in this order, after the pipeline rules."""

from __future__ import annotations

from llmplan.errors import bounded_list
from llmplan.specs.plan import ETP_SAME_AS_TP
from llmplan.specs.rule import Rule
from llmplan.specs.stages import divisors

EXPERT_RULES: tuple[Rule, ...] = (
    Rule("ep_dense", lambda m, p, c: m.is_moe | (p.ep == 1),
         lambda m, p, c: f"ep ({p.ep}) needs a mixture-of-experts model; {m.name} is dense: use ep 1"),
    # A dense model has no expert layers: expert tp 1 (what MoE recipes set, and Megatron ignores) or the
    # default (tp) is harmless; any other value describes no layer and leaves no expert group grid to place.
    Rule("etp_dense", lambda m, p, c: m.is_moe | (p.etp_resolved == p.tp) | (p.etp_resolved == 1),
         lambda m, p, c: f"expert tp ({p.etp_resolved}) applies to mixture-of-experts layers; {m.name} is dense: "
                         f"drop --etp (dense layers use tp, {p.tp})"),
    Rule("ep_experts", lambda m, p, c: (not m.is_moe) | (max(m.num_experts, 1) % p.ep == 0),
         lambda m, p, c: f"ep ({p.ep}) must divide the {m.num_experts} experts of {m.name}; "
                         f"valid ep: {bounded_list(divisors(m.num_experts))}"),
    Rule("etp_ffn", lambda m, p, c: (not m.is_moe) | (m.expert_ffn % p.etp_resolved == 0),
         lambda m, p, c: f"expert tp ({p.etp_resolved}) must divide the expert FFN width ({m.expert_ffn}) of "
                         f"{m.name}; valid: {bounded_list(divisors(m.expert_ffn)[:8])}"),
    # Megatron-Core asserts expert TP 1 on a MoE model with linear biases (GPT-OSS's expert biases): "Bias in Moe
    # is only supported when ETP==1" (NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/transformer_config.py,
    # __post_init__: num_moe_experts is not None and add_bias_linear); DTensor TP has no such assert
    Rule("etp_bias", lambda m, p, c: (not m.is_moe) | (not m.mlp_bias) | (p.etp_resolved == 1) | (p.tp_impl != "megatron"),
         lambda m, p, c: f"expert tp ({p.etp_resolved}) with {m.name}'s expert biases: Megatron-Core supports biased "
                         f"experts only at expert tp 1 (transformer_config.py: 'Bias in Moe is only supported when "
                         f"ETP==1'); use --etp 1"),
    # Megatron-Core's MoE layer raises in training at attention TP > 1 without sequence parallelism: "During
    # training, performance may degrade if MoE and tensor parallelism are enabled without also enabling sequence
    # parallelism." (NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/moe/moe_layer.py, MoELayer.forward)
    Rule("moe_tp_sp", lambda m, p, c: (not m.is_moe) | (p.tp == 1) | p.sp | (p.tp_impl != "megatron"),
         lambda m, p, c: f"tp {p.tp} without sequence parallelism on {m.name}'s MoE layers: Megatron-Core's MoE "
                         f"layer raises in training at tp > 1 without sp (moe_layer.py: 'During training, performance "
                         f"may degrade if MoE and tensor parallelism are enabled without also enabling sequence "
                         f"parallelism.'); add --sp"),
    Rule("expert_grid", lambda m, p, c: (not m.is_moe) | ((p.tp * p.cp * p.dp) % (p.etp_resolved * p.ep) == 0),
         lambda m, p, c: f"expert tp x ep ({p.etp_resolved} x {p.ep}) must divide tp x cp x dp "
                         f"({p.tp * p.cp * p.dp}) (Megatron's expert grid: world size divisible by etp x ep x pp); "
                         f"expert tp {'defaults to tp (Megatron)' if p.etp == ETP_SAME_AS_TP else 'is set by --etp'}"
                         ": most MoE recipes use --etp 1, or lower --ep"),
)
