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
    Rule("expert_grid", lambda m, p, c: (not m.is_moe) | ((p.tp * p.cp * p.dp) % (p.etp_resolved * p.ep) == 0),
         lambda m, p, c: f"expert tp x ep ({p.etp_resolved} x {p.ep}) must divide tp x cp x dp "
                         f"({p.tp * p.cp * p.dp}) (Megatron's expert grid: world size divisible by etp x ep x pp); "
                         f"expert tp {'defaults to tp (Megatron)' if p.etp == ETP_SAME_AS_TP else 'is set by --etp'}"
                         ": most MoE recipes use --etp 1, or lower --ep"),
)
