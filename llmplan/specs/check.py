"""check_plan: every rule that relates a plan to a model and a cluster, in one place.

Each rule is a predicate written with arithmetic only, so it holds for one ParallelPlan and, elementwise,
for the numpy arrays of plans the search enumerates (the search counts how many plans each rule cuts).
Search, estimate and export all call these rules. Each violation names the rule, the values and valid
alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan


@dataclass(frozen=True)
class Violation:
    """One broken rule."""

    rule: str
    """Short identifier of the rule (stable; search counts pruned plans per rule)."""
    message: str
    """What is wrong, the values, the rule and the fix."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _fmt(values: list[int], limit: int = 12) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (", ..." if len(values) > limit else "") if values else "none"


def valid_tp(m: ModelSpec, max_tp: int | None = None) -> list[int]:
    """TP degrees that split the query heads, split or replicate the KV heads, and split the FFNs."""
    a, K = m.num_attention_heads, m.kv_heads
    ffns = [f for f in (m.intermediate_size if m.num_dense_layers else 0, m.shared_ffn) if f]
    return [t for t in divisors(a) if (K % t == 0 or t % K == 0) and all(f % t == 0 for f in ffns)
            and (max_tp is None or t <= max_tp)]


Pred = Callable[[ModelSpec, Any, Any], Any]
Msg = Callable[[ModelSpec, ParallelPlan, Any], str]


@dataclass(frozen=True)
class Rule:
    name: str
    ok: Pred
    """True (elementwise) where the plan keeps the rule."""
    message: Msg
    needs_cluster: bool = False


def _ffn_ok(m: ModelSpec, t: Any) -> Any:
    ok = True
    for f in (m.intermediate_size if m.num_dense_layers else 0, m.shared_ffn):
        if f:
            ok = ok & (f % t == 0)
    return ok


def _moe(m: ModelSpec) -> bool:
    return m.is_moe


