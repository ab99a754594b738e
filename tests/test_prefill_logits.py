"""A prefill step's output layer and sampler run over one row per request, not per prompt token
(docs/formulas.md#infer.prefill_logits): vLLM v1 computes logits at logits_indices = query_start_loc[1:] - 1
(vllm/v1/worker/gpu_model_runner.py @4e179065, GPUModelRunner._prepare_inputs / execute_model), SGLang's
LogitsProcessor keeps each extend request's last index (python/sglang/srt/layers/logits_processor.py
@009db01a), TensorRT-LLM's PyTorch LogitsProcessor keeps cumsum(seq_lens) - 1 unless a request asks for its
context logits (tensorrt_llm/_torch/modules/logits_processor.py @89fd9b74). Expected values by hand from
Llama 3.1 8B's config.json (hidden 4096, vocab 128256, untied) and the H100 profile."""

from __future__ import annotations

import pytest

import llmplan.cost.inference as inference
from llmplan.cost.serve_step import SERVE_GEMM_M_HALF, step_seconds
from llmplan.serving import replica_spans
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.serve import ServeJob, ServePlan

LLAMA8B = builtin_models()["llama-3.1-8b"]
SYSTEM = builtin_systems()["dgx-h100"]
H100 = SYSTEM.gpu
PLAN = ServePlan()  # one GPU, bf16 weights
SPANS = replica_spans(PLAN, ClusterSpec(system=SYSTEM, num_nodes=1, gpus_per_node=1))


def _logit_rows_seen(monkeypatch, call) -> list[tuple[float, float | None]]:
    """(tokens, logit_rows) of every target step the call prices (the real step_seconds still runs)."""
    seen: list[tuple[float, float | None]] = []

    def spy(m, plan, system, spans, tokens, *args, logit_rows=None, **kw):
        if m is LLAMA8B:
            seen.append((float(tokens), None if logit_rows is None else float(logit_rows)))
        return step_seconds(m, plan, system, spans, tokens, *args, logit_rows=logit_rows, **kw)

    monkeypatch.setattr(inference, "step_seconds", spy)
    call()
    return seen


@pytest.mark.parametrize("input_len,tokens,rows", [
    (1000, 2000.0, 2.0),    # two prompts of 1,000 fill a step of 2,000 tokens: two rows
    (250, 2000.0, 8.0),     # eight prompts of 250
    (10000, 2000.0, 1.0),   # a prompt longer than the step: one chunk of it, one row
])
def test_batched_prefill_step_samples_one_row_per_prompt(monkeypatch, input_len, tokens, rows):
    job = ServeJob(input_len=input_len, output_len=100, max_num_batched_tokens=2000)
    seen = _logit_rows_seen(monkeypatch, lambda: inference.prefill_work_seconds(LLAMA8B, PLAN, SYSTEM, SPANS, job))
    assert seen == [(tokens, rows)]


def test_chunked_ttft_step_samples_the_chunk_once_and_each_decode(monkeypatch):
    # TTFT of a 1,000-token prompt beside 30 decodes, steps of 2,048 tokens: one chunk of 1,000 (2,048 - 30 is
    # more) and 30 decode tokens, so 31 rows of logits, not 1,030; a 5,000-token prompt runs in chunks of
    # 2,018 tokens (vLLM samples a partial chunk's last token too and drops it), each step 1 + 30 rows.
    job = ServeJob(input_len=1000, output_len=100, max_num_batched_tokens=2048)
    seen = _logit_rows_seen(monkeypatch, lambda: inference.prefill_seconds(LLAMA8B, PLAN, SYSTEM, SPANS, job, 30))
    assert seen == [(1030.0, 31.0)]
    long = job.model_copy(update={"input_len": 5000})
    seen = _logit_rows_seen(monkeypatch, lambda: inference.prefill_seconds(LLAMA8B, PLAN, SYSTEM, SPANS, long, 30))
    assert seen == [(2048.0, 31.0)]


