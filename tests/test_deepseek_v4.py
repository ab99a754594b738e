"""DeepSeek-V4 (issue 40): compressed attention (CSA with its indexer, HCA) beside a sliding window, the
shared-KV low-rank-query attention with its grouped output projection, hyper-connections over hc_mult streams
and hash-routed MoE layers, priced from the public config (cost.compressed; docs/formulas.md#compressed.attention,
#compressed.cache, #compressed.hyper_connections). Parameter counts against the model cards are in
tests/test_params.py; the Megatron-Bridge rows in tests/test_new_families_golden.py."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from llmplan.cost.compressed import (
    compressed_cache_bytes_per_token,
    hc_params,
    indexer_scores_per_token,
    window_cache_bytes,
)
from llmplan.cost.compute import (
    attended_keys,
    attention_head_dims,
    elementwise_bytes,
    layer_flops,
)
from llmplan.cost.memory import layer_activation_parts
from llmplan.cost.params import param_counts, router_params
from llmplan.cost.serve_memory import kv_bytes_per_seq_gpu, kv_bytes_per_token
from llmplan.cost.sparse import indexer_flops_per_pair
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models
from llmplan.specs.serve import ServePlan

FLASH = builtin_models()["deepseek-v4-flash"]
PRO = builtin_models()["deepseek-v4-pro"]
V32 = builtin_models()["deepseek-v3.2"]


def _plan(**kw: object) -> ParallelPlan:
    base = {"tp": 1, "pp": 1, "dp": 64, "ep": 64, "micro_batch": 1, "global_batch": 64, "seq_len": 4096,
            "dtype": "bf16"}
    return ParallelPlan(**{**base, **kw})


def _token_flops(m: ModelSpec, context: int) -> float:
    """Forward FLOPs of one token at `context` preceding tokens, from llmplan's pricing: 2 x the weights it
    touches (the input embedding is a lookup), the attention over the keys each layer attends to
    (attended_keys) and the indexers' scores over the keys they read (DeepSeek-V3.2's over every key,
    DeepSeek-V4's CSA ones over the compressed keys)."""
    p = param_counts(m)
    qk, v = attention_head_dims(m)
    keys = float(attended_keys(m, context)) * m.num_hidden_layers
    index = context * indexer_flops_per_pair(m) * m.num_hidden_layers if m.is_dsa else \
        float(indexer_scores_per_token(m, context))
    return 2 * (p.active - p.embedding) + 2 * keys * m.num_attention_heads * (qk + v) + index


def test_pro_at_a_million_tokens_needs_27_percent_of_v32_flops_and_a_tenth_of_its_cache():
    # deepseek-ai/DeepSeek-V4-Pro model card (and the vLLM recipe deepseek-ai/DeepSeek-V4-Flash, "Overview"): at a
    # 1M-token context DeepSeek-V4-Pro needs 27% of DeepSeek-V3.2's single-token inference FLOPs and 10% of its
    # KV cache. The card states no counting convention for the FLOPs (whether the indexers' fp8 products count as
    # bf16 ones, the output head): within 5% of 27%. The cache ratio it prints to one digit: the computed one must
    # print so. Caches in bf16 for both (V3.2's latent and rope key, V4's compressed keys; both indexers' keys in
    # fp8). Measured at this commit: 26.1% and 11.0%.
    ctx = 1 << 20
    flops = _token_flops(PRO, ctx) / _token_flops(V32, ctx)
    assert flops == pytest.approx(0.27, rel=0.05), flops
    cache = kv_bytes_per_token(PRO) / kv_bytes_per_token(V32)
    assert round(cache, 1) == 0.1, cache


@seed(40)
@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=129, max_value=1 << 20), st.integers(min_value=1, max_value=1 << 16))
def test_the_cache_grows_by_the_compressed_keys_only_past_the_window(context, more):
    # Past the 128-token window a sequence's cache grows by the compressed keys alone: the windows and the
    # compressors' pending rows are per sequence (fixed), the compressed keys per token of context.
    plan = ServePlan(tp=1, ep=8, dp=8)
    grown = kv_bytes_per_seq_gpu(FLASH, plan, context + more) - kv_bytes_per_seq_gpu(FLASH, plan, context)
    assert grown == pytest.approx(more * kv_bytes_per_token(FLASH, plan.kv_dtype))
    fixed = window_cache_bytes(FLASH, context)
    assert fixed == window_cache_bytes(FLASH, context + more) and fixed == window_cache_bytes(FLASH, 1 << 30)


