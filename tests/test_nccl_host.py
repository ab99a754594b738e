"""NCCL's ring latency model by host CPU, ranks per node, compute capability and link type
(docs/formulas.md#comm.nccl_latency, docs/validation.md#lat-mend). Every expected value is written out by hand
from NVIDIA/nccl v2.21.5-1 (ab2b89c4) src/graph/tuning.cc: baseLat LL / LL128 / Simple 6.6 / 14 / 8.4 us;
ring hwLat NVLink 0.6 / 1.9 / 3.4 us, PCI 1.0 / 2.5 / 5.7 us, NET 2.7 / 4.0 / 14 us; getNetOverhead 1 us on
x86 Intel and other hosts, 2 us on x86 AMD, x3 for Simple, the floor of an intra-node step across nodes;
llMaxBws across nodes (Intel row 39 / 20.4 GB/s, AMD row 22.5 / 19.0 GB/s at 2 / more nodes); ring LL128 busBw
x (ppn < 2 ? 0.7 : 0.92); ncclTopoGetAlgoTime's multi-node ring Simple all-reduce latency x (minCompCap < 80 ?
1.9 : 1.4)."""

from __future__ import annotations

import pytest

from llmplan.specs.hardware import SystemSpec
from llmplan.specs.plan import ClusterSpec
from llmplan.specs.registry import builtin_systems
from llmplan.topology.collectives import collective_coeffs, group_links, nccl_ll128_enabled
from llmplan.topology.placement import span_of_ranks

SYS = builtin_systems()


def _span(system: SystemSpec, nodes: int, per_node: int):
    return span_of_ranks(list(range(nodes * per_node)), ClusterSpec(system=system, num_nodes=nodes,
                                                                  gpus_per_node=per_node))


def _by_alpha(cands):
    return sorted(cands, key=lambda c: c.alpha)


def test_builtin_host_cpus_follow_their_vendor_guides():
    """DGX A100 (Selene) and Jean Zay run AMD EPYC hosts, DGX H100 / H200 / B200 / B300 Intel Xeon, the NVL72
    racks Grace (ARM); each with its source. Breaks if a profile loses its host or its source."""
    want = {"dgx-a100": "amd", "dgx-a100-40gb": "amd", "jean-zay-a100": "amd", "dgx-h100": "intel",
            "dgx-h200": "intel", "dgx-b200": "intel", "dgx-b300": "intel", "gb200-nvl72": "arm",
            "gb300-nvl72": "arm"}
    for name, cpu in want.items():
        assert SYS[name].host_cpu == cpu, name
        assert SYS[name].host_cpu_source.strip(), name


def test_host_cpu_is_optional_and_needs_a_source():
    """A hardware file without host_cpu still loads (None: NCCL's non-AMD default); one with it needs its
    source, as host_memory_gb does."""
    base = SYS["dgx-h100"].model_dump()
    base.pop("host_cpu"), base.pop("host_cpu_source")
    assert SystemSpec.model_validate(base).host_cpu is None
    with pytest.raises(ValueError, match="host_cpu_source"):
        SystemSpec.model_validate({**base, "host_cpu": "amd"})
    with pytest.raises(ValueError):
        SystemSpec.model_validate({**base, "host_cpu": "power", "host_cpu_source": "x"})


def test_user_hardware_files_with_and_without_host_cpu(cli, tmp_path):
    """A user file on a base sets or keeps the host; one that sets it with an empty source is one clear line,
    exit code 2."""
    path = tmp_path / "mine.yaml"
    path.write_text("base: dgx-a100\nname: mine\nhost_cpu: intel\nhost_cpu_source: 'my cluster, lscpu'\n")
    assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", path, "--nodes", "2", "--dp", "16").code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: dgx-h100\nname: bad\nhost_cpu: amd\nhost_cpu_source: ''\n")
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", bad, "--nodes", "2", "--dp", "16")
    assert r.code == 2 and "host_cpu_source" in r.err and "Traceback" not in r.err


