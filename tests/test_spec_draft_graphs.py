"""The draft's own passes and CUDA graphs under speculative decoding (docs/formulas.md#infer.speculative).
vLLM's EAGLE / MTP proposer (vllm-project/vllm vllm/v1/spec_decode/llm_base_proposer.py @00c4f22d,
SpecDecodeBaseProposer.propose) runs its first pass over every token the target scheduled, k + 1 per request
under the default padded drafter batch, then k - 1 passes of one token, each dispatched on PIECEWISE graphs of
the capture sizes fitted to the verification (padded to the smallest size that holds it, eager above the
largest). Expected values are worked out by hand from those rules."""

from __future__ import annotations

import pytest

from llmplan.cli.inputs import make_cluster
from llmplan.cost.serve_step import graph_padded_tokens
from llmplan.cost.speculative import draft_pass_graphs, draft_passes, speculative_step
from llmplan.serving import replica_spans
from llmplan.specs.registry import resolve_model
from llmplan.specs.serve import ServePlan, SpeculativeSpec

LLAMA8B = resolve_model("llama-3.1-8b")
SIZES = (8, 16, 32, 64, 128, 256, 512)  # a user's list: already whole multiples of q = 4 (k = 3)


def _eagle_on_h100() -> tuple:
    """(plan, system, spans, spec): Llama 3.1 8B replicas of one H100 on a DGX H100 with an EAGLE head, k = 3."""
    plan = ServePlan(tp=1, dp=8)
    cluster = make_cluster("dgx-h100", 1, None)
    return plan, cluster.system, replica_spans(plan, cluster), SpeculativeSpec(method="eagle", num_speculative_tokens=3)


def test_vllm_and_sglang_draft_once_over_the_verified_tokens_and_k_minus_1_times_one_token():
    # vLLM: first pass over the k + 1 scheduled tokens (rejected ones as padding), then k - 1 one-token passes.
    # SGLang (eagle_worker.py @00559eac): draft_forward runs speculative_num_steps - 1 = k - 1 forwards, then
    # forward_draft_extend_after_decode over accept_length + 1 tokens a request: on average the tokens gained,
    # 1 + 0.75 + 0.75^2 + 0.75^3 = 2.734375 at k = 3, alpha 0.75. TensorRT-LLM: not verified, k of one token.
    gained = 1 + 0.75 + 0.75**2 + 0.75**3
    assert draft_passes(3, "vllm", gained) == (4, 1, 1)
    assert draft_passes(3, "sglang", gained) == pytest.approx((2.734375, 1, 1), rel=1e-12)
    assert draft_passes(1, "vllm", 1.75) == (2,) and draft_passes(1, "sglang", 1.75) == (1.75,)
    assert draft_passes(2, "trtllm", 2.0) == (1, 1)


def test_vllm_draft_passes_pad_to_the_verifications_sizes_and_their_own_ceiling():
    # The verification's ceiling: 512 tokens / 4 = 128 requests. The first pass carries 4 tokens a request (the
    # same ceiling); the one-token passes reach 512 requests.
    first, later = (draft_pass_graphs("vllm", q, 3, SIZES, 128) for q in (4, 1))
    assert first == {"graph_sizes": SIZES, "graph_top": 128} and later == {"graph_sizes": SIZES, "graph_top": 512}
    # 45 requests: the first pass's 180 tokens replay the 256 graph, each later pass's 45 tokens the 64 graph
    assert graph_padded_tokens(45, 4, SIZES, True) == 256 and graph_padded_tokens(45, 1, SIZES, True) == 64
    assert draft_pass_graphs("sglang", 1, 3, SIZES, 128) == {} and draft_pass_graphs("vllm", 1, 3, None, None) == {}


def test_a_first_draft_pass_above_the_ceiling_pays_one_eager_launch_set():
    # 200 requests x 4 tokens = 800 > 512: vLLM's drafter runs that pass without a graph (dispatch NONE), the two
    # one-token passes (200 <= 512) replay graphs. An EAGLE head is one Llama layer: 4 GEMMs (fused QKV, output,
    # fused gate-up, down), attention and 6 memory-bound kernels = 11 launches x 5 us (infer.step) = 55 us, once.
    plan, system, spans, spec = _eagle_on_h100()
    eager = speculative_step(LLAMA8B, plan, system, spans, spec, 200, 2048, 0.0, "vllm", 128, SIZES)
    graphed = speculative_step(LLAMA8B, plan, system, spans, spec, 200, 2048, 0.0, "vllm", 200, SIZES)
    assert float(eager.draft - graphed.draft) == pytest.approx(11 * 5e-6, rel=1e-9)


