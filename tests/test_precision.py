"""Clusters and number formats of 2025-26 (issue "Blackwell, GB200/GB300 NVL72, FP8 recipes, MXFP8, NVFP4"):
the new profiles against their published numbers, training precision as a recipe (memory per parameter,
GEMM format, the bf16 layers of NVFP4, MFU against bf16), and the NVL72 domain's all-reduce."""

from __future__ import annotations

import pytest

from llmplan.cost.compute import layer_gemm_seconds
from llmplan.estimate import estimate_training
from llmplan.specs.check import check_plan
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.topology.collectives import collective_time
from llmplan.topology.placement import span_of_ranks
from llmplan.units import GIB

M = builtin_models()
S = builtin_systems()


# Per-GPU dense peaks (TFLOP/s), memory (GiB) and bandwidth (GB/s); MI355X's MXFP4 10 PF dense: The Register,
# "AMD's MI355X is a 1.4 kW liquid-cooled monster built to battle Nvidia's Blackwell" (2025-06-12). B300 / GB300: NVIDIA's per-GPU table
# restated by Verda ("NVIDIA GB300 NVL72: GPU Architecture & Performance"); H20: NVIDIA's H20 specification
# as reported (148 / 296 TFLOP/s, 96 GB, 4.0 TB/s); MI355X: AMD at ISSCC 2026 (FP8 5 PF) and ISC 2025
# (288 GB HBM3e, 8 TB/s, 1,400 W); MI350X: Tom's Hardware at ISC 2025 (288 GB, 8 TB/s, 1,000 W, MXFP4 18.45 PF
# sparse = 9.2 PF dense), FP8 = 256 CUs x 8,192 FLOP/clock x 2.2 GHz (Hot Chips 2025) = 4.61 PF, BF16 half; H100 SXM 96 GB: the torchtitan team's Grand Teton H100 (96 GB HBM2e, 2.4 TB/s,
# 500 W default, 700 W TDP; pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md), the H100 SXM5 die's
# peaks. GB = 10^9 bytes, GiB = 2^30 (the 96 GB part counts GiB, as the 80 GB one: 96 GiB less 0.4).
@pytest.mark.parametrize("gpu,bf16,fp8,fp4,gib,gbps,watts", [
    ("b300", 2250, 4500, 14000, 270e9 / GIB, 7700, 1100),
    ("gb300", 2500, 5000, 15000, 279e9 / GIB, 8000, 1400),
    ("h20", 148, 296, None, 96e9 / GIB, 4000, 400),
    ("mi355x", 2500, 5000, None, 288e9 / GIB, 8000, 1400),
    ("mi350x", 2300, 4600, None, 288e9 / GIB, 8000, 1000),
    ("h100-sxm-96gb", 989, 1979, None, 95.6, 2400, 700),
])
def test_new_gpu_profiles_match_their_sources(gpu, bf16, fp8, fp4, gib, gbps, watts):
    systems = [s for s in S.values() if s.gpu.name == gpu]
    assert systems, f"no system uses {gpu}"
    g = systems[0].gpu
    assert (g.tflops["bf16"], g.tflops["fp8"], g.tflops.get("fp4")) == (bf16, fp8, fp4)
    assert g.hbm_gib == pytest.approx(gib, abs=0.1) and g.hbm_gb_per_s == gbps and g.power_limit_w == watts
    if gpu in ("b300", "gb300"):
        assert g.tflops["mxfp8"] == fp8  # MX formats at the fp8 tensor-core rate on Blackwell
    if gpu == "mi355x":
        assert g.tflops["mxfp4"] == 10000  # dense MXFP4 (The Register, 2025-06-12); no NVFP4 on CDNA 4
    if gpu == "mi350x":
        assert g.tflops["mxfp4"] == 9200  # 18.45 PF with sparsity (Tom's Hardware, ISC 2025), halved