@pytest.mark.parametrize("key, value, line", [
    ("host_cpu", "amd", "error: {path}: host_cpu (amd) needs host_cpu_source: the vendor guide, datasheet or "
                        "instance page it was read from"),
    ("host_memory_gb", "512", "error: {path}: host_memory_gb needs host_memory_source: the vendor guide, "
                              "datasheet or instance page it was read from"),
    ("price_per_gpu_hour", "2.5", "error: {path}: price_per_gpu_hour needs price_source: the provider page, "
                                  "offering and date it was read from"),
])
def test_changed_value_does_not_inherit_the_base_source(cli, tmp_path, key, value, line):
    """dgx-h100's sources name its Xeon host, its 2 TB and its Lambda rate: a file on that base that changes the
    value and leaves the source out must not keep the base's source; it is refused with the spec's own line."""
    path = tmp_path / "mine.yaml"
    path.write_text(f"base: dgx-h100\n{key}: {value}\n")
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", path, "--nodes", "2", "--dp", "16")
    assert r.refusal() == line.format(path=path)


def test_unchanged_value_keeps_the_base_source(tmp_path):
    """Restating the base's own value (dgx-h100: Intel host, 2,000 GB) keeps the base's source."""
    from llmplan.specs.registry import load_system_file
    path = tmp_path / "same.yaml"
    path.write_text("base: dgx-h100\nhost_cpu: intel\nhost_memory_gb: 2000\nnics_per_node: 4\n")
    mine = load_system_file(path)
    assert mine.host_cpu_source == SYS["dgx-h100"].host_cpu_source
    assert mine.host_memory_source == SYS["dgx-h100"].host_memory_source


def test_gpu_override_does_not_inherit_host_op_source(cli, tmp_path):
    """A gpu mapping on gb200-nvl72 (Grace, host_op_factor 2.75 with its TransformerEngine issue 2053 source) that
    changes host_op_factor without host_op_source is refused, not priced with the base GPU's source."""
    path = tmp_path / "mine.yaml"
    path.write_text("base: gb200-nvl72\ngpu:\n  host_op_factor: 2.0\n")
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", path, "--nodes", "1", "--dp", "8")
    assert "host_op_factor 2 needs host_op_source" in r.refusal()


@pytest.mark.parametrize("op", ["all-gather", "reduce-scatter"])
def test_amd_host_dgx_a100_ring_by_hand(op):
    """DGX A100 (2 x EPYC 7742), 4 nodes x 8 GPUs, a ring of 31 steps, 3 across the network, 28 on NVLink, each
    NVLink step at least the AMD host's 2 us network overhead (6 us for Simple):
    LL 6.6 + 28 x max(0.6, 2.0) + 3 x 2.7 = 70.7 us, LL128 14 + 28 x max(1.9, 2.0) + 3 x 4.0 = 82.0 us,
    Simple 8.4 + 28 x max(3.4, 6.0) + 3 x 14 = 218.4 us (an Intel host: 42.7, 79.2, 145.6 us); LL's busbw
    capped at the AMD row's 19.0 GB/s beyond 2 nodes (20.4 on Intel), 22.5 at 2 nodes (39 on Intel)."""
    s = SYS["dgx-a100"]
    cands = _by_alpha(collective_coeffs(op, _span(s, 4, 8), s))
    assert [c.alpha for c in cands] == pytest.approx([70.7e-6, 82.0e-6, 218.4e-6])
    assert cands[0].beta == pytest.approx(31 / 32 / 19.0e9)
    two = _by_alpha(collective_coeffs(op, _span(s, 2, 8), s))
    # 2 nodes: 15 steps, 1 across: LL 6.6 + 14 x 2.0 + 2.7 = 37.3 us, capped at 22.5 GB/s
    assert two[0].alpha == pytest.approx(37.3e-6) and two[0].beta == pytest.approx(15 / 16 / 22.5e9)
    intel = s.model_copy(update={"host_cpu": "intel"})
    cands = _by_alpha(collective_coeffs(op, _span(intel, 4, 8), intel))
    assert [c.alpha for c in cands] == pytest.approx([42.7e-6, 79.2e-6, 145.6e-6])
    assert cands[0].beta == pytest.approx(31 / 32 / 20.4e9)


def test_ll128_ring_at_one_rank_per_node_is_priced_at_0_7():
    """v2.21.5-1 tuning.cc: ring LL128 busBw x (ppn < 2 ? 0.7 : 0.92), ppn = nRanks / nNodes: a DP ring under TP8
    (one GPU a node) gets 0.7, two or more GPUs a node 0.92."""
    s = SYS["dgx-h100"]
    for per_node, factor in ((1, 0.7), (2, 0.92), (8, 0.92)):
        sp = _span(s, 4, per_node)
        n = 4 * per_node
        cands = collective_coeffs("all-gather", sp, s)
        # LL128: 14 + (n - 4) x 1.9 + 3 x 4.0 us
        ll128 = next(c for c in cands if c.alpha == pytest.approx(14e-6 + (n - 4) * 1.9e-6 + 12e-6))
        simple = next(c for c in cands if c.alpha == pytest.approx(8.4e-6 + (n - 4) * 3.4e-6 + 42e-6))
        assert ll128.beta == pytest.approx(simple.beta / factor)


