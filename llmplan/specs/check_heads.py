"""check_plan's tensor- and context-parallel head rules: tp divides the attention and KV heads, the FFN widths
and a hybrid's recurrent heads and groups; DeepSeek-V4's attention runs at tp 1; cp divides each TP rank's
recurrent heads (valid_tp lists the tp degrees that keep them; serving may split DeepSeek-V4 over TP, so the
tp 1 rule is not one of them). RULES in specs/check.py runs them, in this order, first."""

from __future__ import annotations

from typing import Any

from llmplan.errors import bounded_list
from llmplan.specs.model import ModelSpec
from llmplan.specs.rule import Rule, as_bool
from llmplan.specs.stages import divisors


def valid_tp(m: ModelSpec, max_tp: int | None = None, replicate_kv: bool = False) -> list[int]:
    """TP degrees that split the query heads, split the KV heads (or, serving, replicate them: `replicate_kv`),
    split the FFNs and a hybrid's recurrent heads and groups."""
    a, K = m.num_attention_heads, m.kv_heads
    ffns = [f for f in (m.intermediate_size if m.num_mlp_layers else 0, m.shared_ffn) if f]
    return [t for t in divisors(a) if (K % t == 0 or (replicate_kv and t % K == 0)) and all(f % t == 0 for f in ffns)
            and (max_tp is None or t <= max_tp) and bool(_mamba_ok(m, t)) and bool(_gdn_ok(m, t))]


def _ffn_widths(m: ModelSpec) -> tuple[int, int]:
    """The FFN widths TP splits (0 where the model has none): the dense MLP's, the shared expert's."""
    return (m.intermediate_size if m.num_mlp_layers else 0, m.shared_ffn)


def _ffn_ok(m: ModelSpec, t: Any) -> Any:
    ok = True
    for f in _ffn_widths(m):
        if f:
            ok = ok & (f % t == 0)
    return ok


def _mamba_ok(m: ModelSpec, t: Any, cp: Any = 1) -> Any:
    """Megatron-LM's MambaMixer splits the heads and the groups over TP (both divisible by tp) and its all-to-all
    CP splits each rank's heads over cp, the groups divided among or replicated across the cp ranks.
    Source: Megatron-LM megatron/core/ssm/mamba_mixer.py (asserts on ngroups and nheads % tp) and
    mamba_context_parallel.py (nheads_local_tp % cp_size; ngroups_local_tp and cp_size divide one another)."""
    if not m.count_layers("mamba"):
        return True
    H, G = m.mamba_num_heads or 1, m.n_groups or 1
    g_local = G // t
    groups_cp = (g_local > 0) & ((g_local % cp == 0) | (cp % (g_local + (g_local == 0)) == 0))  # no 0 divisor
    return (H % t == 0) & (G % t == 0) & ((H // t) % cp == 0) & groups_cp


def _gdn_ok(m: ModelSpec, t: Any, cp: Any = 1) -> Any:
    """Megatron-LM's GatedDeltaNet splits the key and value heads over TP and each rank's value heads over CP.
    Source: Megatron-LM megatron/core/ssm/gated_delta_net.py (num_key_heads and num_value_heads % tp_size,
    (num_value_heads // tp_size) % cp_size)."""
    if not m.count_layers("linear_attention"):
        return True
    Hk, Hv = m.linear_num_key_heads or 1, m.linear_num_value_heads or 1
    return (Hk % t == 0) & (Hv % t == 0) & ((Hv // t) % cp == 0)


def _mixer_heads(m: ModelSpec) -> str:
    parts = [f"mamba_num_heads {m.mamba_num_heads} and n_groups {m.n_groups}"] if m.count_layers("mamba") else []
    if m.count_layers("linear_attention"):
        parts.append(f"linear_num_key_heads {m.linear_num_key_heads} and linear_num_value_heads "
                     f"{m.linear_num_value_heads}")
    return "; ".join(parts)



HEAD_RULES: tuple[Rule, ...] = (
    Rule("tp_heads", lambda m, p, c: m.num_attention_heads % p.tp == 0,
         lambda m, p, c: f"tp ({p.tp}) must divide num_attention_heads ({m.num_attention_heads}) of {m.name}; "
                         f"valid tp: {bounded_list(valid_tp(m))}"),
    # NVIDIA/Megatron-LM experimental_attention_variant/deepseek_v4_hybrid_attention.py at 1e23526adc
    # (DSv4HybridAttention.__init__: assert get_pg_size(self.pg_collection.tp) == 1)
    Rule("tp_dsv4", lambda m, p, c: (not m.compressed_layers) | (p.tp == 1),
         lambda m, p, c: f"tp {p.tp} with {m.name}'s compressed attention: Megatron-Core's DSv4HybridAttention "
                         "asserts a TP size of 1 (deepseek_v4_hybrid_attention.py); use --tp 1 and split the "
                         "experts with --ep, as Megatron-Bridge's deepseek_v4 recipes do"),
    Rule("tp_kv_heads",
         # DeepSeek-V4's one shared key/value head: tp_dsv4 holds it to tp 1, for the library's own reason
         lambda m, p, c: (m.num_attention_heads % p.tp != 0) | (m.kv_heads % p.tp == 0) | bool(m.compressed_layers),
         lambda m, p, c: f"tp ({p.tp}) must divide num_key_value_heads ({m.kv_heads}) of {m.name} (Megatron's "
                         "num_query_groups rule: training does not replicate KV heads); valid tp: "
                         f"{bounded_list(valid_tp(m))}"),
    Rule("tp_ffn", lambda m, p, c: _ffn_ok(m, p.tp),
         lambda m, p, c: f"tp ({p.tp}) must divide the FFN width(s) "
                         f"({', '.join(str(f) for f in _ffn_widths(m) if f)}) "
                         f"of {m.name}; valid tp: {bounded_list(valid_tp(m))}"),
    Rule("tp_recurrent_heads", lambda m, p, c: _mamba_ok(m, p.tp) & _gdn_ok(m, p.tp),
         lambda m, p, c: f"tp ({p.tp}) must divide the recurrent mixers' heads and groups ({_mixer_heads(m)}) of "
                         f"{m.name}: Megatron-LM shards them over TP; valid tp: "
                         f"{bounded_list(valid_tp(m))}"),
    Rule("cp_recurrent_heads", lambda m, p, c: ~as_bool(_mamba_ok(m, p.tp) & _gdn_ok(m, p.tp))
         | (_mamba_ok(m, p.tp, p.cp) & _gdn_ok(m, p.tp, p.cp)),
         lambda m, p, c: f"cp ({p.cp}) must divide each TP rank's recurrent heads ({_mixer_heads(m)}, over tp "
                         f"{p.tp}) of {m.name}: Megatron-LM's context parallelism for Mamba-2 and Gated DeltaNet "
                         "layers trades the sequence split for a head split (all-to-all); lower --cp"),
)