def test_mi350x_is_the_air_cooled_mi355x_at_its_lower_clock(cli):
    # AMD at Hot Chips 2025 (Wccftech, 2025-08-26): MI350X and MI355X are one die (256 CUs), 2.2 GHz / 1,000 W
    # against 2.4 GHz / 1,400 W, so every peak is MI355X's x 2.2/2.4 (The Register: "about 8 percent" lower).
    # The profiles round to two digits (2.3 / 4.6 / 9.2 PF against 2.5 / 5 / 10 PF): within 1% of the clock ratio.
    a, b = S["mi350x-8"], S["mi355x-8"]
    for dtype in ("bf16", "fp8", "mxfp4"):
        assert a.gpu.tflops[dtype] / b.gpu.tflops[dtype] == pytest.approx(2.2 / 2.4, rel=0.01)
    assert (a.gpu.hbm_gib, a.gpu.hbm_gb_per_s, a.gpu.sm_count) == (b.gpu.hbm_gib, b.gpu.hbm_gb_per_s, b.gpu.sm_count)
    assert a.gpu.power_limit_w == 1000 and b.gpu.power_limit_w == 1400
    # one UBB: 7 Infinity Fabric links x 76.8 GB/s (AMD CDNA 4 white paper), 8 GPUs per node
    assert (a.intra_node_gb_per_s, a.pair_gb_per_s, a.gpus_per_node) == (7 * 76.8, 76.8, 8)
    names = cli("hardware", "--json").json()
    assert "mi350x" in {g["name"] for g in names["gpus"]} and "mi350x-8" in {s["name"] for s in names["systems"]}
    r = cli("check", "hardware_profiles/")
    assert r.code == 0 and "hardware mi350x " in r.out and "hardware mi350x-8 " in r.out


def test_h100_96gb_at_its_default_500_w_runs_the_80_gb_die_slower():
    # Same die as h100-sxm (same peaks and clock at 700 W); at the 500 W default every GEMM runs at the
    # cube-root clock, and the 2.4 TB/s HBM2e slows the memory-bound work by 3350 / 2400.
    g96, g80 = S["hgx-h100-96gb"].gpu, S["dgx-h100"].gpu
    assert (g96.tflops, g96.sustained_clock_fraction) == (g80.tflops, g80.sustained_clock_fraction)
    assert S["hgx-h100-96gb"].gpus_per_node == 8 and S["hgx-h100-96gb"].nic_gbit_per_s == 400
    capped = S["hgx-h100-96gb"].model_copy(update={"gpu": g96.at_power_limit(500)})
    m, p = M["llama-3.1-8b"], plan(zero=1, global_batch=64)
    a = estimate_training(m, ClusterSpec(system=S["dgx-h100"], num_nodes=1), p)
    b = estimate_training(m, ClusterSpec(system=capped, num_nodes=1), p)
    assert float(b.time.stage.gemm) == pytest.approx(float(a.time.stage.gemm) / (500 / 700) ** (1 / 3), rel=1e-9)
    assert float(b.time.stage.memory_bound) == pytest.approx(float(a.time.stage.memory_bound) * 3350 / 2400,
                                                             rel=1e-9)
    assert float(b.memory.capacity) > float(a.memory.capacity) + 15 * GIB


def test_blackwell_attention_waits_on_its_softmax_exponentials():
    # Blackwell Ultra (B300 / GB300) doubles the SFU exp rate and NVIDIA measures ~35% more FP8 attention
    # forward throughput than on Blackwell ("Making Softmax More Efficient with NVIDIA Blackwell Ultra"):
    # on B200 / GB200 the attention runs at 1/1.35 of the tensor-core-bound rate, GEMMs unchanged.
    assert S["dgx-b200"].gpu.softmax_attention_ratio == S["gb200-nvl72"].gpu.softmax_attention_ratio == 0.74
    assert S["dgx-b300"].gpu.softmax_attention_ratio == S["gb300-nvl72"].gpu.softmax_attention_ratio == 1.0
    m, p = M["llama-3.1-8b"], plan(zero=1, global_batch=64, seq_len=8192)
    b200 = S["dgx-b200"]
    fast = b200.model_copy(update={"gpu": b200.gpu.model_copy(update={"softmax_attention_ratio": 1.0})})
    a = estimate_training(m, ClusterSpec(system=b200, num_nodes=1), p).time.stage
    b = estimate_training(m, ClusterSpec(system=fast, num_nodes=1), p).time.stage
    assert float(a.attention) == pytest.approx(float(b.attention) / 0.74, rel=1e-9)
    assert float(a.gemm) == pytest.approx(float(b.gemm), rel=1e-12)


