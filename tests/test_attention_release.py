"""The native fused attention kernel's rate by software release (ParallelPlan.attention_release,
GpuSpec.attention_release_efficiency; docs/formulas.md#compute.attention_release), issue 32's software-stack
generation. Golden: the Hopper profiles' per-release asymptotes, through the rate curve at the benchmark's
shape, reproduce NVIDIA's published cuDNN SDPA training rates within a stated tolerance."""

from __future__ import annotations

import pytest

from refusal import one_line
from llmplan.cost.attention_rate import attention_fraction, attention_rate_ratio, native_attention_asymptote
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ATTENTION_RELEASES, ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

S = builtin_systems()
M = builtin_models()

# Published cuDNN fused SDPA rates on H200 (clocks locked at 1980 MHz), bf16, causal, head dim 128, TFLOP/s
# as the benchmark scripts count them (causal pairs; backward 2.5x the forward's FLOPs), by sequence length:
# (heads, batch, tokens, forward, backward).
#  - cuDNN 9.1.0: NVIDIA/cudnn-frontend benchmark/benchmark_results.csv at commit b740542 (2024-05-07; the
#    README's sample output prints "cudnn backend version : 90100"), 16 heads, batch x sequence = 16k.
#  - cuDNN 9.4.0: the same file at commit de355c7 (2024-09-23; the cudnn-frontend v1.7.0 release notes in that
#    commit: "Updated benchmark numbers with cudnn 9.4.0 for fp16 and fp8 datatypes"), same shapes.
#  - cuDNN 9.19.1: NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/
#    llama3.1_20260227_034703.csv (commit df73764; cudnn_backend_version 91901), Llama 3.1 GQA 64 query /
#    8 KV heads, batch 1, non-deterministic backward.
PUBLISHED = {
    "cudnn-9.1": [(16, 4, 4096, 542.3, 443.6), (16, 2, 8192, 572.9, 463.5), (16, 1, 16384, 586.8, 497.7),
                  (16, 1, 32768, 577.3, 499.7), (16, 1, 65536, 567.0, 503.8)],
    "cudnn-9.4": [(16, 4, 4096, 613.49, 438.45), (16, 2, 8192, 645.95, 461.89), (16, 1, 16384, 649.99, 488.56),
                  (16, 1, 32768, 636.08, 504.14), (16, 1, 65536, 631.20, 508.07)],
    "cudnn-9.19": [(64, 1, 4096, 591.0, 474.0), (64, 1, 8192, 644.0, 541.0), (64, 1, 16384, 673.0, 579.0),
                   (64, 1, 32768, 688.0, 581.0)],
}
TOLERANCE = 0.05  # one asymptote per release through the cp = 1 rate curve (compute.cp_attention) at 4k-64k


def _llmplan_count(fwd: float, bwd: float) -> float:
    """A published (forward, backward) pair on llmplan's count: QK^T and AV not halved for the causal mask
    (2x the script's forward FLOPs), backward twice the forward: 6 / (1/fwd + 2.5/bwd)."""
    return 6.0 / (1.0 / fwd + 2.5 / bwd)


def _predicted(release: str, heads: int, batch: int, s: int) -> float:
    """The H200 profile's attention rate (TFLOP/s, llmplan's count) for one causal call of the benchmark's
    shape as a training step prices it: the release's asymptote x the rate curve x the sustained bf16 peak (the
    published rate read at its own clock: docs/formulas.md#compute.published_clock)."""
    gpu = S["dgx-h200"].gpu
    m = M["llama-2-13b"].model_copy(update={"num_attention_heads": heads})  # head dim 128
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch=batch, global_batch=batch, seq_len=s,
                        attention_release=release)
    return float(native_attention_asymptote(gpu, plan) * attention_rate_ratio(m, plan, gpu)
                 * gpu.sustained_flops("bf16") / 1e12)


@pytest.mark.parametrize("release", list(PUBLISHED))
def test_profile_reproduces_the_published_release_rates(release):
    for heads, batch, s, fwd, bwd in PUBLISHED[release]:
        assert _predicted(release, heads, batch, s) == pytest.approx(_llmplan_count(fwd, bwd), rel=TOLERANCE), s


def test_every_release_has_a_published_point_and_every_hopper_profile_lists_them():
    assert set(PUBLISHED) == set(ATTENTION_RELEASES)
    for name in ("dgx-h100", "dgx-h200", "hgx-h100-96gb", "dgx-h800"):
        assert set(S[name].gpu.attention_release_efficiency) == set(ATTENTION_RELEASES), name


def test_a_named_release_replaces_the_gpu_s_attention_efficiency_and_none_keeps_it():
    gpu = S["dgx-h100"].gpu
    m = M["llama-3.1-8b"]
    base = ParallelPlan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, seq_len=8192)
    assert native_attention_asymptote(gpu, base) == gpu.attention_efficiency
    fractions = {}
    for release in ATTENTION_RELEASES:
        plan = base.model_copy(update={"attention_release": release})
        assert native_attention_asymptote(gpu, plan) == pytest.approx(
            gpu.attention_release_efficiency[release] / gpu.sustained_clock_fraction)  # read at its own clock
        fractions[release] = float(attention_fraction(gpu, plan, m))
    # the same plan, two releases: the rates stand in the published ratio (9.19 over 9.1 at 8k: +15.6%)
    assert fractions["cudnn-9.19"] / fractions["cudnn-9.1"] == pytest.approx(
        _llmplan_count(644.0, 541.0) / _llmplan_count(572.9, 463.5), rel=0.05)


