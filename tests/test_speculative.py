"""Speculative decoding (issue 36): MTP, EAGLE and n-gram drafts priced as k draft steps plus one
verification step of k + 1 tokens per sequence, over the tokens the step yields."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_export import PLANS, parse_serve_export

from llmplan.cli.inputs import make_cluster
from llmplan.cost.inference import decode_tpot
from llmplan.cost.speculative import speculative_step, tokens_per_step
from llmplan.planfile import load_plan
from llmplan.serving import estimate_serving, replica_spans
from llmplan.specs.registry import builtin_models, resolve_model
from llmplan.specs.serve import ServeJob, ServePlan, SpeculativeSpec

DSV3 = resolve_model("deepseek-v3")
LLAMA8B = resolve_model("llama-3.1-8b")
LLAMA70B = resolve_model("llama-3.1-70b")


def _estimate(m, hardware, nodes, plan, job):
    return estimate_serving(m, make_cluster(hardware, nodes, None), plan, job)


def test_deepseek_v3_mtp_speedup_matches_the_report():
    # Published: DeepSeek-V3 Technical Report (arXiv 2412.19437) §5.4.3: with one MTP module (k = 1) and a
    # second-token acceptance of 85-90%, DeepSeek-V3 decodes at "1.8 times TPS". Here: the fp8 model on two
    # 8xH100 nodes (tp 16, the closest llmplan layout to their H800 deployment), 128 concurrent sequences of
    # 1,000 + 1,000 tokens, the default acceptance (0.85). The report's TPS is decoding speed: compared with
    # the TPOT speed-up (steady-state throughput, which also prefills, gains less). Tolerance 15%.
    job = ServeJob(input_len=1000, output_len=1000, batch=128,
                   speculative=SpeculativeSpec(method="mtp", num_speculative_tokens=1))
    e = _estimate(DSV3, "dgx-h100", 2, ServePlan(tp=16, weight_dtype="fp8"), job)
    assert e.speculative is not None
    speedup = e.speculative.tpot_without_s / float(e.timing.tpot)
    assert speedup == pytest.approx(1.8, rel=0.15)


def test_tokens_per_step_ends():
    assert tokens_per_step(0.0, 4) == 1.0
    assert tokens_per_step(1.0, 4) == 5.0
    assert tokens_per_step(0.5, 1) == pytest.approx(1.5)
    assert tokens_per_step(0.8, 3) < tokens_per_step(0.8, 4) < tokens_per_step(0.9, 4)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 512), context=st.integers(64, 32_768), k=st.integers(1, 6),
       method=st.sampled_from(["mtp", "eagle", "eagle3"]))
def test_zero_acceptance_gives_no_speedup_and_costs_the_draft(batch, context, k, method):
    m = DSV3 if method == "mtp" else LLAMA70B
    plan = ServePlan(tp=8, weight_dtype="fp8")
    cluster = make_cluster("dgx-h100", 1, None)
    spans = replica_spans(plan, cluster)
    spec = SpeculativeSpec(method=method, num_speculative_tokens=k, acceptance_rate=0.0)
    step = speculative_step(m, plan, cluster.system, spans, spec, batch, context, 0.0)
    plain = decode_tpot(m, plan, cluster.system, spans, batch, context)
    assert step.tokens_per_step == 1.0
    assert step.draft > 0
    assert step.total / step.tokens_per_step >= plain + step.draft - 1e-12


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 512), context=st.integers(64, 32_768), k=st.integers(1, 6),
       alpha=st.floats(0.0, 1.0))
def test_speedup_never_exceeds_the_tokens_per_step(batch, context, k, alpha):
    plan = ServePlan(tp=8, weight_dtype="fp8")
    cluster = make_cluster("dgx-h100", 1, None)
    spans = replica_spans(plan, cluster)
    spec = SpeculativeSpec(method="mtp", num_speculative_tokens=k, acceptance_rate=alpha)
    step = speculative_step(DSV3, plan, cluster.system, spans, spec, batch, context, 0.0)
    plain = decode_tpot(DSV3, plan, cluster.system, spans, batch, context)
    assert plain / (step.total / step.tokens_per_step) <= step.tokens_per_step + 1e-9


def test_draft_model_costs_weights_and_kv():
    plain = ServeJob(input_len=2000, output_len=500, batch=32)
    spec = SpeculativeSpec(method="eagle", num_speculative_tokens=4, draft_model="llama-3.1-8b", draft=LLAMA8B)
    e0 = _estimate(LLAMA70B, "dgx-h100", 1, ServePlan(tp=4, dp=2), plain)
    e = _estimate(LLAMA70B, "dgx-h100", 1, ServePlan(tp=4, dp=2), plain.model_copy(update={"speculative": spec}))
    assert e.speculative is not None
    # The 8B draft's weights (16 GB over 4 ranks) and its KV cache (32 layers of 8 heads beside 80).
    assert e.memory.weights - e0.memory.weights == pytest.approx(e.speculative.draft_weight_bytes)
    assert e.speculative.draft_weight_bytes > 3.5e9
    assert e.speculative.kv_bytes_per_seq > 1.3 * e.speculative.kv_bytes_per_seq_without
    assert e.memory.max_concurrent_seqs < e0.memory.max_concurrent_seqs


def test_mtp_adds_no_weights_but_its_layer_cache_and_draft_slots():
    job = ServeJob(input_len=2000, output_len=500, batch=32,
                   speculative=SpeculativeSpec(method="mtp", num_speculative_tokens=3))
    e = _estimate(DSV3, "dgx-h200", 1, ServePlan(tp=8, weight_dtype="fp8"), job)
    assert e.speculative is not None and e.speculative.draft_weight_bytes == 0.0
    # One MTP layer beside 61, and 3 draft slots beside 2,250 tokens.
    assert e.speculative.kv_bytes_per_seq / e.speculative.kv_bytes_per_seq_without == \
        pytest.approx(62 / 61, rel=0.01)  # 2,253 tokens fill the same 141 blocks of 16 as 2,250


def test_engines_load_the_mtp_modules_only_for_mtp_decoding():
    # vLLM's DeepSeek loader skips the spec-decode layers for the main model (deepseek_v2.py load_weights):
    # plain decoding holds the weights of the model without its MTP module; MTP decoding holds them too.
    plain = ServeJob(input_len=2000, output_len=500, batch=32)
    mtp = plain.model_copy(update={"speculative": SpeculativeSpec(method="mtp", num_speculative_tokens=1)})
    plan = ServePlan(tp=8, weight_dtype="fp8")
    bare = DSV3.model_copy(update={"num_nextn_predict_layers": 0})
    w = {k: float(_estimate(m, "dgx-h200", 1, plan, j).memory.weights)
         for k, m, j in (("plain", DSV3, plain), ("bare", bare, plain), ("mtp", DSV3, mtp))}
    assert w["plain"] == pytest.approx(w["bare"], rel=1e-12)
    assert w["mtp"] > w["plain"] * 1.01  # the MTP module is ~2% of DeepSeek-V3's weights
    assert _estimate(DSV3, "dgx-h200", 1, plan, plain).model.num_nextn_predict_layers == 1  # the spec is kept


def test_ngram_has_no_draft_cost():
    job = ServeJob(batch=8, speculative=SpeculativeSpec(method="ngram", num_speculative_tokens=3,
                                                        acceptance_rate=0.5))
    e = _estimate(LLAMA8B, "dgx-h100", 1, ServePlan(tp=1, dp=8), job)
    assert e.speculative is not None
    assert e.speculative.step.draft == 0.0 and e.speculative.draft_weight_bytes == 0.0


BASE = ["estimate", "--mode", "infer", "--hardware", "dgx-h100", "--nodes", "1"]


def test_cli_speculative_json_adds_keys(cli):
    r = cli(*BASE, "--model", "deepseek-v3", "--tp", "8", "--dtype", "fp8", "--speculative", "mtp",
            "--spec-tokens", "1", "--json")
    assert r.code == 0, r.err
    d = r.json()["speculative"]
    assert d["method"] == "mtp" and d["acceptance_rate"] == 0.85 and d["acceptance_default"] is True
    assert d["tokens_per_step"] == pytest.approx(1.85)
    assert d["step_s"] == pytest.approx(d["draft_s"] + d["verify_s"])
    assert r.json()["tpot_s"] < d["tpot_without_s"]
    # the serving interval comes from TensorRT-LLM runs without speculation: withheld here, with the reason
    assert "interval" not in r.json() and "speculative" in r.json()["interval_withheld"]
    plain = cli(*BASE, "--model", "deepseek-v3", "--tp", "8", "--dtype", "fp8", "--json").json()
    assert "interval" in plain and "interval_withheld" not in plain


@pytest.mark.parametrize("args,needle", [
    (["--model", "llama-3.1-8b", "--speculative", "mtp", "--spec-tokens", "1"], "num_nextn_predict_layers 0"),
    (["--model", "llama-3.1-8b", "--speculative", "ngram", "--spec-tokens", "3"], "give --acceptance"),
    (["--model", "llama-3.1-8b", "--spec-tokens", "3"], "add --speculative"),
    (["--model", "llama-3.1-8b", "--speculative", "medusa", "--spec-tokens", "3"], "it must be one of mtp, eagle, eagle3, ngram; give --speculative"),
    (["--model", "llama-3.1-8b", "--speculative", "eagle"], "needs --spec-tokens"),
    (["--model", "llama-3.1-70b", "--tp", "8", "--speculative", "eagle", "--spec-tokens", "3", "--draft-model",
      "qwen3-30b-a3b"], "must share the target's vocabulary"),
    (["--model", "llama-3.1-8b", "--speculative", "ngram", "--spec-tokens", "3", "--acceptance", "0.5",
      "--draft-model", "llama-3.1-8b"], "a draft model is used by methods eagle and eagle3"),
    (["--model", "llama-3.1-8b", "--speculative", "eagle3", "--spec-tokens", "3"], "acceptance lengths of tree"),
    (["--model", "llama-3.1-8b", "--speculative", "eagle", "--spec-tokens", "3", "--pp", "2"], "use --pp 1"),
])
def test_cli_bad_speculative_input_exits_2(cli, args, needle):
    r = cli(*BASE, *args)
    assert r.code == 2
    assert needle in r.err and "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) <= 2


@pytest.mark.parametrize("spec", [
    SpeculativeSpec(method="mtp", num_speculative_tokens=2),
    SpeculativeSpec(method="eagle", num_speculative_tokens=4),
    SpeculativeSpec(method="eagle", num_speculative_tokens=3, draft_model="llama-3.1-8b", draft=LLAMA8B),
    SpeculativeSpec(method="ngram", num_speculative_tokens=5, acceptance_rate=0.4),
    SpeculativeSpec(method="eagle3", num_speculative_tokens=5, acceptance_rate=0.8),
])
@pytest.mark.parametrize("target,program", [("vllm", "vllm serve"), ("sglang", "python -m sglang.launch_server")])
def test_speculative_flags_parse_with_the_launchers_parsers(spec, target, program):
    # vLLM 0.33.0's and SGLang 0.5.23's recorded parsers (tests/data/launchers) define every flag written.
    base = load_plan(PLANS / "serve.json")
    pf = dataclasses.replace(base, job=base.serve_job.model_copy(update={"speculative": spec}))
    if spec.method == "mtp":  # MTP drafts with the model's own next-token layers: a model that has them
        pf = dataclasses.replace(pf, model=builtin_models()["qwen3-next-80b-a3b"])
    ns, unknown = parse_serve_export(pf, target)
    assert not unknown, f"flags {program} does not define: {unknown}"
    k = spec.num_speculative_tokens
    if target == "vllm":
        config = json.loads(ns.speculative_config)
        assert config["method"] == spec.method and config["num_speculative_tokens"] == k
        assert ("model" in config) == spec.method.startswith("eagle")
    else:
        assert ns.speculative_algorithm == {"mtp": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3",
                                            "ngram": "NGRAM"}[spec.method]
        assert int(ns.speculative_num_draft_tokens) == k + 1
        if spec.method != "ngram":
            assert (int(ns.speculative_num_steps), int(ns.speculative_eagle_topk)) == (k, 1)
        assert (ns.speculative_draft_model_path is not None) == spec.method.startswith("eagle")


def test_speculative_flags_in_training_mode_exit_2(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--speculative",
            "eagle", "--spec-tokens", "3", "--input-len-dist", "sharegpt")
    assert r.code == 2
    assert "--speculative" in r.err and "--input-len-dist" in r.err and "add --mode infer" in r.err


@pytest.mark.parametrize("name,experts", [("qwen3.5-35b-a3b", 256), ("qwen3-next-80b-a3b", 512)])
def test_a_hybrid_models_mtp_draft_is_one_moe_layer(name, experts):
    # Qwen3-Next / Qwen3.5 config.json: one MTP module, a gated full-attention MoE layer (hidden 2048, experts of
    # moe_intermediate_size 512; gated fc1 2f x h + fc2 h x f = 3hf each). The target's per-layer mlp_layer_types
    # (40 / 48 entries) once came along with the one-layer draft, which then priced every layer's experts.
    from llmplan.cost.params import param_counts
    from llmplan.cost.speculative import draft_model
    m = resolve_model(name)
    draft = draft_model(m, SpeculativeSpec(method="mtp", num_speculative_tokens=1))
    assert draft is not None and draft.num_hidden_layers == 1
    assert param_counts(draft).routed_experts == experts * 3 * 2048 * 512


def test_qwen3_5_mtp_draft_step_is_a_small_part_of_the_verification():
    # one MoE layer and the output head against 40 layers and the same head: well under a tenth (the draft
    # cost 12.4 ms against a 15.8 ms verification at batch 64 while it priced 40 layers' experts)
    m = resolve_model("qwen3.5-35b-a3b")
    cluster = make_cluster("dgx-h100", 1, None)
    plan = ServePlan(tp=2, dp=4)
    spec = SpeculativeSpec(method="mtp", num_speculative_tokens=1)
    step = speculative_step(m, plan, cluster.system, replica_spans(plan, cluster), spec, 64, 1152, 0.0, "sglang")
    assert float(step.draft) < float(step.verify) / 10