def test_hgx_h100_96gb_runs_at_its_fleet_default_of_500_w(cli, tmp_path):
    # The torchtitan benchmark hosts run their 700 W H100s at "the default 500W power limit": the system
    # profile states it, the command line and plan files apply it, --power-limit overrides it up to the TDP.
    args = ("estimate", "--model", "llama-3.1-8b", "--hardware", "hgx-h100-96gb", "--dp", "8", "--zero", "3",
            "--recompute", "full", "--json")
    rate = {w: cli(*args, *(("--power-limit", str(w)) if w else ())).json()["throughput"]["tokens_per_s"]
            for w in (None, 500, 700)}
    assert rate[None] == rate[500] < rate[700]
    assert S["hgx-h100-96gb"].default_power_limit_w == 500
    # The text report says which power the numbers assume when the GPUs run capped.
    text = cli(*[a for a in args if a != "--json"]).out
    assert "(8 x h100-sxm-96gb, at 500 W)" in text.replace("\n", " ")
    assert ", at " not in cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100").out.split("\n")[0]
    plan = tmp_path / "p.json"
    assert cli(*args, "--save", plan).code == 0
    r = cli("check", plan)
    assert r.code == 0 and "1 passed" in r.out.replace("\n", " ")


def test_hopper_fp8_casts_write_the_transposed_copy_too():
    # cuBLASLt's FP8 GEMMs take only the TN layout on Hopper (Transformer Engine: "Hopper only supports TN
    # GEMMs for FP8", so it keeps column-wise data); Blackwell takes any layout. A per-tensor cast on H100
    # writes fp8 + its transpose: 4 bytes per element (read 2, write 1 + 1), 3 on B200.
    from llmplan.cost.compute import fp8_cast_bytes
    assert S["dgx-h100"].gpu.fp8_tn_only and S["dgx-h200"].gpu.fp8_tn_only and not S["dgx-b200"].gpu.fp8_tn_only
    m, p = M["llama-3.1-8b"], plan(dtype="fp8", recipe="tensorwise")
    hopper, blackwell = fp8_cast_bytes(m, p, False, True), fp8_cast_bytes(m, p, False, False)
    assert hopper / blackwell == pytest.approx(4 / 3)
    row = plan(dtype="fp8", recipe="rowwise")  # torchao casts inside each GEMM, in the layout it needs
    assert fp8_cast_bytes(m, row, False, True) == fp8_cast_bytes(m, row, False, False)


