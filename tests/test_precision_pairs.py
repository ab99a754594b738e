"""benchmarks/precision_pairs.py (docs/validation.md#precision-pairs): the published pairs of runs that differ only
in precision, and the Nemotron-3.5 Lightning GB200 pair of issues 32 / 40 (Megatron-Bridge's BF16 verification card,
examples/model_verification_cards/nemotron-3.5-lightning/card.yaml at 067f987df: 28,750.07 tokens/s per GPU; the
26.08 performance summary's MXFP8 row, docs/performance-summary.md at 4ab94dfad: 28,672; same container, layout
and batch). What is asserted: which pairs the records hold, where llmplan's predicted MXFP8 saving sits (the GEMM
part, every TE-module matmul about 1.8x), the router's gating matmul kept out of MXFP8 (Megatron-Core's
TopKRouter.gating is a torch matmul, not a TE module), and (a strict xfail) the Lightning ratio within the
golden tolerance, which llmplan does not meet yet."""

from __future__ import annotations

import precision_pairs as P  # benchmarks/ is on the path (conftest)
import pytest

from llmplan.cost.gemm import layer_gemm_seconds
from llmplan.specs.plan import trained_model

GOLDEN_TOLERANCE = 0.05
"""|predicted / measured - 1| of the Lightning MXFP8 / BF16 ratio: the two measurements are different publications
(a card's last-10-step average, a table row rounded to 1,024 tokens/s per GPU: +-0.2%), so 5% leaves room for
them and for a price of the precision that is right to a few points."""


@pytest.fixture(scope="module")
def found(published_runs):
    return P.pairs(list(published_runs.values()))


def test_the_pairs_are_the_records_that_differ_only_in_precision(found, published_runs):
    lightning = [p for p in found if p["low"] == P.LIGHTNING[1]]
    assert [p["bf16"] for p in lightning] == [P.LIGHTNING[0]]
    (pair,) = lightning
    # the card's 28,750.07 and the table's 28,672 tokens/s per GPU (the records' published values)
    assert pair["measured"] == pytest.approx(28672 / 28750.07, rel=1e-9)
    for p in found:  # both rows of every pair share model, GPU, count, release and layout; one is bf16
        hi, lo = published_runs[p["bf16"]], published_runs[p["low"]]
        assert hi["model"]["name"] == lo["model"]["name"] and hi["hardware"]["gpu"] == lo["hardware"]["gpu"]
        assert p["recipe"] != "bf16"
    # 11 pairs in the data of 2026-12-06: Lightning, Super x 4, DeepSeek-V3 GB300, MPT H100 x 5
    assert len(found) >= 11


def test_the_predicted_saving_is_the_gemm_part(published_runs):
    hi, lo = (P.parts(rid, published_runs) for rid in P.LIGHTNING)
    # the arms share attention to the digit and exposed communication to 0.1%: the precision moves only the GEMMs
    # and the memory-bound part (the MXFP8 casts), and the GEMMs' saving is what makes the arm fast. (The MXFP8 row,
    # a performance-script run, reads Megatron-Bridge's 128M-parameter DP buckets, docs/validation.md#bridge-bucket;
    # the card's recipe is not known to go through CommOverlapConfig: 5e-5 of the exposed communication apart.)
    assert lo["attention"] == pytest.approx(hi["attention"], rel=1e-9)
    assert lo["comm"] == pytest.approx(hi["comm"], rel=1e-3)
    saved = hi["gemm"] - lo["gemm"]
    assert saved > 0.3 * hi["gemm"] and lo["memory_bound"] > hi["memory_bound"]
    assert saved > 0.1 * hi["total"]  # the GEMMs alone save over 10% of the bf16 step ...
    measured = published_runs[P.LIGHTNING[1]]["measured"]["tokens_per_s_per_gpu"] / \
        published_runs[P.LIGHTNING[0]]["measured"]["tokens_per_s_per_gpu"]
    assert measured < 1.0  # ... where the published MXFP8 run is 0.3% slower than the bf16 one


def test_every_te_matmul_of_the_moe_layer_is_priced_about_1_8x_as_fast(published_runs, acc):
    # the recipe runs all of them in MXFP8 (bf16_with_mxfp8_mixed: first_last_layers_bf16 False over the
    # provider's True; MTP inside the global fp8 context); their shapes (16,384 or 6,144 rows, K 1,856-4,096)
    # are where OpenXLA's published B200 fp8 / bf16 speed-up is 1.55-2.14 (docs/validation.md#fp8-small-gemm);
    # MXFP8 on cuBLASLt takes 5.1% more than per-tensor FP8 (docs/validation.md#mxfp8-credit): 1.79-1.82
    setups = [acc.record_setup(published_runs[rid], acc.family(rid)) for rid in P.LIGHTNING]
    (m, cluster, bf16), (_, _, mx) = setups
    m, gpu = trained_model(m, bf16), cluster.system.gpu
    for module in ("expert", "shared_expert", "recurrent", "attention"):
        ratio = sum(layer_gemm_seconds(m, bf16, gpu, True, only=module)) / \
            sum(layer_gemm_seconds(m, mx, gpu, True, only=module))
        assert 1.7 < ratio < 1.9, module