RULES: tuple[Rule, ...] = (
    Rule("tp_heads", lambda m, p, c: m.num_attention_heads % p.tp == 0,
         lambda m, p, c: f"tp ({p.tp}) must divide num_attention_heads ({m.num_attention_heads}) of {m.name}; "
                         f"valid tp: {_fmt(valid_tp(m))}"),
    Rule("tp_kv_heads",
         lambda m, p, c: (m.num_attention_heads % p.tp != 0) | (m.kv_heads % p.tp == 0) | (p.tp % m.kv_heads == 0),
         lambda m, p, c: f"tp ({p.tp}) must divide num_key_value_heads ({m.kv_heads}) of {m.name} or be a multiple "
                         f"of it (KV heads replicated); valid tp: {_fmt(valid_tp(m))}"),
    Rule("tp_ffn", lambda m, p, c: _ffn_ok(m, p.tp),
         lambda m, p, c: f"tp ({p.tp}) must divide the FFN width(s) "
                         f"({', '.join(str(f) for f in (m.intermediate_size if m.num_dense_layers else 0, m.shared_ffn) if f)}) "
                         f"of {m.name}; valid tp: {_fmt(valid_tp(m))}"),
    Rule("pp_layers", lambda m, p, c: m.num_hidden_layers % p.pp == 0,
         lambda m, p, c: f"pp ({p.pp}) must divide num_hidden_layers ({m.num_hidden_layers}) of {m.name}; "
                         f"valid pp: {_fmt(divisors(m.num_hidden_layers))}"),
    Rule("vpp_needs_pp", lambda m, p, c: (p.vpp == 1) | (p.pp > 1),
         lambda m, p, c: f"vpp ({p.vpp}) needs pp > 1 (interleaving splits pipeline stages); set pp or vpp 1"),
    Rule("vpp_layers",
         lambda m, p, c: (m.num_hidden_layers % p.pp != 0) | (p.pp == 1) | ((m.num_hidden_layers // p.pp) % p.vpp == 0),
         lambda m, p, c: f"vpp ({p.vpp}) must divide the {m.num_hidden_layers // p.pp} layers per pipeline stage of "
                         f"{m.name} (num_hidden_layers {m.num_hidden_layers} / pp {p.pp}); valid vpp: "
                         f"{_fmt(divisors(m.num_hidden_layers // p.pp))}"),
    Rule("ep_dense", lambda m, p, c: _moe(m) | (p.ep == 1),
         lambda m, p, c: f"ep ({p.ep}) needs a mixture-of-experts model; {m.name} is dense: use ep 1"),
    Rule("ep_experts", lambda m, p, c: (not _moe(m)) | (max(m.num_experts, 1) % p.ep == 0),
         lambda m, p, c: f"ep ({p.ep}) must divide the {m.num_experts} experts of {m.name}; "
                         f"valid ep: {_fmt(divisors(m.num_experts))}"),
    Rule("etp_ffn", lambda m, p, c: (not _moe(m)) | (m.expert_ffn % p.etp_resolved == 0),
         lambda m, p, c: f"expert tp ({p.etp_resolved}) must divide the expert FFN width ({m.expert_ffn}) of "
                         f"{m.name}; valid: {_fmt(divisors(m.expert_ffn)[:8])}"),
    Rule("expert_grid", lambda m, p, c: (not _moe(m)) | ((p.tp * p.cp * p.dp) % (p.etp_resolved * p.ep) == 0),
         lambda m, p, c: f"expert tp x ep ({p.etp_resolved} x {p.ep}) must divide tp x cp x dp "
                         f"({p.tp * p.cp * p.dp}) (Megatron's expert grid: world size divisible by etp x ep x pp)"),
    Rule("sp_needs_tp", lambda m, p, c: (p.sp == 0) | (p.tp > 1),
         lambda m, p, c: "sequence parallelism (sp) needs tp > 1; use --no-sp or raise tp"),
    Rule("cp_seq", lambda m, p, c: (p.cp == 1) | (p.seq_len % (2 * p.cp) == 0),
         lambda m, p, c: f"seq_len ({p.seq_len}) must be divisible by 2*cp ({2 * p.cp}) for context parallelism; "
                         f"valid cp: {_fmt([x for x in divisors(p.seq_len // 2) if x > 1][:8])}"),
    Rule("seq_len_context", lambda m, p, c: p.seq_len <= m.max_position_embeddings,
         lambda m, p, c: f"seq_len ({p.seq_len}) exceeds max_position_embeddings ({m.max_position_embeddings}) of "
                         f"{m.name}{f' (rope_scaling: {m.rope_scaling})' if m.rope_scaling else ''}; lower --seq-len"),
    Rule("global_batch", lambda m, p, c: p.global_batch % (p.micro_batch * p.dp) == 0,
         lambda m, p, c: f"global_batch ({p.global_batch}) must be divisible by micro_batch x dp ({p.micro_batch} x "
                         f"{p.dp} = {p.micro_batch * p.dp}); valid micro_batch: "
                         f"{_fmt([b for b in divisors(p.global_batch) if p.global_batch % (b * p.dp) == 0])}"),
    Rule("gpus_model_parallel", lambda m, p, c: c.num_gpus % (p.tp * p.pp * p.cp) == 0,
         lambda m, p, c: f"tp x pp x cp ({p.tp} x {p.pp} x {p.cp} = {p.tp * p.pp * p.cp}) must divide the "
                         f"{c.num_gpus} GPUs ({c.num_nodes} node{'s' * (c.num_nodes != 1)} x {c.gpus_per_node_used})",
         needs_cluster=True),
    Rule("gpus_dp", lambda m, p, c: (c.num_gpus % (p.tp * p.pp * p.cp) != 0) | (p.num_gpus == c.num_gpus),
         lambda m, p, c: f"tp x pp x cp x dp ({p.tp * p.pp * p.cp} x {p.dp} = {p.num_gpus}) must equal the "
                         f"{c.num_gpus} GPUs; dp must be {c.num_gpus // (p.tp * p.pp * p.cp)}",
         needs_cluster=True),
    Rule("dtype_hardware", lambda m, p, c: p.dtype in c.system.gpu.tflops,
         lambda m, p, c: f"{c.system.gpu.name} has no {p.dtype} tensor cores; use --dtype bf16 (supported: "
                         f"{', '.join(sorted(k for k in c.system.gpu.tflops if k in ('bf16', 'fp16', 'fp8', 'fp32')))})",
         needs_cluster=True),
)


def check_plan(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None = None) -> list[Violation]:
    """All violations of `plan` for model `m` on `cluster` (empty list: the plan is valid)."""
    return [Violation(r.name, r.message(m, plan, cluster)) for r in RULES
            if (cluster is not None or not r.needs_cluster) and not bool(r.ok(m, plan, cluster))]


SERVE_RULES = ("tp_heads", "tp_kv_heads", "tp_ffn", "pp_layers", "ep_dense", "ep_experts", "gpus_model_parallel",
               "gpus_dp")


def check_serve_plan(m: ModelSpec, plan: Any, job: Any, cluster: ClusterSpec | None = None) -> list[Violation]:
    """All violations of a serving plan (ServePlan + ServeJob): the training rules that apply to serving
    (head, FFN and layer divisibility, experts, GPU count), plus the context limit and the EP group size."""
    as_train = ParallelPlan(tp=plan.tp, pp=plan.pp, dp=plan.dp, ep=plan.ep, etp=1, global_batch=plan.dp)
    out = [Violation(r.name, r.message(m, as_train, cluster).replace("tp x pp x cp", "tp x pp")
                     .replace(" x cp (", " (").replace(" x 1 = ", " = "))
           for r in RULES if r.name in SERVE_RULES and (cluster is not None or not r.needs_cluster)
           and not bool(r.ok(m, as_train, cluster))]
    if plan.ep > 1 and plan.ep > plan.tp * plan.dp:
        out.append(Violation("ep_serve", f"ep ({plan.ep}) cannot exceed tp x dp ({plan.tp * plan.dp}): serving "
                             "engines spread experts over the TP ranks of all replicas"))
    if job.context > m.max_position_embeddings:
        scaling = f" (rope_scaling: {m.rope_scaling})" if m.rope_scaling else ""
        out.append(Violation("context", f"input_len + output_len ({job.input_len} + {job.output_len} = "
                             f"{job.context}) exceeds max_position_embeddings ({m.max_position_embeddings}) of "
                             f"{m.name}{scaling}; lower --input-len or --output-len"))
    return out
