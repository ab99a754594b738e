"""Megatron's per-module selective recompute (--recompute-modules): the activation bytes each module frees,
the forward matmuls it runs again, the check_plan rules, the CLI option, the Megatron export, the presets the
validation rows take, and the expert optimizer states sharded over the expert data-parallel group.

Expected values are written out by hand from the model dimensions (Hugging Face configs) and the mechanism
in docs/formulas.md#mem.recompute_modules, not read back from the code under test."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmplan.cost.compute import module_recompute_flops
from llmplan.cost.memory import layer_activation_bytes, training_memory
from llmplan.estimate import estimate_training
from llmplan.export import render_all
from llmplan.planfile import load_plan
from llmplan.specs.check import check_plan
from llmplan.specs.plan import RECOMPUTE_MODULES, ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()
GPT_OSS, DSV3, LLAMA = M["gpt-oss-120b"], M["deepseek-v3"], M["llama-3.1-8b"]


def _plan(**kw) -> ParallelPlan:
    base = dict(tp=1, pp=1, dp=64, ep=8, etp=1, zero=1, micro_batch=4, global_batch=1280, seq_len=4096)
    return ParallelPlan(**{**base, **kw})


def _freed(m, moe: bool, modules: tuple[str, ...], **kw) -> float:
    """Bytes one layer keeps without the modules minus with them (selective recompute either way)."""
    keep = layer_activation_bytes(m, _plan(recompute="selective", **kw), moe)
    drop = layer_activation_bytes(m, _plan(recompute="selective", recompute_modules=modules, **kw), moe)
    return float(keep - drop)


def test_gpt_oss_preset_modules_free_the_pre_mlp_norm_output_and_the_expert_activation():
    # GPT-OSS 120B (openai/gpt-oss-120b config.json: hidden 2880, 128 experts, top-4, expert FFN 2880), one
    # micro-batch of 4 x 4,096 tokens at TP 1: layernorm frees the MoE layer's pre-MLP norm output (its
    # input norm is fused into the QKV linear), 2 bytes x T x h; moe_act the SwiGLU output of every routed
    # row, 2 bytes x T x k x f_e, and the copy of the 2f-wide fc1 output its eager clamps keep (swiglu_limit
    # 7.0; Megatron-Core weighted_bias_quick_geglu_impl), 4 bytes x T x k x f_e (docs/formulas.md#moe.glu_clamp).
    T, h, k, f_e = 4 * 4096, 2880, 4, 2880
    assert _freed(GPT_OSS, True, ("layernorm",)) == pytest.approx(2 * T * h, rel=1e-9)
    assert _freed(GPT_OSS, True, ("moe_act",)) == pytest.approx((2 + 4) * T * k * f_e, rel=1e-9)
    assert _freed(GPT_OSS, True, ("layernorm", "moe_act")) == pytest.approx(2 * T * h + 6 * T * k * f_e, rel=1e-9)
    # with the clamp fused into the activation only the SwiGLU output goes
    assert _freed(GPT_OSS, True, ("moe_act",), glu_clamp_fusion=True) == pytest.approx(2 * T * k * f_e, rel=1e-9)


def test_layernorm_recompute_frees_nothing_where_transformer_engine_fuses_the_norms():
    # A dense GQA layer: both norms are fused into LayerNormColumnParallelLinear (Megatron's TE layer spec),
    # so Megatron has no separate norm to recompute (transformer_layer.py skips IdentityOp norms).
    assert _freed(LLAMA, False, ("layernorm",), ep=1, dp=8, global_batch=64) == 0.0


def test_mla_up_proj_frees_q_k_v_and_mlp_frees_a_dense_layer_s_mlp():
    # DeepSeek-V3 (config_671B.json: 128 heads, qk_nope 128, qk_rope 64, v_head 128, hidden 7168, dense
    # intermediate 18432), one sequence of 4,096 at TP 1 in bf16: the up-projected Q and K (192 wide per head)
    # and V (128) are 2 bytes each; the dense MLP keeps fc1's 2f output and the f-wide product (6 bytes x f)
    # and its input, the norm output (2 x h), which its own checkpoint no longer needs.
    T, a, qk, v, h, f = 4096, 128, 192, 128, 7168, 18432
    kw = dict(micro_batch=1, ep=8, dp=8, global_batch=64)
    assert _freed(DSV3, True, ("mla_up_proj",), **kw) == pytest.approx(2 * T * a * (2 * qk + v), rel=1e-9)
    assert _freed(DSV3, False, ("mlp",), **kw) == pytest.approx(T * (6 * f + 2 * h), rel=1e-9)


def test_moe_act_in_mxfp8_frees_the_quantised_fc2_input_too():
    # With fp8 / fp4 Megatron makes linear_fc2 save its original input (set_save_original_input), which
    # moe_act discards, so the whole fc2 input goes: the bf16 activation output, 2 bytes per element, less
    # the MXFP8 cast already priced in its place (1 + 1/32 bytes), i.e. the 1 + 1/32 bytes stored (with the
    # clamp fused; the eager clamps' bf16 copy of the fc1 output, 4 bytes a row and column, goes as well). That is
    # the unfused TEGroupedMLP (expert_gemm per-expert); the fused grouped MLP keeps it (test_fused_mlp_memory.py).
    T, k, f_e = 4 * 4096, 4, 2880
    unfused = {"dtype": "fp8", "recipe": "mxfp8", "expert_gemm": "per-expert"}
    freed = _freed(GPT_OSS, True, ("moe_act",), glu_clamp_fusion=True, **unfused)
    assert freed == pytest.approx(T * k * f_e * (1 + 1 / 32), rel=1e-9)
    freed = _freed(GPT_OSS, True, ("moe_act",), **unfused)
    assert freed == pytest.approx(T * k * f_e * (1 + 1 / 32 + 4), rel=1e-9)
    assert _freed(GPT_OSS, True, ("moe_act",), dtype="fp8", recipe="mxfp8", glu_clamp_fusion=True) == 0.0


def test_modules_rerun_their_forward_matmuls():
    # mla_up_proj reruns DeepSeek-V3's Q up-projection (q_lora_rank 1536 -> 128 x 192) and KV up-projection
    # (kv_lora_rank 512 -> 128 x (128 + 128)): 2 FLOPs per weight per token; moe reruns the router, the 8
    # routed experts (3 x 7168 x 2048 each, SwiGLU) and the shared expert; layernorm / moe_act no matmul.
    T = 4096
    p = _plan(recompute="selective", recompute_modules=("mla_up_proj",), micro_batch=1, dp=8, global_batch=64)
    assert module_recompute_flops(DSV3, p, True) == pytest.approx(2 * T * (1536 * 128 * 192 + 512 * 128 * 256))
    p = p.model_copy(update={"recompute_modules": ("moe",)})
    moe = 2 * T * (8 * 3 * 7168 * 2048 + 7168 * 256 + 3 * 7168 * 2048)
    assert module_recompute_flops(DSV3, p, True) == pytest.approx(moe)
    p = p.model_copy(update={"recompute_modules": ("layernorm", "moe_act")})
    assert module_recompute_flops(DSV3, p, True) == 0.0


MOE_MODULES = ("layernorm", "moe_act", "shared_experts", "moe", "mla_up_proj", "mlp", "core_attn")


def _one_module_more(modules: list[str], precision: str, mb: int):
    """(estimate with `modules`, estimate with one more module) for each module not in the list, DeepSeek-V3 on
    32 DGX B200 (pp16, a one-layer first stage). An empty list is Megatron's default, core_attn alone (a list
    replaces it), so it is written out."""
    modules = modules or ["core_attn"]
    cluster = ClusterSpec(system=S["dgx-b200"], num_nodes=32)
    kw = dict(pp=16, dp=16, ep=8, micro_batch=mb, global_batch=512, pp_first=1, pp_last=0)
    kw.update({"dtype": "fp8", "recipe": "mxfp8"} if precision == "mxfp8" else {})
    base = estimate_training(DSV3, cluster, ParallelPlan(recompute="selective", recompute_modules=tuple(modules), **kw))
    for extra in (x for x in MOE_MODULES if x not in modules):
        yield base, estimate_training(DSV3, cluster, ParallelPlan(recompute="selective",
                                                                  recompute_modules=(*modules, extra), **kw))


@given(st.lists(st.sampled_from(MOE_MODULES), unique=True, max_size=4), st.sampled_from(["bf16", "mxfp8"]),
       st.sampled_from([1, 2]))
def test_more_modules_never_raise_memory(modules, precision, mb):
    # Property (seeded): a module added to the list frees activations (or nothing); DeepSeek-V3 has every kind
    # of layer the modules name.
    for base, more in _one_module_more(modules, precision, mb):
        assert float(more.memory.total) <= float(base.memory.total) + 1


GAP_BOUND = 1e-9
"""Float round-off only (docs/validation.md#bubble-drain): a later stage's unbucketed reduction hides in the
cool-down behind the earlier stages' own backwards (step.dp_later_rs, cooldown_slack), priced as the bubble prices
those stages, so a stage's last backward never ends earlier for more recompute on any stage. Before the slack was
priced per stage (j times the fastest backward) a module added could price DeepSeek-V3 pp16 with a one-layer first
stage up to 0.51% shorter."""


@given(st.lists(st.sampled_from(MOE_MODULES), unique=True, max_size=4), st.sampled_from(["bf16", "mxfp8"]),
       st.sampled_from([1, 2]))
def test_more_modules_never_lower_the_step_time(modules, precision, mb):
    # Property (seeded): a module added to the list reruns forward work (or none), so the step is no shorter
    # (GAP_BOUND: round-off).
    for base, more in _one_module_more(modules, precision, mb):
        t, t0 = float(more.time.total), float(base.time.total)
        assert t >= t0 * (1 - GAP_BOUND), f"{t:.6f} s < {t0:.6f} s"


def test_the_worst_case_of_the_closed_gap_prices_no_shorter():
    # The case that priced 0.51% shorter before the cool-down's slack was priced per stage (found over the whole
    # space of the property above, docs/validation.md#bubble-drain): DeepSeek-V3 pp16 with a one-layer first
    # stage, layernorm recompute, bf16, micro-batch 1, then the dense MLP's module added. It lengthens only the
    # dense layers' backwards (the first stage's one and stage 1's two), which the last stage's reduction used
    # to count fifteen times over (15 x the fastest backward); the slack now grows by what the bubble grows by.
    (base, more), = [(b, m) for b, m in _one_module_more(["layernorm"], "bf16", 1)
                     if "mlp" in m.plan.recompute_modules]
    assert float(more.time.total) >= float(base.time.total)
    assert float(more.time.bubble) > float(base.time.bubble)


def test_check_plan_rules_for_recompute_modules():
    cluster = ClusterSpec(system=S["dgx-b200"], num_nodes=8)
    rules = {v.rule for v in check_plan(LLAMA, _plan(ep=1, recompute="none", recompute_modules=("mlp",),
                                                       global_batch=256), cluster)}
    assert "recompute_modules" in rules
    rules = {v.rule for v in check_plan(LLAMA, _plan(ep=1, recompute="selective",
                                                       recompute_modules=("mla_up_proj", "moe_act"),
                                                       global_batch=256), cluster)}
    assert "recompute_modules_model" in rules
    rules = {v.rule for v in check_plan(GPT_OSS, _plan(recompute="selective", recompute_modules=("moe",),
                                                         ep_comm_overlap=True), cluster)}
    assert "recompute_moe_overlap" in rules
    assert not check_plan(GPT_OSS, _plan(recompute="selective", recompute_modules=("layernorm", "moe_act")),
                          cluster)
    with pytest.raises(ValueError, match="more than once"):
        ParallelPlan(recompute="selective", recompute_modules=("moe_act", "moe_act"))


def test_every_priced_module_is_one_megatron_accepts():
    # Megatron-LM transformer_config.py (recompute_modules docstring / allowed_modules) lists these seven
    # besides the Gated-DeltaNet and hyper-connection modules; the hyper-connections' is "mhc" as Megatron-Bridge's
    # DeepSeek-V4 recipes name it (perf_recipes/deepseek/gb300/deepseek_v4.py at 4ab94dfad: ["mla_up_proj",
    # "mhc"]; recipes/deepseek/h100/deepseek_v4.py: ["moe_act", "mhc"]).
    assert set(RECOMPUTE_MODULES) == {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                                      "shared_experts", "mhc"}


def test_cli_takes_recompute_modules_and_refuses_bad_ones(cli):
    args = ["estimate", "--model", "gpt-oss-120b", "--hardware", "dgx-b200", "--nodes", "8", "--ep", "8",
            "--etp", "1", "--zero", "1", "--micro-batch", "4", "--global-batch", "1280", "--json"]
    plain = cli(*args, "--recompute", "selective")
    mods = cli(*args, "--recompute", "selective", "--recompute-modules", "layernorm,moe_act")
    assert plain.code == 0 and mods.code == 0
    assert mods.json()["memory"]["activations"] < plain.json()["memory"]["activations"]
    bad = cli(*args, "--recompute", "selective", "--recompute-modules", "moe_ac")
    assert bad.code == 2 and "moe_ac" in bad.err and "layernorm" in bad.err and "Traceback" not in bad.err
    none = cli(*args, "--recompute", "none", "--recompute-modules", "moe_act")
    assert none.code == 2 and "--recompute selective" in none.err


def test_megatron_export_writes_the_modules():
    from test_export import PLANS, parse_megatron  # the recorded Megatron-LM parser (tests/data/launchers)

    base = load_plan(PLANS / "moe_train.json")
    pf = dataclasses.replace(base, plan=base.plan.model_copy(
        update={"recompute": "selective", "recompute_modules": ("layernorm", "moe_act")}))
    ns, _ = parse_megatron(render_all(pf, "megatron")[0]["megatron_pretrain.sh"])
    assert ns.recompute_granularity == "selective" and ns.recompute_modules == ["layernorm", "moe_act"]


def test_validation_rows_take_their_presets_modules(published_runs):
    # Megatron-Bridge scripts/performance/configs/gpt_oss/*workload_base_configs.py: the B200 presets set
    # recompute_modules=["layernorm", "moe_act"] (v0.3.0 = 26.02 onwards, which also sets selective
    # granularity); v0.2.0 (25.11) sets the modules without the granularity, so none run.
    import accuracy

    rid = "mbridge-26.04-pretrain-gpt-oss-120b-dgx-b200-64gpu-bf16-tp1pp1cp1ep8vpnagbs1280mbs4"
    assert accuracy.mbridge_recompute_modules(published_runs[rid]) == ("layernorm", "moe_act")
    old = "mbridge-25.11-pretrain-gpt-oss-120b-dgx-b200-64gpu-bf16-tp1pp1cp1ep8vp1gbs512mbs4"
    assert accuracy.mbridge_recompute_modules(published_runs[old]) == ()
    qwen = next(r for r in published_runs if r.startswith("mbridge-26.04-pretrain-qwen3-30b"))
    assert accuracy.mbridge_recompute_modules(published_runs[qwen]) == ()


def test_gpt_oss_b200_runs_fit_with_and_without_the_preset_modules(published_runs):
    # Golden: Megatron-Bridge's 26.04 performance table reports GPT-OSS 120B BF16 on 64 B200 (EP8, micro-batch
    # 4, global batch 1280) as completed, with the preset's layernorm + moe_act recompute, and its 25.11 table
    # the V1 preset (micro-batch 4, global batch 512; EP 64 as v0.2.0's GPT_OSS_120B_B200_BF16_BASE_CONFIG sets
    # it, where the table prints 8: accuracy.MBRIDGE_ERRATA) with none (v0.2.0 sets the modules but not
    # recompute_granularity, so Megatron-Core applies none). Both fitted in what CUDA sees of a B200: 183359 MiB
    # = 179.1 GiB (nvidia-smi on p6-b200, AWS Deep Learning AMI developer guide). The 180 GB read as decimal
    # (167.6 GiB) called the 25.11 run "does not fit".
    import accuracy

    capacity = S["dgx-b200"].gpu.hbm_gib * 2**30
    assert S["dgx-b200"].gpu.hbm_gib == pytest.approx(183359 / 1024, abs=0.05)
    rid = "mbridge-26.04-pretrain-gpt-oss-120b-dgx-b200-64gpu-bf16-tp1pp1cp1ep8vpnagbs1280mbs4"
    plan = accuracy.plan_for(published_runs[rid], "mbridge-moe", 64)
    assert plan.recompute_modules == ("layernorm", "moe_act")
    m = accuracy.model_for(published_runs[rid], "mbridge-moe")
    with_modules = float(training_memory(m, plan, capacity).total)
    # without the modules at the same layout the layer keeps the expert activation output and the eager
    # clamp's copy of the fc1 output: more than the module-recomputing run holds
    plan_bare = plan.model_copy(update={"recompute": "none", "recompute_modules": ()})
    assert with_modules < float(training_memory(m, plan_bare, capacity).total)
    old = "mbridge-25.11-pretrain-gpt-oss-120b-dgx-b200-64gpu-bf16-tp1pp1cp1ep8vp1gbs512mbs4"
    plan_old = accuracy.plan_for(published_runs[old], "mbridge-moe", 64)
    assert plan_old.recompute_modules == () and plan_old.micro_batch == plan.micro_batch == 4
    assert plan_old.ep == 64
    without = float(training_memory(m, plan_old, capacity).total)
    assert with_modules <= capacity and without <= capacity


def test_expert_optimizer_states_shard_over_the_expert_data_parallel_group():
    # Megatron-Core parallel_state.py: expert_data_parallel_size = world_size // (etp x ep x pp), and the
    # distributed optimizer shards expert parameters over that group (distributed_data_parallel.py,
    # expt_dp_group), not over the dense dp x cp. Mixtral 8x7B at EP8 / DP8 on 8 GPUs: every rank holds one
    # expert per layer, whose Adam states (12 bytes per parameter) are not sharded at all (8 / (1 x 8 x 1)
    # = 1), while the dense parameters' states are split 8 ways.
    m = M["mixtral-8x7b"]
    p = ParallelPlan(tp=1, pp=1, dp=8, ep=8, etp=1, zero=1, global_batch=8)
    expert = m.num_hidden_layers * 3 * m.hidden_size * m.expert_ffn  # one expert per layer on this rank
    from llmplan.cost.params import rank_params

    rp = rank_params(m, p, 0)
    assert float(rp.expert) == pytest.approx(expert)
    mem = training_memory(m, p, 80 * 2**30)
    assert float(mem.optimizer) == pytest.approx(12 * expert + 12 * float(rp.dense) / 8, rel=1e-9)