def test_ring_plateau_by_compute_capability():
    """ncclTopoGetAlgoTime: the multi-node ring Simple all-reduce latency x1.4 from sm80, x1.9 below (Volta).
    dgx-h100, 2 nodes x 8: 30 steps, 4 across the network: 8.4 + 26 x 3.4 + 4 x 14 = 152.8 us before the factor,
    plus the start-up 120 + 80 x log2(2) = 200 us (comm.net_fill)."""
    s = SYS["dgx-h100"]
    volta = s.model_copy(update={"gpu": s.gpu.model_copy(update={"compute_capability": 7.0})})
    for system, factor in ((s, 1.4), (volta, 1.9)):
        rings = [c for c in collective_coeffs("all-reduce", _span(system, 2, 8), system) if c.algorithm == "ring"]
        simple = min(rings, key=lambda c: c.beta)
        assert simple.alpha == pytest.approx(200e-6 + factor * 152.8e-6)


def test_ll128_by_compute_capability():
    """LL128 on by default for cc 7.0 / 8.0 / 9.0 (v2.21.5-1) and Blackwell (10.0, 10.3: NCCL 2.27+, every cc >=
    7.0; 2.25-2.26 left sm103 out); off for Ada (8.9) and Ampere consumer parts (8.6)."""
    assert [nccl_ll128_enabled(cc) for cc in (7.0, 8.0, 9.0, 10.0, 10.3)] == [True] * 5
    assert [nccl_ll128_enabled(cc) for cc in (7.5, 8.6, 8.9)] == [False] * 3
    s = SYS["dgx-h100"]
    ada = s.model_copy(update={"gpu": s.gpu.model_copy(update={"compute_capability": 8.9})})
    sp = _span(s, 2, 8)
    assert group_links(s, sp).ll128 and not group_links(ada, sp).ll128
    assert len(collective_coeffs("all-gather", sp, s)) == 3 and len(collective_coeffs("all-gather", sp, ada)) == 2
    for name in ("gb200-nvl72", "gb300-nvl72", "dgx-b200", "dgx-b300"):
        assert group_links(SYS[name], sp).ll128, name


def test_pcie_l40s_two_nodes_by_hand():
    """l40s-8 (PCIe, no NVLink: LL128 off, typeIntra > PATH_NVB), 2 nodes x 8, all-gather: 15 steps, 1 across
    the network, 14 on PCI at NCCL's PCI latencies (host not stated: the 1 us overhead, 3 us for Simple):
    LL 6.6 + 14 x 1.0 + 2.7 = 23.3 us, Simple 8.4 + 14 x 5.7 + 14 = 102.2 us."""
    s = SYS["l40s-8"]
    cands = _by_alpha(collective_coeffs("all-gather", _span(s, 2, 8), s))
    assert [c.alpha for c in cands] == pytest.approx([23.3e-6, 102.2e-6])


def test_amd_gpus_keep_the_profiles_step_latencies():
    """RCCL's constants were not read: MI300X / MI355X rings price the profile's per-step latencies (1 us a
    mesh step, 5 us a network step on one leaf), one candidate, whatever the host. 2 nodes x 8 all-gather:
    14 x 1 + 1 x 5 = 19 us; all-reduce ring 200 (start-up) + 2 x 19 = 238 us, tree 200 + 2 x 7 x 1 + 2 x 5 =
    224 us."""
    for name in ("mi300x-8", "mi355x-8"):
        s = SYS[name]
        sp = _span(s, 2, 8)
        assert not group_links(s, sp).nccl
        (ag,) = collective_coeffs("all-gather", sp, s)
        assert ag.alpha == pytest.approx(19e-6)
        ar = {c.algorithm: c.alpha for c in collective_coeffs("all-reduce", sp, s)}
        assert ar == pytest.approx({"ring": 238e-6, "tree": 224e-6})
        amd_host = s.model_copy(update={"host_cpu": "amd", "host_cpu_source": "x"})
        assert collective_coeffs("all-gather", sp, amd_host) == (ag,)