def test_fp8_casts_by_hand_with_and_without_sequence_parallelism():
    # Each GEMM input cast once in forward and each output gradient once in backward (read 2 bytes, write 1,
    # plus the transposed copy on Hopper); under SP the h-wide tensors TP gathers (QKV / fc1 inputs, output
    # projection / fc2 output gradients) are quantised on the rank's h/t shard before the gather and, per-tensor
    # fp8 gathering row-wise data only, transposed after it (read 1, write 1): Transformer Engine
    # pytorch/module/linear.py ("If data is in FP8, we compute FP8 transposes manually"). Hand counts per token
    # and layer over the step, Llama 3.1 70B (h 8192, 64 heads of 128, 8 KV heads, gated f 28,672):
    from llmplan.cost.compute import fp8_cast_bytes
    m, s = M["llama-3.1-70b"], 4096
    held = (8192 + 28672) / 4 + (16 + 2 * 2) * 128 + 2 * 28672 / 4  # proj / fc2 inputs, QKV / fc1 gradients
    cases = {  # (tp, sp, Hopper, tp_impl): bytes per token
        (4, True, True, "megatron"): 4 * held + 2 * 8192 * 2 * (3 / 4 + 2),
        (4, True, False, "megatron"): 3 * held + 2 * 8192 * 2 * (3 / 4),
        (4, False, True, "megatron"): 4 * held + 2 * 8192 * 2 * 4,
        # torchao's float8 TP (eab345c) casts the gradient shard before DTensor's backward gather too, and
        # casts its weights in each micro-batch (forward and backward, 5 B each compiled): wq + wo 2·8192·8192/4,
        # wk + wv 2·8192·128 a KV head (2 on the rank), w1 / w3 / w2 3·8192·28672/4, over the micro-batch's s tokens
        (4, True, True, "dtensor"): 4 * held + 2 * 8192 * 2 * (3 / 4 + 2)
        + 10 * (2 * 8192 * 8192 / 4 + 2 * 8192 * 128 * 2 + 3 * 8192 * 28672 / 4) / s,
    }
    for (tp, sp, hopper, impl), want in cases.items():
        p = plan(tp=tp, dp=2, sp=sp, seq_len=s, dtype="fp8", recipe="tensorwise", tp_impl=impl)
        assert fp8_cast_bytes(m, p, False, hopper) * 3 / s == pytest.approx(want)
    # TP1 (Llama 3.1 8B): no gather, every cast whole; 278,528 bytes a token and layer on H100
    one = plan(seq_len=s, dtype="fp8", recipe="tensorwise")
    assert fp8_cast_bytes(M["llama-3.1-8b"], one, False, True) * 3 / s == pytest.approx(
        4 * ((4096 + 14336) + (32 + 16) * 128 + 2 * 14336) + 2 * 4096 * 2 * 4) == pytest.approx(278528)
    # SP shrinks the casts to at most what the same plan without SP casts
    sp_on, sp_off = (plan(tp=8, dp=1, sp=x, seq_len=s, dtype="fp8", recipe=r) for x, r in ((True, "mxfp8"), (False, "mxfp8")))
    assert fp8_cast_bytes(m, sp_on, False, True) < fp8_cast_bytes(m, sp_off, False, True)


def test_nvl72_racks_and_dgx_b300():
    for name, nic in (("gb200-nvl72", 400), ("gb300-nvl72", 800)):
        s = S[name]
        assert (s.gpus_per_node, s.domain_gpus, s.nics_per_node, s.nic_gbit_per_s) == (4, 72, 4, nic)
    b300 = S["dgx-b300"]
    assert (b300.gpus_per_node, b300.nics_per_node, b300.nic_gbit_per_s, b300.intra_node_gb_per_s) == (8, 8, 800, 900)


def test_nvl72_all_reduce_against_a_published_measurement():
    # NCCL all_reduce_perf over multi-node NVLink, 2 GB200 trays x 4 GPUs: 811 GB/s busbw at large sizes
    # (lixueduan.com, "GB200 MNNVL NCCL test"). Within 10%, and the 72-GPU domain never touches a NIC.
    s = S["gb200-nvl72"]
    sp = span_of_ranks(list(range(8)), ClusterSpec(system=s, num_nodes=2))
    assert not sp.uses_nic
    assert collective_time("all-reduce", 8 * GIB, sp, s).busbw / 1e9 == pytest.approx(811, rel=0.10)


def plan(**kw) -> ParallelPlan:
    base = dict(tp=1, pp=1, dp=8, zero=1, seq_len=4096, micro_batch=1, global_batch=64, recompute="full")
    return ParallelPlan(**{**base, **kw})