def test_vllm_draft_costs_more_than_k_unpadded_one_token_passes():
    # The first pass carries k + 1 tokens a request: the draft's step is dearer than k one-token passes (as
    # TensorRT-LLM's stay priced) on the same plan.
    plan, system, spans, spec = _eagle_on_h100()
    v = speculative_step(LLAMA8B, plan, system, spans, spec, 64, 2048, 0.0, "vllm")
    t = speculative_step(LLAMA8B, plan, system, spans, spec, 64, 2048, 0.0, "trtllm")
    assert v.draft > t.draft


@pytest.mark.parametrize("engine,passes", [("vllm", [4, 1, 1]), ("sglang", [2.734375, 1, 1]),
                                           ("trtllm", [1, 1, 1])])
def test_cli_json_names_the_draft_passes(cli, engine, passes):
    # EAGLE's published default acceptance 0.75 (specs.serve.ACCEPTANCE): SGLang's draft extend 2.734375 tokens
    r = cli("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1", "--batch",
            "64", "--engine", engine, "--speculative", "eagle", "--spec-tokens", "3", "--json")
    assert r.code == 0, r.err
    assert r.json()["speculative"]["draft_pass_tokens_per_seq"] == pytest.approx(passes, rel=1e-12)


def test_cli_text_names_the_draft_passes_within_80_columns(cli):
    r = cli("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1", "--batch",
            "64", "--engine", "vllm", "--speculative", "eagle", "--spec-tokens", "3")
    assert r.code == 0, r.err
    assert "draft passes of 4 + 1 + 1 tokens per sequence" in r.out
    assert max(len(x) for x in r.out.splitlines()) <= 80


@pytest.mark.parametrize("engine,first", [("vllm", 4.0), ("sglang", 1 + 0.75 + 0.75**2 + 0.75**3)])
def test_each_draft_pass_samples_one_row_per_request(monkeypatch, engine, first):
    # vLLM's proposer runs its first pass over the k + 1 tokens of each request but computes the draft's logits at
    # token_indices_to_sample only, one row a request (llm_base_proposer.py @00c4f22d, SpecDecodeBaseProposer.propose:
    # sample_hidden_states = last_hidden_states[token_indices_to_sample]); SGLang's draft extend (ForwardMode
    # DRAFT_EXTEND with CaptureHiddenMode.LAST, eagle_worker.py forward_draft_extend_after_decode) prunes its logits
    # to each request's last token (layers/logits_processor.py @009db01a LogitsProcessor.forward: last_index =
    # cumsum(extend_seq_lens) - 1). So at 64 requests, k = 3, every draft pass's
    # output layer sees 64 rows, while its layers see 64 x 4 (vLLM) or 64 x 2.734375 (SGLang) tokens on the first.
    import llmplan.cost.serve_step as serve_step
    seen = []
    real = serve_step.linear_seconds

    def recording(m, plan, gpu, dtype, tokens, head_rows=None):
        seen.append((m is LLAMA8B, float(tokens), None if head_rows is None else float(head_rows)))
        return real(m, plan, gpu, dtype, tokens, head_rows)
    monkeypatch.setattr(serve_step, "linear_seconds", recording)
    plan, system, spans, spec = _eagle_on_h100()
    speculative_step(LLAMA8B, plan, system, spans, spec, 64, 2048, 0.0, engine)
    draft = sorted((tokens, rows) for target, tokens, rows in seen if not target)
    assert [tokens for tokens, _ in draft] == pytest.approx([64.0, 64 * first], rel=1e-12)
    assert [rows for _, rows in draft] == [64.0, 64.0]
    # the verification samples every one of its k + 1 tokens a request (the rejection sampler reads them all)
    assert [(tokens, rows) for target, tokens, rows in seen if target] == [(256.0, None)]