def test_flash_cache_per_token_is_the_compressed_layers_keys():
    # 21 CSA layers keep a 512-wide bf16 key and the indexer's 128-wide fp8 key (+ an fp32 scale per 128) per 4
    # tokens, 20 HCA layers a 512-wide key per 128 tokens: 21 x (1024 + 132) / 4 + 20 x 1024 / 128 bytes.
    assert compressed_cache_bytes_per_token(FLASH) == 21 * (1024 + 132) / 4 + 20 * 1024 / 128
    assert kv_bytes_per_token(FLASH, "fp8") < kv_bytes_per_token(FLASH, "bf16")


def test_hyper_connections_cost_nothing_with_one_stream():
    # hc_mult 1 is a plain residual: no parameters, no extra traffic or activations; 4 streams add them.
    plain = FLASH.model_copy(update={"hc_mult": 1})
    assert param_counts(plain).hyper_connections == 0 and hc_params(plain) == 0
    assert param_counts(FLASH).hyper_connections == 2 * 43 * hc_params(FLASH) + 4 * 4 * 4096 + 4 + 1
    plan = _plan()
    assert elementwise_bytes(FLASH, plan, True) > elementwise_bytes(plain, plan, True)
    assert layer_activation_parts(FLASH, plan, True).residual > layer_activation_parts(plain, plan, True).residual
    assert layer_flops(FLASH, plan, True).gemm > layer_flops(plain, plan, True).gemm


@pytest.mark.parametrize("s", [256, 4096, 65536, 1 << 20])
def test_compressed_attention_counts_fewer_keys_than_full_and_grows_sublinearly(s):
    # A compressed layer attends to its window and k (CSA) or s/128 (HCA) compressed keys, never more than a
    # full causal layer's s; the per-layer mean stays below the window + top-k + s/128 bound.
    full = FLASH.model_copy(update={"layer_types": None, "index_topk": None, "index_n_heads": None,
                                    "index_head_dim": None})
    flash_keys = float(attended_keys(FLASH, s))
    assert flash_keys < float(attended_keys(full, s)) or s <= 128
    assert flash_keys <= 128 + 512 + s / 128


def test_hash_layers_keep_the_router_gemm_and_drop_the_selection_bias():
    # transformers' DeepseekV4HashRouter still scores every expert with its gate (the scores weight the experts
    # the token-id table picks), without e_score_correction_bias: 3 x 256 fewer parameters than 43 biased
    # routers, and the same router FLOPs on every MoE layer.
    routed = FLASH.model_copy(update={"num_hash_layers": 0})
    assert param_counts(routed).router - param_counts(FLASH).router == 3 * 256
    assert param_counts(FLASH).router == 43 * router_params(FLASH) - 3 * 256
    assert layer_flops(FLASH, _plan(), True).gemm == layer_flops(routed, _plan(), True).gemm


def test_a_spec_that_breaks_the_v4_rules_is_refused():
    base = FLASH.model_dump()
    for change, needle in (({"o_groups": None}, "o_lora_rank and o_groups together"),
                           ({"o_groups": 7}, "must divide num_attention_heads x head_dim"),
                           ({"num_key_value_heads": 2}, "shared_key_value reads one projection"),
                           ({"num_hash_layers": 44}, "at most the MoE layers"),
                           ({"sliding_window": None}, "give sliding_window"),
                           ({"index_topk": None}, "index_topk, index_n_heads and index_head_dim together")):
        with pytest.raises(ValueError, match=needle):
            ModelSpec(**{**base, **change})


@pytest.mark.parametrize("change,needle", [({"o_groups": 7}, "o_groups (7) must divide num_attention_heads x head_dim"),
                                           ({"num_key_value_heads": 2}, "it needs num_key_value_heads 1 (got 2)"),
                                           ({"num_hash_layers": 44}, "num_hash_layers (44) must be at most")])