def test_check_plan_refuses_a_release_without_a_published_rate_or_with_another_kernel():
    m = M["llama-3.1-8b"]
    plan = ParallelPlan(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, seq_len=8192, attention_release="cudnn-9.1")
    a100 = ClusterSpec(system=S["dgx-a100"], num_nodes=1, gpus_per_node=8)
    h100 = ClusterSpec(system=S["dgx-h100"], num_nodes=1, gpus_per_node=8)
    assert not check_plan(m, plan, h100)
    assert any("attention_release cudnn-9.1 on a100" in v.message for v in check_plan(m, plan, a100))
    flash2 = plan.model_copy(update={"attention_kernel": "flash2"})
    assert any("attention_kernel flash2" in v.message for v in check_plan(m, flash2, h100))


def _cli(cli, *args: str):
    """`llmplan estimate` of llama-3.1-8b on one node at tp1 pp1, in-process through the real entry point (the
    conftest's cli: exit code, stdout, stderr)."""
    return cli("estimate", "--model", "llama-3.1-8b", "--nodes", "1", "--tp", "1", "--pp", "1", *args)


def test_cli_refuses_an_unknown_release_in_one_line(cli):
    r = _cli(cli, "--hardware", "dgx-h100", "--attention-release", "cudnn-8.9")
    assert r.code == 2
    assert "--attention-release cudnn-8.9 is not a release" in one_line(r.err)


def test_cli_refuses_a_release_the_gpu_has_no_rate_for(cli):
    r = _cli(cli, "--hardware", "dgx-a100", "--attention-release", "cudnn-9.19")
    assert r.code == 2 and "no published attention rate" in r.err and "Traceback" not in r.err


def test_cli_release_changes_the_estimate(cli):
    rates = [float(_cli(cli, "--hardware", "dgx-h100", "--seq-len", "8192", *extra, "--json").out.split(
        '"tokens_per_s": ')[1].split(",")[0]) for extra in ((), ("--attention-release", "cudnn-9.1"),
                                                           ("--attention-release", "cudnn-9.19"))]
    assert rates[1] < rates[2]


def test_containers_read_the_published_release_at_or_before_their_cudnn(acc):
    # NeMo Framework container -> cuDNN: NVIDIA-NeMo/Megatron-Bridge docs/releases/software-versions.md
    # (e49e451ba): 25.09 9.11.0.98, 25.11 9.13.1.26, 26.02 9.18.0.50, 26.04 9.20.0.48, 26.06 9.21.1.3.
    published = {"nemo:25.09": (9, 11, 0), "nemo:25.11": (9, 13, 1), "nemo:26.02": (9, 18, 0),
                 "nemo:26.04": (9, 20, 0), "nemo:26.06": (9, 21, 1)}
    assert {k: acc.CONTAINER_CUDNN[k] for k in published} == published
    assert [v for v, _ in acc.PUBLISHED_RELEASES] == sorted(v for v, _ in acc.PUBLISHED_RELEASES)
    assert {name for _, name in acc.PUBLISHED_RELEASES} == set(ATTENTION_RELEASES)
    reads = {c: acc.release_for_cudnn(v) for c, v in published.items()}
    assert reads == {"nemo:25.09": "cudnn-9.4", "nemo:25.11": "cudnn-9.4", "nemo:26.02": "cudnn-9.4",
                     "nemo:26.04": "cudnn-9.19", "nemo:26.06": "cudnn-9.19"}
    assert acc.release_for_cudnn((9, 0, 0)) is None and acc.release_for_cudnn((9, 19, 0)) == "cudnn-9.4"
    assert acc.release_for_cudnn((9, 19, 1)) == "cudnn-9.19" and acc.release_for_cudnn(None) is None


def test_records_name_their_container_from_the_table_release_or_the_source(acc):
    assert acc.record_container({"id": "mbridge-26.02.01-pretrain-llama3-70b-dgx-h100-64gpu-fp8"}) == "nemo:26.02"
    assert acc.record_container({"id": "bridge-2511-h100-fp8-cs-llama3-8b-8gpu-gbs128"}) == "nemo:25.11"
    assert acc.record_container({"id": "dgxc-x", "source": {"name": "(nvcr.io/nvidia/nemo:25.07.01 container)"}}) \
        == "nemo:25.07"
    assert acc.record_container({"id": "nemocp-h100-fp8-llama2-7b-s4k-4gpu", "notes": "NeMo 24.03.01"}) is None
    # the mode is off by default: no record reads a release (docs/validation.md#container-cudnn)
    rec = {"id": "mbridge-26.04-pretrain-llama3-70b-dgx-h100-64gpu-fp8", "hardware": {"gpu": "H100", "gpus": 64}}
    assert acc.attention_release_mode == "off" and acc.attention_release_for(rec, "mbridge-dense") is None