# Low-precision copies of each linear weight kept across the micro-batches of a step: Transformer Engine
# caches the fp8 weight after the first micro-batch (per-tensor and blockwise; on B200 no transpose beside it:
# Blackwell's FP8 GEMMs take any layout, tests/test_memory_switches.py checks Hopper's 2 B), MXFP8 a
# rowwise and a columnwise copy with an E8M0 scale per 32 values each, NVFP4 two 4-bit copies with an E4M3
# scale per 16 (on the layers in NVFP4: Llama-3.1-8B's 32 less the last round(15% x 32) = 5 kept in bf16);
# torchao's rowwise recipe casts inside each GEMM (none kept).
@pytest.mark.parametrize("precision,per_weight", [
    (("fp8", "tensorwise"), 1.0), (("fp8", "rowwise"), 0.0), (("fp8", "blockwise"), 1.0 + 4 / 128**2),
    (("fp8", "mxfp8"), 2.0 + 2 / 32), (("fp4", "nvfp4"), (1.0 + 2 / 16) * 27 / 32),
])
def test_recipe_weight_copies_per_parameter(precision, per_weight):
    m, cluster = M["llama-3.1-8b"], ClusterSpec(system=S["dgx-b200"], num_nodes=1)
    # Llama-3.1-8B's linear weights: 32 layers x (q, k, v, o, gate, up, down) = 32 x 218,103,808.
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    bf16 = estimate_training(m, cluster, plan()).memory
    low = estimate_training(m, cluster, plan(dtype=precision[0], recipe=precision[1])).memory
    # the norms (32 x 2 + 1 RMSNorms of 4096) are not linear weights: the recipe casts none of them
    assert float(low.weights - bf16.weights) == pytest.approx(per_weight * linear, rel=1e-9)
    # ZeRO-3 gathers and frees each layer: no copies persist.
    z3 = estimate_training(m, cluster, plan(zero=3, dtype=precision[0], recipe=precision[1])).memory
    assert float(z3.weights) == pytest.approx(float(estimate_training(m, cluster, plan(zero=3)).memory.weights))


def test_a_plan_that_fits_in_mxfp8_and_not_in_bf16():
    # Llama-3.1-70B on 16 B200, TP2 + FSDP, 10k tokens, no recompute: in bf16 the saved activations overflow
    # the 179.1 GiB; MXFP8 saves the GEMM inputs for backward in 8 bits, and ZeRO-3 keeps no weight copies.
    m, cluster = M["llama-3.1-70b"], ClusterSpec(system=S["dgx-b200"], num_nodes=2)
    kw = dict(tp=2, dp=8, sp=True, zero=3, seq_len=10240, global_batch=256, recompute="none")
    bf16 = estimate_training(m, cluster, plan(**kw)).memory
    mx = estimate_training(m, cluster, plan(**kw, dtype="fp8", recipe="mxfp8")).memory
    assert not bf16.fits and mx.fits
    assert float(mx.weights) == pytest.approx(float(bf16.weights))
    assert float(bf16.activations - mx.activations) > float(bf16.total - bf16.capacity)


def test_nvfp4_keeps_a_share_of_layers_in_bf16_and_mfu_is_against_bf16(monkeypatch):
    import llmplan.specs.quantities as plan_module  # PlanQuantities reads the fraction there

    m, gpu = M["llama-3.1-70b"], S["dgx-b200"].gpu
    p4 = plan(dtype="fp4", recipe="nvfp4", tp=8, dp=1, sp=True)
    t4 = float(layer_gemm_seconds(m, p4, gpu, False)[0])
    t_bf16 = float(layer_gemm_seconds(m, plan(tp=8, dp=1, sp=True), gpu, False)[0])
    monkeypatch.setattr(plan_module, "NVFP4_LAYER_FRACTION", 1.0)
    t_all_fp4 = float(layer_gemm_seconds(m, p4, gpu, False)[0])
    monkeypatch.undo()
    # 85% of the layers at the fp4 rate, 15% at bf16 (NVIDIA's NVFP4 recipe keeps the last layers in bf16).
    assert t4 == pytest.approx(0.85 * t_all_fp4 + 0.15 * t_bf16, rel=1e-12)
    assert t_all_fp4 < t4 < t_bf16
    e = estimate_training(m, ClusterSpec(system=S["dgx-b200"], num_nodes=1), p4)
    tp = e.throughput
    assert float(tp.mfu) * gpu.tflops["bf16"] == pytest.approx(float(tp.mfu_low_precision) * gpu.tflops["fp4"])


def test_mxfp8_needs_blackwell():
    m = M["llama-3.1-8b"]
    bad = check_plan(m, plan(dtype="fp8", recipe="mxfp8"), ClusterSpec(system=S["dgx-h100"], num_nodes=1))
    assert [v.rule for v in bad] == ["dtype_hardware"] and "no mxfp8 tensor cores" in bad[0].message
    assert not check_plan(m, plan(dtype="fp8", recipe="mxfp8"), ClusterSpec(system=S["dgx-b300"], num_nodes=1))