def test_cli_refuses_a_v4_model_file_that_breaks_the_rules_in_one_line(cli, tmp_path, change, needle):
    path = tmp_path / "v4.yaml"
    path.write_text(yaml.safe_dump({**FLASH.model_dump(exclude_none=True), **change}))
    bad = cli("estimate", "--model", path, "--hardware", "dgx-b200")
    line = bad.refusal()
    assert needle in line and str(path) in line, line


def test_flash_layer_mix_and_mtp_layer():
    # compress_ratios 0, 0, then 4 and 128 alternating: 2 window-only, 21 CSA and 20 HCA layers; the MTP layer is
    # a window-only layer (its compress_ratios entry 0) priced with the main layers' block.
    kinds = FLASH.layer_types or ()
    assert kinds[:2] == ("sliding_attention",) * 2 and kinds.count("compressed_sparse_attention") == 21
    assert FLASH.compressed_layers == 41 and FLASH.num_nextn_predict_layers == 1
    assert math.isclose(param_counts(FLASH).total / 1e9, 284.3, abs_tol=0.05)


def test_pipeline_stages_send_every_residual_stream():
    # Between layers DeepSeek-V4 carries [s, b, hc_mult, h] (transformers DeepseekV4DecoderLayer): a pipeline
    # stage sends hc_mult times a plain residual's bytes forward and its gradient back.
    from llmplan.cost.comm import pp_transfers
    plan = _plan(pp=2, dp=32, ep=32, global_batch=32)
    plain = FLASH.model_copy(update={"hc_mult": 1})
    (streams,), (single,) = pp_transfers(FLASH, plan, "pp"), pp_transfers(plain, plan, "pp")
    assert streams.message == 4 * single.message and streams.calls == single.calls


def _plan_file(**plan: object):
    import dataclasses
    from pathlib import Path

    from llmplan.planfile import load_plan

    base = load_plan(Path(__file__).parent / "data" / "plans" / "moe_train.json")
    # the clamped SwiGLU fused, as Megatron-Bridge's DSv4 presets run it (use_transformer_engine_op_fuser with
    # NVTE_CUTEDSL_FUSED_GROUPED_MLP=1: perf_recipes/deepseek/gb200/deepseek_v4.py)
    fields = {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "micro_batch": 1, "global_batch": 64, "seq_len": 4096,
              "glu_clamp_fusion": True}
    fields.update(plan)
    return dataclasses.replace(base, model=FLASH, plan=ParallelPlan(**fields))


def test_exports_run_the_bridge_recipe_and_refuse_what_dsv4_attention_cannot():
    # Megatron-LM has no command-line flags for DSv4 attention or hyper-connections (Megatron-Core's dev-branch
    # modules, set by Megatron-Bridge's provider): refused, pointing at megatron-bridge. Megatron-Bridge 0.6.2's
    # recipes/deepseek/deepseek_v4.py (6124fbe) has deepseek_v4_flash_pretrain_config; at PP > 1 the export
    # writes the layout the hash-routed layers need, and it refuses TP > 1, which Megatron-Core's
    # DSv4HybridAttention asserts against.
    from llmplan.export import render_all
    from llmplan.export.common import CannotExpress

    with pytest.raises(CannotExpress, match="DeepSeek-V4's compressed attention and hyper-connections"):
        render_all(_plan_file(), "megatron")
    files, _ = render_all(_plan_file(pp=2, dp=4, ep=4, pp_first=22, pp_last=21), "megatron-bridge")
    script = "\n".join(files.values())
    assert "--recipe deepseek_v4_flash_pretrain_config" in script
    assert "model.pipeline_model_parallel_layout=\"Et*22|t*21mL\"" in script and "model.mtp_num_layers=1" in script
    # TP > 1 and core_attn recompute are check_plan's rules (tp_dsv4, recompute_core_attn_dsv4), not the export's
    from llmplan.specs.check import check_plan
    assert "recompute_core_attn_dsv4" in {v.rule for v in check_plan(FLASH, _plan(recompute="selective"))}
    render_all(_plan_file(tp=2, sp=True, dp=4, ep=8, etp=1), "megatron-bridge")  # no second copy of tp_dsv4


