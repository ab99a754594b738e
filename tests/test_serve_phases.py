"""Issue 36 (first half): one phase priced on its own (estimate --phase prefill|decode), data-parallel attention
with wide expert parallelism (DeepEP dispatch, two-batch overlap, EPLB redundant experts, expert dtype), the
SGLang / vLLM launch lines for such pools, and the published wide-EP deployments they are held against."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from llmplan.cost.inference import serve_weight_bytes
from llmplan.cost.params import mlp_params, rank_params
from llmplan.cost.serve_moe import (DispatchTime, deepep_low_latency, dispatch_bytes_per_element, overlapped_step,
                                    serve_ep_imbalance)
from llmplan.serving import estimate_serving, replica_spans
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.serve import ServeJob, ServePlan
from llmplan.topology.collectives import group_links

from test_export import command_argv, recorded_parser

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import accuracy  # noqa: E402

WIDE_EP = yaml.safe_load((ROOT / "benchmarks" / "data" / "wide_ep_serving.yaml").read_text())
DSV3 = builtin_models()["deepseek-v3"]


def pool(system: str, nodes: int, ep: int, phase: str, **kw) -> tuple[ClusterSpec, ServePlan]:
    cluster = ClusterSpec(system=builtin_systems()[system], num_nodes=nodes)
    plan = ServePlan(tp=1, dp=ep, ep=ep, phase=phase, dp_attention=True, moe_dispatcher="deepep",
                     weight_dtype="fp8", **kw)
    return cluster, plan


# --- golden: published wide-EP pools ------------------------------------------------------------------------

@pytest.mark.parametrize("rec", [r for r in WIDE_EP if not r.get("excluded")], ids=lambda r: r["id"])
def test_published_wide_ep_pools_within_tolerance(rec):
    # Each record cites its source (rec["source"], rec["where"]): LMSYS blogs 2025-05-05 (96 H100), 2025-06-16
    # and 2025-09-25 (GB200 NVL72), DeepSeek's profile-data. Tolerance 40% per record (the GB200 part I decode,
    # an earlier software release on the same hardware as the 9,087 tokens/s of part II, sits at +37%).
    pred, meas, _ = accuracy.predict_wide_ep(rec)
    assert abs(pred - meas) / meas <= 0.40, (rec["id"], pred, meas)


@pytest.mark.parametrize("gpu", ["h100-sxm", "gb200"])
def test_median_error_on_h100_and_gb200_nvl72_within_20_percent(gpu):
    # Issue 36's target: median |error| <= 20% on the published per-GPU prefill and decode rates of wide-EP
    # DeepSeek-class deployments on H100 and on GB200 NVL72 (sources in benchmarks/data/wide_ep_serving.yaml).
    errs = []
    for rec in WIDE_EP:
        if rec.get("excluded") or builtin_systems()[rec["system"]].gpu.name != gpu:
            continue
        pred, meas, _ = accuracy.predict_wide_ep(rec)
        errs.append(abs(pred - meas) / meas)
    assert len(errs) >= 4 and statistics.median(errs) <= 0.20, errs


def test_lmsys_h100_decode_pool_golden():
    # LMSYS blog 2025-05-05 (https://lmsys.org/blog/2025-05-05-large-scale-ep/), decode table: 9 x 8 H100, EP72,
    # 256 sequences per GPU at 2,000 tokens of KV, 22,282 output tokens/s per node. Tolerance 20%.
    cluster, plan = pool("dgx-h100", 9, 72, "decode", two_batch_overlap=True, redundant_experts=32)
    # The fraction these tests were priced with (llmplan's SGLang default before 2026-12-06): SGLang's own default
    # reserves more than the GPU at 72 attention-DP ranks (docs/validation.md#sglang-mem-fraction).
    e = estimate_serving(DSV3, cluster, plan, ServeJob(input_len=2000, output_len=100, batch=256, engine="sglang",
                                                       gpu_memory_utilization=0.9))
    assert e.phase is not None and e.memory.fits
    assert e.phase.output_tokens_per_s_per_gpu == pytest.approx(22_282 / 8, rel=0.20)


# --- mechanisms ----------------------------------------------------------------------------------------------

def test_redundant_experts_add_their_replicas_to_each_rank():
    _, plan = pool("dgx-h100", 4, 32, "prefill")
    extra = serve_weight_bytes(DSV3, plan.model_copy(update={"redundant_experts": 32})) - serve_weight_bytes(DSV3, plan)
    one_expert = mlp_params(DSV3, DSV3.expert_ffn) * (1.0 + 4 / 16384)  # fp8 with 128x128 block scales
    assert extra == pytest.approx(DSV3.num_moe_layers * 32 / 32 * one_expert, rel=1e-9)


def test_nvfp4_experts_halve_expert_weights_and_dispatch_bytes():
    _, plan = pool("gb200-nvl72", 12, 48, "decode")
    fp4 = plan.model_copy(update={"expert_dtype": "nvfp4"})
    gpu = builtin_systems()["gb200-nvl72"].gpu
    assert dispatch_bytes_per_element(fp4, gpu) < dispatch_bytes_per_element(plan, gpu) < 2.0
    experts = float(rank_params(DSV3, plan, 0).expert)  # the rank's routed experts (MTP layer included)
    saved = serve_weight_bytes(DSV3, plan) - serve_weight_bytes(DSV3, fp4)
    assert saved == pytest.approx(experts * ((1.0 + 4 / 16384) - (0.5 + 1 / 16)), rel=1e-9)
    # H100 has no fp4 tensor cores: its dispatch stays fp8
    assert dispatch_bytes_per_element(fp4, builtin_systems()["dgx-h100"].gpu) == dispatch_bytes_per_element(plan, gpu)


def test_imbalance_is_one_with_ep_inside_a_replica_and_grows_with_the_input():
    _, plan = pool("dgx-h100", 9, 72, "decode")
    inside = ServePlan(tp=8, dp=9, ep=8, weight_dtype="fp8")  # EP over each replica's own TP ranks
    assert serve_ep_imbalance(DSV3, inside, 256) == 1.0
    assert serve_ep_imbalance(DSV3, plan, 256) > plan.ep_imbalance
    assert serve_ep_imbalance(DSV3, plan, 16) > serve_ep_imbalance(DSV3, plan, 4096)


def test_low_latency_dispatch_inside_an_nvlink_domain_is_one_latency_plus_bytes_over_nvlink():
    # across nodes: tests/test_deepep_ll.py (DeepEP's published pure-RDMA table)
    cluster, plan = pool("gb200-nvl72", 12, 48, "decode")
    span = replica_spans(plan, cluster).ep
    assert not span.uses_nic
    a, b = (deepep_low_latency(DSV3, plan, cluster.system, span, t, 1.0) for t in (128.0, 256.0))
    assert isinstance(a, DispatchTime) and a.total > 0
    # affine in tokens: the latency (2a - b) is NVLink's, the rest the routed copies' bytes over NVLink:
    # 128 tokens x 8 copies x 7,168 x 47/48 remote x (1 + 4/128) bytes
    links = group_links(cluster.system, span)
    assert 2 * a.dispatch - b.dispatch == pytest.approx(links.intra_alpha, rel=1e-6)
    assert a.dispatch - links.intra_alpha == pytest.approx(128 * 8 * 7168 * 47 / 48 * (1 + 4 / 128) / links.intra_bw)
    assert a.combine - links.intra_alpha == pytest.approx(128 * 8 * 7168 * 47 / 48 * 2.0 / links.intra_bw)


def test_two_batch_overlap_hides_the_exchange_up_to_the_compute():
    assert overlapped_step(1.0, 0.5, 0.5, 0.25, tbo=False) == 1.5
    assert overlapped_step(1.0, 0.5, 0.5, 0.25, tbo=True) == 1.0
    assert overlapped_step(1.0, 3.0, 0.5, 1.5, tbo=True) == 3.0  # exchange-bound: compute hides behind it
    cluster, plan = pool("dgx-h100", 4, 32, "prefill")
    job = ServeJob(input_len=2000, output_len=100, batch=1, max_num_batched_tokens=16384, engine="sglang")
    off = estimate_serving(DSV3, cluster, plan, job).phase
    on = estimate_serving(DSV3, cluster, plan.model_copy(update={"two_batch_overlap": True}), job).phase
    assert on.input_tokens_per_s_per_gpu > off.input_tokens_per_s_per_gpu


@settings(max_examples=25, deadline=None, derandomize=True)
@given(batch=st.integers(1, 512), context=st.integers(256, 16_384))
def test_decode_pool_tpot_grows_with_context(batch, context):
    cluster, plan = pool("dgx-h100", 9, 72, "decode", two_batch_overlap=True, redundant_experts=32)
    short = ServeJob(input_len=context, output_len=2, batch=batch, engine="sglang")
    longer = short.model_copy(update={"input_len": context * 2})
    t1 = estimate_serving(DSV3, cluster, plan, short).phase.tpot_s
    t2 = estimate_serving(DSV3, cluster, plan, longer).phase.tpot_s
    assert t2 >= t1 > 0


# --- CLI -----------------------------------------------------------------------------------------------------

DECODE = ("estimate", "--mode", "infer", "-m", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "9", "--tp", "1",
          "--dp", "72", "--ep", "72", "--dtype", "fp8", "--engine", "sglang", "--input-len", "2000", "--output-len",
          "100", "--batch", "256", "--phase", "decode", "--dp-attention", "--moe-dispatcher", "deepep",
          "--two-batch-overlap", "--redundant-experts", "32", "--memory-fraction", "0.9")
# --memory-fraction 0.9: llmplan's SGLang default before 2026-12-06, as these tests were priced; SGLang's own
# default reserves more than the GPU at 72 attention-DP ranks (docs/validation.md#sglang-mem-fraction).
PREFILL = ("estimate", "--mode", "infer", "-m", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "4", "--tp",
           "1", "--dp", "32", "--ep", "32", "--dtype", "fp8", "--engine", "sglang", "--input-len", "2000",
           "--max-num-batched-tokens", "16384", "--phase", "prefill", "--dp-attention", "--moe-dispatcher",
           "deepep", "--two-batch-overlap", "--redundant-experts", "32", "--memory-fraction", "0.9")


def test_phase_json_keys(cli):
    for args, phase, rate in ((DECODE, "decode", "output_tokens_per_s_per_gpu"),
                              (PREFILL, "prefill", "input_tokens_per_s_per_gpu")):
        r = cli(*args, "--json")
        assert r.code == 0, r.err
        doc = r.json()
        for key in ("ttft_s", "tpot_s", "throughput", "memory", "max_concurrent_seqs"):  # kept, not renamed
            assert key in doc
        ph = doc["phase"]
        assert ph["name"] == phase and ph[rate] > 0 and ph["kv_capacity_tokens_per_gpu"] > 0
        assert ph["kv_transfer_bytes_per_request"] == pytest.approx(doc["kv_bytes_per_token"] * 2000)
        assert doc["plan"]["dp_attention"] is True and doc["plan"]["phase"] == phase


def test_phase_view_fits_80_columns(cli):
    r = cli(*DECODE)
    assert r.code == 0, r.err
    assert "output tokens/s per GPU" in r.out and "decode pool" in r.out
    assert max(len(line) for line in r.out.splitlines()) <= 80


@pytest.mark.parametrize("extra,needle", [
    (("--tp", "2"), "runs attention whole on every GPU"),
    (("--ep", "48"), "ep (48) must equal"),  # serve-dpa: ep 36 runs 2 servers of 36 GPUs
    (("--phase", "both", "--redundant-experts", "5"), "must divide the 256 experts"),
])
def test_bad_deployments_exit_2_with_the_rule(cli, extra, needle):
    args = list(DECODE)
    for flag, value in zip(extra[::2], extra[1::2]):
        args[args.index(flag) + 1] = value
    r = cli(*args)
    assert r.code == 2, r.out
    assert needle in r.err
    assert "Traceback" not in r.err


def test_dp_attention_on_a_dense_model_and_phase_in_training_are_refused(cli):
    r = cli("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1", "--dp", "8",
            "--dp-attention")
    assert r.code == 2 and "dense" in r.err
    r = cli("estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--phase", "decode")
    assert r.code == 2 and "--phase" in r.err and "serving" in r.err
    r = cli(*DECODE[:-3], "-3", *DECODE[-2:])  # --redundant-experts -3
    assert r.code == 2 and "Traceback" not in r.err


# --- export --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,phase", [(DECODE, "decode"), (PREFILL, "prefill")])
def test_pool_launch_lines_parse_with_the_launchers_parsers(cli, tmp_path, args, phase):
    plan = tmp_path / "pool.json"
    assert cli(*args, "--save", str(plan)).code == 0
    out = tmp_path / "out"
    r = cli("export", str(plan), "--to", "all", "-o", str(out))
    assert r.code == 0, r.err
    dp = 72 if phase == "decode" else 32
    for target, program, name in (("sglang", "python -m sglang.launch_server", "sglang_serve.sh"),
                                  ("vllm", "vllm serve", "vllm_serve.sh")):
        ap, rec = recorded_parser(target)
        if target == "vllm":
            ap.add_argument("model_tag", nargs="?")
        ns, unknown = ap.parse_known_args(command_argv((out / name).read_text(), program))
        assert not unknown, f"flags {rec['launcher']} {rec['version']} does not define: {unknown}"
        if target == "sglang":
            # SGLang 0.5.23 deprecates "--dp-size N --enable-dp-attention" for "--attn-dp-size N" (sglang-0.5.23
            # wheel, sglang/srt/server_args.py: --enable-dp-attention is a DeprecatedStoreTrueAction with new_flag
            # "--attn-dp-size <dp-size>") and refuses --dp-size > 1 beside it (arg_groups/parallel_hook.py)
            assert int(ns.attn_dp_size) == dp and int(ns.tp_size) == dp
            assert "--dp-size" not in (out / name).read_text() and not ns.enable_dp_attention
            assert ns.disaggregation_mode == phase and ns.moe_a2a_backend == "deepep"
            assert ns.deepep_mode == ("low_latency" if phase == "decode" else "normal")
            assert ns.enable_two_batch_overlap and int(ns.ep_num_redundant_experts) == 32
        else:
            assert int(ns.data_parallel_size) == dp and int(ns.tensor_parallel_size) == 1 and ns.enable_expert_parallel
            assert ns.all2all_backend == ("deepep_low_latency" if phase == "decode" else "deepep_high_throughput")
            assert ns.enable_dbo and ns.enable_eplb and "NixlConnector" in ns.kv_transfer_config


# --- disaggregated search ------------------------------------------------------------------------------------

def test_disaggregated_search_json_and_split(cli):
    import time
    t0 = time.perf_counter()
    r = cli("search", "--mode", "infer", "--disaggregated", "-m", "deepseek-v3", "--hardware", "gb200-nvl72",
            "--nodes", "18", "--dtype", "fp8", "--engine", "sglang", "--input-len", "2000", "--output-len", "100",
            "--ttft-slo", "5", "--tpot-slo", "0.1", "--json")
    assert r.code == 0, r.err
    assert time.perf_counter() - t0 < 5.0  # issue 36: 18 GB200 NVL72 trays in under 5 s
    doc = r.json()
    assert doc["winner"] in ("disaggregated", "co-located") and doc["why"]
    for plan in doc["plans"]:
        pre, dec, kv = plan["prefill"], plan["decode"], plan["kv_transfer"]
        assert pre["gpus"] + dec["gpus"] == plan["gpus"] <= 72
        assert plan["pd_ratio"] == f"{pre['gpus']}:{dec['gpus']}"
        # the split sustains the smaller pool's request rate
        req_p = pre["input_tokens_per_s_per_gpu"] * pre["gpus"] / 2000
        req_d = dec["output_tokens_per_s_per_gpu"] * dec["gpus"] / 100
        assert plan["requests_per_s"] == pytest.approx(min(req_p, req_d))
        assert kv["bytes_per_request"] == pytest.approx(61 * (512 + 64) * 2 * 2000)  # MLA latent + rope key, bf16
        assert plan["ttft_s"] == pytest.approx(pre["ttft_s"] + kv["seconds"]) and plan["ttft_s"] <= 5
        assert plan["tpot_s"] <= 0.1


def test_disaggregated_is_serving_only(cli):
    r = cli("search", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--disaggregated")
    assert r.code == 2 and "--disaggregated" in r.err


def test_disaggregated_search_on_12_dgx_h100_is_fast_and_fits_80_columns(cli):
    import time
    t0 = time.perf_counter()
    r = cli("search", "--mode", "infer", "--disaggregated", "-m", "deepseek-v3", "--hardware", "dgx-h100",
            "--nodes", "12", "--dtype", "fp8", "--engine", "sglang", "--input-len", "2000", "--output-len", "100",
            "--ttft-slo", "5", "--tpot-slo", "0.1", "--memory-fraction", "0.9")
    assert r.code == 0, r.err
    assert time.perf_counter() - t0 < 5.0  # issue 36: 12 DGX H100 nodes in under 5 s
    assert "P:D GPUs" in r.out and max(len(line) for line in r.out.splitlines()) <= 80