def test_precision_cli(cli):
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-b200", "--precision", "nvfp4", "--zero", "1",
            "--global-batch", "64", "--json")
    assert r.code == 0, r.err
    d = r.json()
    assert d["throughput"]["mfu_low_precision"] < d["throughput"]["mfu"]
    bad = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-b200", "--precision", "fp6")
    assert bad.code == 2 and "--precision fp6 is not a recipe" in bad.err and "mxfp8" in bad.err
    clash = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-b200", "--precision", "nvfp4",
                "--dtype", "fp8")
    assert clash.code == 2 and "contradicts" in clash.err


@pytest.mark.parametrize("model,system,nodes,gbs,seq,precision,pins", [
    # 32 GB300 NVL72 racks = 2,304 GPUs; the gradient dtype and fp8 weights pinned to the variant a free search
    # picks (same plans and domain choice, 2 searches instead of 8; tests/test_memory_switches.py tries them),
    # and so is the EP dispatcher (deepep with Hybrid-EP, the free search's pick: the same #1 and domain choice,
    # 4 searches instead of 12; tests/test_search_deepep.py searches them). The EP overlap stays searched (a pin
    # of it on these racks was refused before docs/validation.md#pin-bug; tests/test_search_pinned_winner.py).
    ("deepseek-v3", "gb300-nvl72", 576, 4096, 4096, "mxfp8", ("--grad-dtype", "bf16", "--fp8-params",
                                                             "--moe-dispatcher", "deepep", "--moe-flex-backend",
                                                             "hybridep")),
    ("llama-3.1-405b", "gb200-nvl72", 288, 2048, 8192, "bf16", ()),  # 16 GB200 NVL72 racks = 1,152 GPUs
])
def test_nvl72_search_keeps_tp_and_ep_in_the_domain_and_says_so(cli, monkeypatch, model, system, nodes, gbs, seq,
                                                                precision, pins):
    # The text run below renders the same searches as the JSON run: it replays their results in call order
    # instead of searching again (each run searches the full racks and a power-of-two share; issue 39).
    import llmplan.cli.search as search_cli

    real, results = search_cli.run_search, []

    def record_or_replay(*args, **kwargs):
        if replay:
            return replay.pop(0)
        results.append(real(*args, **kwargs))
        return results[-1]

    replay: list = []
    monkeypatch.setattr(search_cli, "run_search", record_or_replay)
    r = cli("search", "--model", model, "--hardware", system, "--nodes", str(nodes), "--global-batch", str(gbs),
            "--seq-len", str(seq), "--precision", precision, "--top", "3", *pins, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    best = doc["plans"][0]["plan"]
    from llmplan.topology.placement import place

    # The search may show the plans for 64 of each rack's 72 GPUs (its `domain` key); place them there.
    used = doc["domain"]["used_per_domain"] if "domain" in doc else 72
    plan = ParallelPlan(**{k: v for k, v in best.items() if k in ParallelPlan.model_fields})
    spans = place(plan.degrees, ClusterSpec(system=S[system].with_options(domain_gpus=used), num_nodes=doc["nodes"]))
    replay.extend(results)
    text = cli("search", "--model", model, "--hardware", system, "--nodes", str(nodes), "--global-batch",
               str(gbs), "--seq-len", str(seq), "--precision", precision, "--top", "3", *pins).out.replace("\n", " ")
    for axis in ("tp", "ep"):
        # An axis no larger than the domain's share stays inside it (the placement's rule); a larger one must cross
        # the network and the text says so. Since Megatron-FSDP refuses fp8 weights at ZeRO-2 (check_plan
        # megatron_fsdp_fp8_params), DeepSeek-V3's #1 here was a ZeRO-1 plan at ep 128 across two domains, tied
        # (within the MoE resolution) with in-domain ep 16 / 32 plans that the robust-first tie rule ranked below
        # it on fewer axes; the tie rule now keeps EP inside the domain first (docs/validation.md#tie-placement).
        if spans[axis].size <= used:
            assert not spans[axis].uses_nic, (axis, spans[axis])
        else:
            flat = " ".join(text.split())  # the 80-column wrap may split "across the network"
            assert f"{axis} {spans[axis].size}" in flat and "across the network" in flat, flat
    if model == "deepseek-v3":  # its tie pool holds in-domain EP plans: #1 is one of them
        assert 1 < spans["ep"].size <= used and not spans["ep"].uses_nic, spans["ep"]
    assert "placement:" in text and f"inside one {used}-GPU NVLink domain" in text
    assert ("domain:" in text) == ("domain" in doc)
    assert not replay  # the text run asked for the same searches, no more and no fewer


def test_serving_nvfp4_and_mxfp8_weights_on_blackwell():
    # NVFP4: 4-bit values + one E4M3 scale per 16 (0.5625 B/weight); MXFP8: 8-bit + one E8M0 scale per 32.
    from llmplan.cost.inference import weight_bytes_per_param
    from llmplan.serving import estimate_serving
    from llmplan.specs.serve import ServeJob, ServePlan

    assert weight_bytes_per_param("nvfp4", 128) == 0.5625 and weight_bytes_per_param("mxfp8", 128) == 1 + 1 / 32
    m, job = M["llama-3.1-70b"], ServeJob(input_len=1024, output_len=1024, batch=256)
    b200 = ClusterSpec(system=S["dgx-b200"], num_nodes=1, gpus_per_node=4)
    h100 = ClusterSpec(system=S["dgx-h100"], num_nodes=1, gpus_per_node=4)
    fp8, fp4 = (estimate_serving(m, b200, ServePlan(tp=4, weight_dtype=w, kv_dtype="fp8"), job) for w in ("fp8", "nvfp4"))
    assert fp4.memory.weights < 0.6 * fp8.memory.weights and fp4.tokens_per_s > fp8.tokens_per_s
    on_h100 = estimate_serving(m, h100, ServePlan(tp=4, weight_dtype="nvfp4", kv_dtype="fp8"), job)
    assert any("no nvfp4 tensor cores" in w for w in on_h100.warnings)


def test_power_cap_slows_compute_by_its_clock(cli):
    # A 700 W H100 capped at 500 W: the sustained clock scales as the cube root of the power ratio, and the
    # tensor-core work (GEMMs, attention) slows by exactly that factor; HBM-bound work does not.
    gpu = S["dgx-h100"].gpu
    capped = gpu.at_power_limit(500)
    ratio = (500 / 700) ** (1 / 3)
    assert capped.sustained_clock_fraction == pytest.approx(gpu.sustained_clock_fraction * ratio)
    m = M["llama-3.1-8b"]
    p = plan(zero=1, global_batch=64)
    full = estimate_training(m, ClusterSpec(system=S["dgx-h100"], num_nodes=1), p)
    low = estimate_training(m, ClusterSpec(system=S["dgx-h100"].model_copy(update={"gpu": capped}), num_nodes=1), p)
    assert float(low.time.stage.gemm) == pytest.approx(float(full.time.stage.gemm) / ratio, rel=1e-9)
    assert float(low.time.stage.memory_bound) == pytest.approx(float(full.time.stage.memory_bound), rel=1e-9)
    assert float(low.throughput.tokens_per_s) < float(full.throughput.tokens_per_s)
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--power-limit", "900")
    assert r.code == 2 and "outside h100-sxm's range 175-700 W" in r.err


def test_expert_capacity_factor_pads_expert_work_and_dispatch():
    # Padding every expert's input to capacity (Megatron --moe-pad-expert-input-to-capacity) multiplies the
    # routed rows each expert computes and the tokens each all-to-all carries by the factor; dropless does not.
    from llmplan.cost.comm import ep_transfers
    from llmplan.cost.moe import routing_imbalance
    from llmplan.topology.placement import place

    m = M["mixtral-8x7b"]
    cluster = ClusterSpec(system=S["dgx-h100"], num_nodes=2)
    base = plan(tp=2, dp=8, ep=8, etp=1, sp=True, global_batch=64)
    padded = base.model_copy(update={"moe_capacity_factor": 1.5})
    spans = place(base.degrees, cluster)
    a, b = ep_transfers(m, base, spans["ep"])[0], ep_transfers(m, padded, spans["ep"])[0]
    # (dropless random routing sizes the all-to-all for the most-loaded rank; capacity padding for the factor)
    assert b.message == pytest.approx(1.5 / routing_imbalance(m, base) * a.message) and b.calls == a.calls
    e0, e1 = (estimate_training(m, cluster, p) for p in (base, padded))
    assert float(e1.time.stage.gemm) > float(e0.time.stage.gemm)
    assert float(e1.memory.activations) > float(e0.memory.activations)
    # Padding is wasted work: the model FLOPs (and so MFU's numerator) do not grow with it.
    assert float(e1.time.model_flops) == pytest.approx(float(e0.time.model_flops))
    assert float(e1.throughput.mfu) < float(e0.throughput.mfu)


def test_domain_gpus_keeps_power_of_two_groups_inside_a_rack(cli):
    # 72 is not a power of two: EP groups of 64 on consecutive GPUs straddle GB300 NVL72 racks and their
    # all-to-all crosses the network. Using 64 GPUs of each rack (--domain-gpus 64, 16 of 18 trays) keeps them
    # inside, as deployments that partition NVL72 racks do.
    args = ("estimate", "--model", "deepseek-v3", "--hardware", "gb300-nvl72", "--nodes", "512", "--tp", "2",
            "--ep", "64", "--etp", "1", "--zero", "3", "--global-batch", "4096", "--micro-batch", "4",
            "--precision", "mxfp8", "--json")
    whole = cli(*args).json()
    part = cli(*args, "--domain-gpus", "64").json()
    assert part["time"]["exposed_s"]["ep"] < 0.5 * whole["time"]["exposed_s"]["ep"]
    assert part["throughput"]["tokens_per_s"] > whole["throughput"]["tokens_per_s"]
    bad = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "gb300-nvl72", "--domain-gpus", "70")
    assert bad.code == 2 and "use whole gb300-nvl72 nodes of 4 GPUs" in bad.err and "64" in bad.err


