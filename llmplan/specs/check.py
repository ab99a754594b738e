"""check_plan: every rule that relates a plan to a model and a cluster, in one place.

Search, estimate and export all call it. Each violation names the rule, the values and valid alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """TP degrees that split the query heads and split or replicate the KV heads."""
    a, K = m.num_attention_heads, m.kv_heads
    return [t for t in divisors(a) if (K % t == 0 or t % K == 0) and (max_tp is None or t <= max_tp)]


def check_plan(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None = None) -> list[Violation]:
    """All violations of `plan` for model `m` on `cluster` (empty list: the plan is valid)."""
    out: list[Violation] = []

    def bad(rule: str, message: str) -> None:
        out.append(Violation(rule, message))

    name, t, L = m.name, plan.tp, m.num_hidden_layers
    a, K = m.num_attention_heads, m.kv_heads
    if a % t:
        bad("tp_heads", f"tp ({t}) must divide num_attention_heads ({a}) of {name}; valid tp: {_fmt(valid_tp(m))}")
    elif K % t and t % K:
        bad("tp_kv_heads", f"tp ({t}) must divide num_key_value_heads ({K}) of {name} or be a multiple of it "
            f"(KV heads replicated); valid tp: {_fmt(valid_tp(m))}")
    for field, f in (("intermediate_size", m.intermediate_size if m.num_dense_layers else 0),
                     ("shared expert FFN", m.shared_ffn)):
        if f and f % t:
            bad("tp_ffn", f"tp ({t}) must divide the {field} ({f}) of {name}; valid tp: "
                f"{_fmt([d for d in valid_tp(m) if f % d == 0])}")
    if L % plan.pp:
        bad("pp_layers", f"pp ({plan.pp}) must divide num_hidden_layers ({L}) of {name}; valid pp: {_fmt(divisors(L))}")
    elif plan.vpp > 1:
        per = L // plan.pp
        if plan.pp == 1:
            bad("vpp_needs_pp", f"vpp ({plan.vpp}) needs pp > 1 (interleaving splits pipeline stages); set pp or vpp 1")
        elif per % plan.vpp:
            bad("vpp_layers", f"vpp ({plan.vpp}) must divide the {per} layers per pipeline stage of {name} "
                f"(num_hidden_layers {L} / pp {plan.pp}); valid vpp: {_fmt(divisors(per))}")
    _check_moe(m, plan, bad)
    if plan.sp and t == 1:
        bad("sp_needs_tp", "sequence parallelism (sp) needs tp > 1; use --no-sp or raise tp")
    if plan.cp > 1 and plan.seq_len % (2 * plan.cp):
        bad("cp_seq", f"seq_len ({plan.seq_len}) must be divisible by 2*cp ({2 * plan.cp}) for context parallelism; "
            f"valid cp: {_fmt([c for c in divisors(plan.seq_len // 2) if c > 1][:8])}")
    if plan.seq_len > m.max_position_embeddings:
        scaling = f" (rope_scaling: {m.rope_scaling})" if m.rope_scaling else ""
        bad("seq_len_context", f"seq_len ({plan.seq_len}) exceeds max_position_embeddings "
            f"({m.max_position_embeddings}) of {name}{scaling}; lower --seq-len")
    mb_dp = plan.micro_batch * plan.dp
    if plan.global_batch % mb_dp:
        ok = [b for b in divisors(plan.global_batch) if b <= plan.global_batch // plan.dp
              and plan.global_batch % (b * plan.dp) == 0]
        bad("global_batch", f"global_batch ({plan.global_batch}) must be divisible by micro_batch x dp "
            f"({plan.micro_batch} x {plan.dp} = {mb_dp}); valid micro_batch: {_fmt(ok)}")
    if cluster is not None:
        _check_cluster(m, plan, cluster, bad)
    return out


def _check_moe(m: ModelSpec, plan: ParallelPlan, bad) -> None:
    etp = plan.etp_resolved
    if not m.is_moe:
        if plan.ep > 1:
            bad("ep_dense", f"ep ({plan.ep}) needs a mixture-of-experts model; {m.name} is dense: use ep 1")
        return
    E = m.num_experts
    if E % plan.ep:
        bad("ep_experts", f"ep ({plan.ep}) must divide the {E} experts of {m.name}; valid ep: {_fmt(divisors(E))}")
    if m.expert_ffn % etp:
        bad("etp_ffn", f"expert tp ({etp}) must divide the expert FFN width ({m.expert_ffn}) of {m.name}; "
            f"valid: {_fmt(divisors(m.expert_ffn)[:8])}")
    inner = plan.tp * plan.cp * plan.dp
    if inner % (etp * plan.ep):
        bad("expert_grid", f"expert tp x ep ({etp} x {plan.ep}) must divide tp x cp x dp ({inner}) "
            "(Megatron's expert grid: world size divisible by etp x ep x pp)")


def _check_cluster(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, bad) -> None:
    n, gpu = cluster.num_gpus, cluster.system.gpu
    model_par = plan.tp * plan.pp * plan.cp
    if n % model_par:
        bad("gpus_model_parallel", f"tp x pp x cp ({plan.tp} x {plan.pp} x {plan.cp} = {model_par}) must divide "
            f"the {n} GPUs ({cluster.num_nodes} node{'s' * (cluster.num_nodes != 1)} x {cluster.gpus_per_node_used})")
    elif plan.num_gpus != n:
        bad("gpus_dp", f"tp x pp x cp x dp ({model_par} x {plan.dp} = {plan.num_gpus}) must equal the {n} GPUs; "
            f"dp must be {n // model_par}")
    if plan.dtype not in gpu.tflops:
        have = ", ".join(sorted(k for k in gpu.tflops if k in ("bf16", "fp16", "fp8", "fp32")))
        bad("dtype_hardware", f"{gpu.name} has no {plan.dtype} tensor cores; use --dtype {have.split(', ')[0]} "
            f"(supported: {have})")
