"""How DeepSeek Sparse Attention's lightning indexer is trained, and what each setting runs
(ParallelPlan.indexer_loss, docs/formulas.md#compute.indexer_training). Expected values are written by hand
from the structure of NVIDIA/Megatron-LM's code at 1e23526adc:

- dsa.py (DeepSeek-V3.2): x and qr detached; at dsa_indexer_loss_coeff 0 the indexer runs under torch.no_grad
  (forward only, fused_qk_topk_naive: one fp32 pass over the scores); with the loss on, FusedDSAIndexerLoss
  runs the scores once and the KL target (QK^T of the main heads over every scored key) once in the forward,
  and in the backward (bwd_fused_indexer_loss_naive) the scores again, the unweighted scores, dQ and dK (four
  passes) and the target again (one), over every key for the dense and the sparse loss alike.
- csa.py (DeepSeek-V4): off the fused kernels, _forward_unfused_csa calls FusedDSAIndexerLoss in every training
  step and attaches its loss, so the same reference passes run at a coefficient of 0.
- csa_kernels.py (DeepSeek-V4's fused path): the KL target at any coefficient (over the k selected keys with the
  sparse flag, every compressed key without); the indexer backward only above 0.
"""

from __future__ import annotations

import pytest

from llmplan.cost.compute import attention_seconds, layer_flops
from llmplan.cost.sparse_gather import (
    gather_layer_seconds,
    indexer_loss,
    indexer_loss_layer_seconds,
    padded_slots,
    gather_rate_ratio,
)
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_gpus, builtin_models

MODELS = builtin_models()
V32, FLASH = MODELS["deepseek-v3.2"], MODELS["deepseek-v4-flash"]
GPUS = builtin_gpus()
H100, GB200 = GPUS["h100-sxm"], GPUS["gb200"]
PEAK = 1e15  # the dense attention rate handed to attention_seconds


def _plan(**kw: object) -> ParallelPlan:
    base: dict[str, object] = {"tp": 8, "pp": 1, "dp": 8, "ep": 8, "etp": 1, "micro_batch": 1, "global_batch": 64,
                               "seq_len": 4096, "dtype": "bf16"}
    return ParallelPlan(**{**base, **kw})


def _tf32(gpu) -> float:  # noqa: ANN001
    return gpu.tflops["tf32"] * 1e12 * gpu.sustained_clock_fraction


# DeepSeek-V3.2 at 4,096 tokens, tp 8: the indexer (64 heads of 128) scores every key, 2·64·128 + 2·64 FLOPs a
# pair; the core counts 2k - k²/s = 3,072 of the 2,048 selected keys per query at 128/8 heads of 192 + 128.
S, K_SEL, PAIR = 4096, 3072, 2 * 64 * 128 + 2 * 64
V32_SCORES = S * S * PAIR
V32_CORE = 2 * S * K_SEL * (128 / 8) * (192 + 128)
V32_TARGET = S * S * 2 * (128 / 8) * 192  # QK^T of the rank's heads at d_qk 192 over every scored pair


def test_the_setting_resolves_from_the_plan_the_model_and_the_path() -> None:
    # DeepSeek-V3.2's one public Megatron config (Megatron-Bridge PR #1421, df6f50aab): coefficient 0.001, the
    # dense loss; DeepSeek-V4: sparse where its fused CSA path is priced (the perf recipes), off elsewhere (the
    # library recipes' coefficient 0); a plan's own value wins
    assert V32.indexer_loss == "dense" and indexer_loss(V32, _plan(), H100) == "dense"
    assert indexer_loss(FLASH, _plan(tp=1), GB200) == "sparse"
    assert indexer_loss(FLASH, _plan(tp=1), H100) == "off"
    assert indexer_loss(V32, _plan(indexer_loss="off"), H100) == "off"
    assert indexer_loss(MODELS["deepseek-v3"], _plan(), H100) == "off"


def test_v32_with_the_loss_off_runs_its_scores_forward_only() -> None:
    # on main the scores were charged three times (forward and a 2x backward) at the attention rate
    p = _plan(indexer_loss="off")
    flops = layer_flops(V32, p, True).attention
    assert flops == pytest.approx(V32_CORE + V32_SCORES)
    expected = V32_CORE / PEAK + V32_SCORES / _tf32(H100) / 3
    assert attention_seconds(V32, p, H100, flops, PEAK) == pytest.approx(expected)