def test_plan_files_keep_power_limit_and_domain_gpus(cli, tmp_path):
    # A plan made with --power-limit / --domain-gpus records them; `check` applies them to the hardware spec
    # as it is now instead of reporting the capped clock or the 64-GPU domain as a changed spec.
    plan = tmp_path / "p.json"
    assert cli("estimate", "--model", "llama-3.1-70b", "--hardware", "gb300-nvl72", "--nodes", "16", "--tp", "4",
               "--pp", "2", "--zero", "1", "--global-batch", "64", "--domain-gpus", "32", "--power-limit", "1200",
               "--save", plan).code == 0
    import json

    assert json.loads(plan.read_text())["hardware_options"] == {"power_limit": 1200, "domain_gpus": 32}
    r = cli("check", plan)
    assert r.code == 0 and "1 passed" in r.out.replace("\n", " ")


def test_current_benchmark_rows_can_be_described(published_runs):
    # The issue on 2025-26 formats: most rows of a current benchmark table could not be described. The 24
    # Megatron-Bridge rows shipped (H100, B200, GB200 NVL72, GB300 NVL72; FP8-CS, MXFP8, NVFP4) each build
    # a valid plan on a shipped profile that passes check_plan and yields a prediction (how close it is,
    # benchmarks/accuracy.py measures: docs/validation.md).
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)
    from llmplan.specs.check import check_plan

    rows = [r for r in published_runs.values() if r["id"].startswith("bridge-")]
    assert len(rows) == 24
    systems = set()
    for r in rows:
        system = accuracy.system_for(r["hardware"]["gpu"])
        systems.add(system)
        cluster = ClusterSpec(system=S[system], num_nodes=r["hardware"]["gpus"] // S[system].gpus_per_node)
        plan = accuracy.plan_for(r, "bridge", r["hardware"]["gpus"])
        assert check_plan(accuracy.model_for(r, "bridge"), plan, cluster) == [], r["id"]
        (quantity, predicted, measured), _fits = accuracy.predict(r, "bridge")
        assert quantity == "tok/s/GPU" and predicted > 0 and measured == r["measured"]["tokens_per_s_per_gpu"]
    assert systems == {"dgx-h100", "dgx-b200", "gb200-nvl72", "gb300-nvl72"}