def test_llama8b_two_prompts_output_layer_priced_at_two_rows_not_2000():
    # Llama 3.1 8B, a prefill step of 2 requests x 1,000 tokens on one H100 in bf16. The output layer's GEMM is
    # 2 x rows x 4096 x 128256 FLOP: 2 x 2 x 4096 x 128256 = 2.10e9 at one row per request, against
    # 2 x 2000 x 4096 x 128256 = 2.10e12 when every prompt token was priced. Each at the serving GEMM law
    # (docs/formulas.md#infer.step): peak x best fraction x M / (M + SERVE_GEMM_M_HALF) x N fill (128256 =
    # 1002 x 128 tiles, 1) x K / (K + k_half); the sampler reads 2 x 4 bytes of fp32 logits per row and vocab
    # entry at the achieved HBM bandwidth. The step is compute-bound (2 x 2000 x 8.0e9 FLOP of layers against
    # 16 GB of weights), so the step shrinks by exactly the two rows' difference.
    h, V = 4096, 128256
    assert 2 * 2 * h * V == 2_101_346_304
    assert 2 * 2000 * h * V == 2_101_346_304_000

    def head_s(rows: float) -> float:
        eff = H100.max_gemm_fraction("bf16") * rows / (rows + SERVE_GEMM_M_HALF) * 1.0 * h / (h + H100.gemm_k_half)
        return 2 * rows * h * V / (H100.sustained_flops("bf16") * eff)

    sampler = 2 * 4.0 * V * (2000 - 2) / H100.hbm_achieved_bytes_per_s
    expected = head_s(2000) - head_s(2) + sampler
    T, pairs = 2000.0, 2000.0 * 500  # each token attends to half its 1,000-token prompt on average
    every_token = step_seconds(LLAMA8B, PLAN, SYSTEM, SPANS, T, pairs, 0.0, engine="vllm")
    per_request = step_seconds(LLAMA8B, PLAN, SYSTEM, SPANS, T, pairs, 0.0, engine="vllm",
                               logit_rows=inference.prefill_logit_rows(2))
    assert float(every_token - per_request) == pytest.approx(expected, rel=1e-9)


def test_trtllm_prefill_heavy_throughput_rises_when_logits_are_per_request(monkeypatch):
    # A prefill-heavy offline run (input 2,048, output 128): the batched prefill is most of the period, so
    # pricing its output layer at one row per prompt must raise throughput; a decode-only step is unchanged.
    job = ServeJob(input_len=2048, output_len=128, batch=64, engine="trtllm")
    new = float(inference.serve_timing(LLAMA8B, PLAN, SYSTEM, SPANS, job, 64).tokens_per_s_replica)
    monkeypatch.setattr(inference, "prefill_logit_rows", lambda prompts, decodes=0.0: None)  # every token
    old = float(inference.serve_timing(LLAMA8B, PLAN, SYSTEM, SPANS, job, 64).tokens_per_s_replica)
    assert new > old


def test_wideep_breakdown_script_prices_the_rows_as_the_accuracy_run_does():
    # benchmarks/prefill_logits.py (docs/validation.md#prefill-logits) re-prices the wideep prefill rows' step;
    # its one-row-per-prompt step must be the one benchmarks/accuracy.py scores (input tokens/s = tokens / step,
    # one GPU an attention rank; these SGLang prefill pools add no host time or stage hop to the step).
    import yaml
    from accuracy import WIDE_EP_RUNS, predict_wide_ep
    from prefill_logits import row_parts

    recs = [r for r in yaml.safe_load(WIDE_EP_RUNS.read_text())
            if not r.get("excluded") and r["plan"]["phase"] == "prefill"]
    assert len(recs) == 6
    for rec in recs:
        p = row_parts(rec)
        pred, meas, _ = predict_wide_ep(rec)
        assert p["tokens"] / p["new"] == pytest.approx(pred, rel=1e-9)
        assert p["old"] > p["new"]  # the every-token output layer only ever added time
        assert p["tokens"] / p["measured"] == pytest.approx(meas, rel=1e-12)