@pytest.mark.parametrize("loss", ["dense", "sparse"])
def test_v32_with_the_loss_on_runs_the_reference_loss_over_every_key(loss: str) -> None:
    # forward: scores + target; backward: 4 passes over the scores + the target again; the sparse loss masks
    # full score matrices, so it costs what the dense one does
    p = _plan(indexer_loss=loss)
    flops = layer_flops(V32, p, True).attention
    expected = V32_CORE / PEAK + (5 * V32_SCORES + 2 * V32_TARGET) / _tf32(H100) / 3
    assert attention_seconds(V32, p, H100, flops, PEAK) == pytest.approx(expected)


@pytest.mark.parametrize("loss", [None, "off", "dense", "sparse"])
def test_v4_off_its_fused_path_runs_the_reference_loss_at_any_coefficient(loss: str | None) -> None:
    # H100 has no published sparse gather rate: csa.py's unfused path, whose backward runs even at coefficient 0
    p = _plan(tp=1, dp=64, ep=64, indexer_loss=loss)
    flops = layer_flops(FLASH, p, True).attention
    # 21 CSA layers of 43 score s/4 compressed keys a query (64 heads of 128); target at 64 heads of 512
    scores = 21 * S * (S / 4) * PAIR / 43
    target = 21 * S * (S / 4) * 2 * 64 * 512 / 43
    core = flops - scores
    expected = core / PEAK + (5 * scores + 2 * target) / _tf32(H100) / 3
    assert attention_seconds(FLASH, p, H100, flops, PEAK) == pytest.approx(expected)


def test_v4_fused_path_prices_the_kernels_each_setting_runs() -> None:
    base = _plan(tp=1, dp=64, ep=64, dtype="fp8", recipe="mxfp8")
    sparse_t, sparse_b = indexer_loss_layer_seconds(FLASH, base.model_copy(update={"indexer_loss": "sparse"}), GB200)
    off_t, off_b = indexer_loss_layer_seconds(FLASH, base.model_copy(update={"indexer_loss": "off"}), GB200)
    dense_t, dense_b = indexer_loss_layer_seconds(FLASH, base.model_copy(update={"indexer_loss": "dense"}), GB200)
    assert sparse_b > 0 and off_b == 0  # coefficient 0: the indexer backward kernel does not run
    assert off_t == pytest.approx(sparse_t)  # the target over the k keys runs at any coefficient
    # dense: both over every compressed key, 1,024 slots against 512, at the call's rate for each
    ratio = 1024 / 512 * gather_rate_ratio(padded_slots(512)) / gather_rate_ratio(padded_slots(1024))
    assert dense_t == pytest.approx(sparse_t * ratio) and dense_b == pytest.approx(sparse_b * ratio)
    # the default is the perf recipe's sparse loss: the 26.08 rows' price is unchanged
    assert indexer_loss_layer_seconds(FLASH, base, GB200) == (sparse_t, sparse_b)
    fwd, bwd = gather_layer_seconds(FLASH, base, GB200)
    assert fwd > 0 and bwd > 0


def test_indexer_loss_on_a_model_without_an_indexer_is_one_line(cli) -> None:  # noqa: ANN001
    r = cli("estimate", "--model", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "32", "--tp", "8", "--pp",
            "8", "--pp-first-layers", "7", "--pp-last-layers", "6", "--ep", "32", "--etp", "1", "--global-batch",
            "1024", "--seq-len", "4096", "--indexer-loss", "sparse")
    assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1
    assert "indexer_loss sparse" in r.err and "--indexer-loss" in r.err
    ok = cli("estimate", "--model", "deepseek-v3.2", "--hardware", "dgx-h100", "--nodes", "32", "--tp", "8", "--pp",
             "8", "--pp-first-layers", "7", "--pp-last-layers", "6", "--ep", "32", "--etp", "1", "--global-batch",
             "1024", "--seq-len", "4096", "--indexer-loss", "off")
    assert ok.code == 0, ok.err