def test_mhc_recompute_drops_the_streams_and_reruns_their_projections():
    # Megatron-Bridge's DeepSeek-V4 Pro preset recomputes ["mla_up_proj", "mhc"] (perf_recipes/deepseek/gb300/
    # deepseek_v4.py at 4ab94dfad): mhc drops what the hyper-connections keep and runs their projections again.
    from llmplan.cost.activations import recomputed_module_bytes
    from llmplan.cost.compressed import hc_activation_bytes
    from llmplan.cost.flops import module_recompute_flops
    from llmplan.specs.check import check_plan
    base = _plan(recompute="selective", recompute_modules=("mla_up_proj",))
    mhc = _plan(recompute="selective", recompute_modules=("mla_up_proj", "mhc"))
    parts = layer_activation_parts(FLASH, base, True)
    dropped = recomputed_module_bytes(FLASH, mhc, True, parts) - recomputed_module_bytes(FLASH, base, True, parts)
    assert dropped == pytest.approx(hc_activation_bytes(FLASH) * 4096)
    extra = module_recompute_flops(FLASH, mhc, True) - module_recompute_flops(FLASH, base, True)
    assert extra == pytest.approx(2 * 4096 * 2 * hc_params(FLASH))
    plain = builtin_models()["deepseek-v3"]
    assert any("mhc" in v.message for v in check_plan(plain, mhc.model_copy(update={"recompute_modules": ("mhc",)})))


V4_CLI = ("estimate", "--model", "deepseek-v4-flash", "--nodes", "2", "--tp", "1", "--pp", "1", "--ep", "8",
          "--global-batch", "64", "--seq-len", "4096", "--recompute", "selective")


@pytest.mark.parametrize("modules", [(), ("--recompute-modules", "core_attn,moe_act")])
def test_core_attn_recompute_of_dsv4_attention_is_a_plan_error(cli, modules):
    # NVIDIA/Megatron-LM deepseek_v4_hybrid_attention.py at 1e23526adc: DSv4HybridAttention asserts
    # `not self.checkpoint_core_attention`; plain selective recompute is Megatron-Core's default ["core_attn"]
    r = cli(*V4_CLI, "--hardware", "gb200-nvl72", *modules)
    assert r.code == 2 and "Traceback" not in r.err
    assert "core_attn" in r.err and "DSv4HybridAttention" in r.err and "--recompute-modules mla_up_proj" in r.err
    # the recipes' modules pass, and a model without compressed attention keeps core_attn
    assert cli(*V4_CLI, "--hardware", "gb200-nvl72", "--recompute-modules", "mla_up_proj").code == 0
    from llmplan.specs.check import check_plan
    assert not [v for v in check_plan(builtin_models()["deepseek-v3"], _plan(recompute="selective"))
                if v.rule == "recompute_core_attn_dsv4"]


def test_tp_above_one_with_dsv4_attention_is_a_plan_error(cli):
    # NVIDIA/Megatron-LM deepseek_v4_hybrid_attention.py at 1e23526adc: DSv4HybridAttention.__init__ asserts
    # `get_pg_size(self.pg_collection.tp) == 1` ("DSv4 Hybrid Attention only supports TP size 1")
    from llmplan.specs.check import check_plan
    plan = _plan(tp=2, sp=True, dp=4, ep=8, etp=1)
    assert [v.rule for v in check_plan(FLASH, plan)] == ["tp_dsv4"]
    assert [v.rule for v in check_plan(builtin_models()["deepseek-v4-pro"], plan)][:1] == ["tp_dsv4"]
    r = cli("estimate", "--model", "deepseek-v4-flash", "--nodes", "2", "--tp", "2", "--sp", "--pp", "1", "--ep",
            "8", "--etp", "1", "--global-batch", "64", "--seq-len", "4096", "--recompute", "selective",
            "--recompute-modules", "mla_up_proj", "--hardware", "gb200-nvl72")
    assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1
    assert "tp 2" in r.err and "DSv4HybridAttention asserts a TP size of 1" in r.err and "--tp 1" in r.err
    # a search pinned to tp 2 is cut by the rule, by name
    r = cli("search", "--model", "deepseek-v4-flash", "--hardware", "gb200-nvl72", "--nodes", "2",
            "--global-batch", "64", "--seq-len", "4096", "--tp", "2")
    assert r.code == 2 and "tp_dsv4 cut" in r.err
    # other models keep TP (DeepSeek-V3's MLA)
    assert not [v for v in check_plan(builtin_models()["deepseek-v3"], plan) if v.rule == "tp_dsv4"]


