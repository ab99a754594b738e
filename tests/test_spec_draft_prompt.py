"""The draft's pass over the prompt under speculative decoding (docs/formulas.md#infer.speculative,
#serve.phase). SGLang's EAGLE worker (MTP as NEXTN, EAGLE, EAGLE-3) runs every extend (prefill) batch through
the target with full hidden states and then the draft over the same tokens (sgl-project/sglang
speculative/eagle_worker.py @00559eac, EAGLEWorker.forward_batch_generation), and a PD prefill server hands that
pass's top-k and hidden states to decode (disaggregation/prefill.py @000c2b94); vLLM's proposer runs its first
pass over every scheduled token, a prefill's included (v1/spec_decode/llm_base_proposer.py @00c4f22d). Both
sample the draft once per request. TensorRT-LLM's drafter is not verified: not priced. Expected values are
worked out by hand from those rules and the models' config.json."""

from __future__ import annotations

import math

import pytest

from llmplan.cli.inputs import make_cluster
from llmplan.cost.speculative import draft_prompt_seconds
from llmplan.serving import replica_spans
from llmplan.specs.registry import resolve_model
from llmplan.specs.serve import ServeJob, ServePlan, SpeculativeSpec

LLAMA8B = resolve_model("llama-3.1-8b")
PHASE = ("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1", "--dp", "8",
         "--batch", "64", "--phase", "prefill", "--json")
EAGLE = ("--speculative", "eagle", "--spec-tokens", "3")


def _phase(cli, *args: str) -> dict:
    r = cli(*PHASE, *args)
    assert r.code == 0, r.err
    return r.json()["phase"]


def test_no_draft_no_prompt_pass():
    plan = ServePlan(tp=1, dp=8)
    cluster = make_cluster("dgx-h100", 1, None)
    spans = replica_spans(plan, cluster)
    for job in (ServeJob(engine="sglang"),
                ServeJob(engine="sglang", speculative=SpeculativeSpec(method="ngram", num_speculative_tokens=3,
                                                                       acceptance_rate=0.5)),
                ServeJob(engine="trtllm", speculative=SpeculativeSpec(method="eagle", num_speculative_tokens=3))):
        assert draft_prompt_seconds(LLAMA8B, plan, cluster.system, spans, job, 8192, 512, 8) == 0.0


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_prefill_pool_pays_an_eagle_heads_pass_of_about_one_target_layer(cli, engine):
    # The prefill step of 8,192 prompt tokens (8 prompts of 1,024) now adds the EAGLE head's pass over them.
    # By hand from Llama 3.1 8B's config: a layer's GEMMs are 2 x 8192 x (4096 x 6144 + 4096 x 4096 +
    # 3 x 4096 x 14336) = 3.57e12 FLOP; the target's output layer runs at the 8 prompts' last tokens only
    # (2 x 8 x 128256 x 4096 = 8.4e9 FLOP, 0.002 of a layer; docs/formulas.md#infer.prefill_logits), so the
    # target's step is ~32 layers and the head's pass one layer (its logits at 8 rows too): draft / plain
    # ~ 1 / 32, within 10%.
    plain, spec = _phase(cli, "--engine", engine), _phase(cli, "--engine", engine, *EAGLE)
    assert plain["draft_prefill_s"] == 0.0
    assert spec["step_s"] == pytest.approx(plain["step_s"] + spec["draft_prefill_s"], rel=1e-12)
    assert spec["draft_prefill_s"] / plain["step_s"] == pytest.approx(1 / 32, rel=0.1)
    assert spec["ttft_s"] == pytest.approx(math.ceil(1024 / 8192) * spec["step_s"], rel=1e-12)
    assert spec["input_tokens_per_s_per_gpu"] < plain["input_tokens_per_s_per_gpu"]


def test_trtllm_prefill_pool_is_priced_as_before(cli):
    plain, spec = _phase(cli, "--engine", "trtllm"), _phase(cli, "--engine", "trtllm", *EAGLE)
    assert spec["draft_prefill_s"] == 0.0 and spec["step_s"] == plain["step_s"]


def test_colocated_ttft_adds_the_drafts_pass_over_the_prompt(cli):
    def est(*extra: str) -> dict:
        r = cli("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1", "--dp",
                "8", "--batch", "64", "--json", *extra)
        assert r.code == 0, r.err
        return r.json()
    assert est("--engine", "sglang", *EAGLE)["ttft_s"] > est("--engine", "sglang")["ttft_s"]
    assert est("--engine", "trtllm", *EAGLE)["ttft_s"] == est("--engine", "trtllm")["ttft_s"]


def test_disaggregated_search_prefill_pools_carry_the_drafts_pass(cli):
    def doc(*extra: str) -> dict:
        r = cli("search", "--mode", "infer", "--disaggregated", "-m", "llama-3.1-8b", "--hardware", "dgx-h100",
                "--engine", "sglang", "--json", *extra)
        assert r.code == 0, r.err
        return r.json()
    spec, plain = doc(*EAGLE), doc()
    assert all(p["prefill"]["draft_prefill_s"] > 0 for p in spec["plans"])
    assert all(p["prefill"]["draft_prefill_s"] == 0 for p in plain["plans"])


def test_prefill_pool_text_names_the_drafts_pass_within_80_columns(cli):
    r = cli(*PHASE[:-1], "--engine", "sglang", *EAGLE)
    assert r.code == 0, r.err
    assert "of which the draft's pass over the prompt tokens" in r.out
    assert max(len(x) for x in r.out.splitlines()) <= 80
    plain = cli(*PHASE[:-1], "--engine", "sglang")
    assert "draft's pass" not in plain.out