def test_router_matmul_stays_bf16_under_mxfp8(published_runs, acc):
    # NVIDIA/Megatron-LM megatron/core/transformer/moe/router.py (TopKRouter.gating -> router_gating_linear) at
    # 24bad8e677: a torch matmul over a plain parameter, outside Transformer Engine (docs/formulas.md#compressed.unquantized)
    (m, cluster, bf16), (_, _, mx) = [acc.record_setup(published_runs[rid], acc.family(rid)) for rid in P.LIGHTNING]
    m, gpu = trained_model(m, bf16), cluster.system.gpu
    assert layer_gemm_seconds(m, mx, gpu, True, only="router") == pytest.approx(
        layer_gemm_seconds(m, bf16, gpu, True, only="router"), rel=1e-12)


def test_te_gemm_profile_b300_mxfp8_speedup_is_priced_within_8_percent():
    # NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst at 1609c890e (P.TE_PROFILE_B300): one
    # 5B layer's 12 GEMMs at M = 15,872 (Lightning's micro-batch is 16,384 tokens), MXFP8 over BF16 1.42x with
    # TE's casts, 1.83x kernels only. Tolerance 8%: one published run (CUDA events, 100 iterations); before the
    # block-scaled rate llmplan credited MXFP8 with about 6% more than it shows, far short of the Lightning pair's 15%.
    pub, got = P.TE_PROFILE_B300, P.te_profile_priced()
    with_casts = (got["bf16"] / got["mxfp8"]) / (pub["bf16"] / pub["mxfp8"])
    kernels = (got["bf16_kernels"] / got["mxfp8_kernels"]) / (pub["bf16_kernels"] / pub["mxfp8_kernels"])
    # MXFP8's cuBLASLt GEMMs are priced from the same table's per-tensor FP8 times (MXFP8_CUBLAS_GEMM_TIME,
    # docs/validation.md#mxfp8-credit): with it the kernels' speed-up is 1.4% under the published one, the
    # casts' 2% over; within 8% either way
    assert abs(with_casts - 1) <= 0.08 and abs(kernels - 1) <= 0.08
    # the casts alone (autocast less kernels): 1.823 ms published, priced from CAST_BYTES within 10%
    assert (got["mxfp8"] - got["mxfp8_kernels"]) == pytest.approx(pub["mxfp8"] - pub["mxfp8_kernels"], rel=0.10)


def test_ultra_ab_outside_the_data_shows_the_same_over_credit():
    # Megatron-Bridge perf leaderboard at 6d780951a (P.ULTRA_MEASURED): MXFP8 1-4% faster than bf16 on Ultra
    pred, meas = P.ultra_ab()
    assert 1.0 < meas < 1.04
    assert pred / meas > 1.08  # llmplan credits MXFP8 with the same ~15% it gives Lightning


@pytest.mark.xfail(strict=True, reason="llmplan prices Lightning's MXFP8 step ~15% faster than its BF16 one; the "
                   "published pair is within 0.3% (docs/validation.md#precision-pairs: the saving is the GEMM part, "
                   "what takes it back in the measured run is not priced)")
def test_lightning_mxfp8_over_bf16_within_tolerance(found):
    (pair,) = [p for p in found if p["low"] == P.LIGHTNING[1]]
    assert abs(pair["predicted"] / pair["measured"] - 1) <= GOLDEN_TOLERANCE


def test_quantisation_launches_leave_the_lightning_arms_gpu_paced(published_runs):
    """docs/validation.md#quant-launches: Transformer Engine's quantisation kernels (TE v2.16 split_quantize, one
    MXFP8 quantisation per local expert; cost.kernels.grouped_linear_quant_kernels) raise the MXFP8 arm's host
    launches a micro-batch by about half over BF16's, yet at Grace's launch time they take under a sixth of the
    predicted micro-batch: llmplan's host mechanism (launches queued ahead of the GPU) leaves both arms GPU-paced,
    and the per-launch host time would have to be over ten times x86's for the launches alone to pace the step."""
    bf16, low = (P.launches(rid, published_runs) for rid in P.LIGHTNING)
    assert 1.3 < low["launches"] / bf16["launches"] < 1.8
    for arm in (bf16, low):
        assert arm["host_ms"] < arm["mb_ms"] / 6
        assert arm["need"] > 10