def _bridge_overrides(cli, tmp_path, hardware: str, *extra: str) -> list[str]:
    import re
    import shlex
    name = "-".join((hardware, *extra))
    path, out = tmp_path / f"{name}.json", tmp_path / f"out-{name}"
    r = cli(*V4_CLI, "--hardware", hardware, "--recompute-modules", "mla_up_proj", *extra, "--save", path)
    assert r.code == 0, r.err
    assert cli("export", path, "--to", "megatron-bridge", "-o", out).code == 0
    text = (out / "megatron_bridge_pretrain.sh").read_text()
    block = re.search(r"^OVERRIDES=\((.*?)\)[ \t]*(?:#[^\n]*)?$", text, re.S | re.M).group(1)
    return shlex.split(block, comments=True)


def test_bridge_export_runs_the_fused_csa_path_it_prices(cli, tmp_path):
    # llmplan prices DeepSeek-V4's sparse gather calls and the CSA indexer-loss kernels on a GPU with a published
    # sparse gather rate (docs/formulas.md#compute.indexer_loss). Megatron-Bridge 6124fbe's library recipe
    # (recipes/deepseek/h100/deepseek_v4.py) sets apply_dsa_kernel_fusion False, dsa_indexer_loss_coeff 0.0,
    # dsa_indexer_use_sparse_loss False; its perf recipe (perf_recipes/deepseek/gb200/deepseek_v4.py), which the
    # 26.08 rows ran, sets True, 0.01, True: the export must write the perf recipe's three.
    fused = ["model.apply_dsa_kernel_fusion=true", "model.dsa_indexer_loss_coeff=0.01",
             "model.dsa_indexer_use_sparse_loss=true"]
    args = _bridge_overrides(cli, tmp_path, "gb200-nvl72")
    assert all(a in args for a in fused), [a for a in args if "dsa" in a]
    # priced on the dense kernel (no published sparse rate on H100): the recipe's unfused path and its coefficient
    # 0 stay, now written (docs/formulas.md#compute.indexer_training)
    assert [a for a in _bridge_overrides(cli, tmp_path, "dgx-h100") if "dsa" in a] == [
        "model.dsa_indexer_loss_coeff=0", "model.dsa_indexer_use_sparse_loss=false"]


@pytest.mark.parametrize(("loss", "written"), [
    ("off", ["model.apply_dsa_kernel_fusion=true", "model.dsa_indexer_loss_coeff=0",
             "model.dsa_indexer_use_sparse_loss=true"]),
    ("dense", ["model.apply_dsa_kernel_fusion=true", "model.dsa_indexer_loss_coeff=0.01",
               "model.dsa_indexer_use_sparse_loss=false"]),
    ("sparse", ["model.apply_dsa_kernel_fusion=true", "model.dsa_indexer_loss_coeff=0.01",
                "model.dsa_indexer_use_sparse_loss=true"])])
def test_bridge_export_writes_the_indexer_training_it_prices(cli, tmp_path, loss, written):
    # Megatron-Core's dsa_indexer_loss_coeff / dsa_indexer_use_sparse_loss (csa_kernels.py at 1e23526adc): the
    # fused path computes its KL target at any coefficient, over the k keys with the sparse flag, every
    # compressed key without; the indexer backward only above 0
    args = _bridge_overrides(cli, tmp_path, "gb200-nvl72", "--indexer-loss", loss)
    assert [a for a in args if "dsa" in a] == written
