"""serve-dpa3: the two loose ends of #serve-dpa and plan files without a compute capability
(docs/validation.md#serve-dpa3).

1. The disaggregated search over pools builds DP-attention instances of the co-located search's sizes
   (search.serve.wide_ep_sizes: whole nodes, doubling, and the whole pool) and lets one take the whole pool when
   the other phase may sit on another pool; on one system an instance still leaves the other phase a GPU.
2. A DP-attention server that straddles node boundaries unevenly (ep 36 on nodes of 8) is refused under SGLang
   (check_serve_plan rule dp_attention_nodes: SGLang starts tp-size / nnodes ranks on every node of a server,
   sgl-project/sglang @001067ff entrypoints/engine.py _calculate_rank_ranges); vLLM takes per-node DP sizes
   (docs/serving/data_parallel_deployment.md @01e4fce0), so it is priced as placed there.
3. A plan file whose hardware snapshot has no compute_capability takes it from the GPU's profile, so the Hopper
   hardware-queue rules apply; ambiguous input is refused in one line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from llmplan.specs.registry import builtin_systems
from llmplan.topology.placement import place

ROOT = Path(__file__).resolve().parents[1]
QWEN = ("search", "--mode", "infer", "--model", "qwen3-30b-a3b")
POOLS = "pools:\n  - {system: dgx-h100, nodes: 2, name: big}\n  - {system: dgx-a100, nodes: 1, name: a100}\n" \
        "fabric: {gb_per_s: 50}\n"


# --- 1. disaggregated DP-attention instances over pools ---------------------------------------------------------

def test_disaggregated_instances_may_take_the_whole_pool_when_the_other_phase_is_elsewhere(cli, tmp_path: Path):
    """Before: instances had g <= GPUs - 1 on their pool, so the 8-GPU a100 pool hosted no dpa8 instance and the
    16-GPU pool no dpa16, though the other phase sat on the other pool (2 layouts priced; then 6 = 2 phases x
    (big: 8, 16; a100: 8); since serve-multinode, servers of half and a quarter of a node too: 14 = 2 phases x
    (big: 2, 4, 8, 16; a100: 2, 4, 8))."""
    f = tmp_path / "c.yaml"
    f.write_text(POOLS)
    r = cli(*QWEN, "--hardware", f, "--dp-attention", "--disaggregated", "--top", "100", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["considered"] == 14, doc["considered"]
    pairs = {(x["prefill"]["pool"], x["prefill"]["gpus_per_instance"], x["decode"]["pool"],
              x["decode"]["gpus_per_instance"]) for x in doc["plans"]}
    assert ("big", 8, "a100", 8) in pairs and ("big", 16, "a100", 8) in pairs, pairs
    # a whole-pool instance never pairs with the other phase on its own pool (no GPU left there)
    assert all(not (x["prefill"]["pool"] == x["decode"]["pool"]
                    and x["prefill"]["gpus"] + x["decode"]["gpus"] > 16) for x in doc["plans"]), doc["plans"]


def test_one_system_disaggregated_instances_still_leave_the_other_phase_a_gpu(cli):
    r = cli(*QWEN, "--hardware", "dgx-h100", "--nodes", "2", "--dp-attention", "--disaggregated", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    # dpa2, dpa4, dpa8 for each phase (serve-multinode: even shares of a node); dpa16 would leave decode no GPU
    assert doc["considered"] == 6, doc["considered"]
    assert all(x[ph]["gpus_per_instance"] in (2, 4, 8) for x in doc["plans"] for ph in ("prefill", "decode"))


def test_a_whole_pool_instance_prices_its_expert_exchange_over_infiniband(cli, tmp_path: Path):
    """The dpa16 prefill instance on the 2-node pool is the one-system plan dp 16 ep 16 on those 2 nodes (the same
    TTFT), and its EP group is placed over 2 nodes, one GPU per NIC: the all-to-all crosses InfiniBand."""
    f = tmp_path / "c.yaml"
    f.write_text(POOLS)
    r = cli(*QWEN, "--hardware", f, "--dp-attention", "--disaggregated", "--top", "100", "--json")
    assert r.code == 0, r.err
    x = next(x for x in r.json()["plans"] if x["prefill"]["pool"] == "big" and x["prefill"]["gpus_per_instance"] == 16)
    one = cli("estimate", "--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2",
              "--phase", "prefill", "--dp-attention", "--dp", "16", "--ep", "16", "--moe-dispatcher", "deepep",
              "--two-batch-overlap", "--batch", "1", "--json")
    assert one.code == 0, one.err
    assert x["prefill"]["ttft_s"] == pytest.approx(one.json()["phase"]["ttft_s"], rel=1e-12)
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.serve import ServePlan
    c = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=2)
    span = place(ServePlan(tp=1, dp=16, ep=16, dp_attention=True).degrees, c)["ep"]
    # by hand: 16 ranks / 8 GPUs a node = 2 nodes, 8 per node; DGX H100 has 8 NICs for 8 GPUs: 1 GPU per NIC
    assert (span.nodes, span.per_node, span.uses_nic, span.gpus_per_nic) == (2, 8, True, 1)


# --- 2. estimate: DP-attention servers that straddle nodes -----------------------------------------------------

DSV3 = ("estimate", "--mode", "infer", "--model", "deepseek-v3", "--hardware", "dgx-h100", "--dp-attention",
        "--moe-dispatcher", "deepep", "--redundant-experts", "32")


def test_sglang_refuses_a_server_that_straddles_nodes_in_one_line(cli):
    r = cli(*DSV3, "--nodes", "9", "--dp", "72", "--ep", "36", "--engine", "sglang")
    line = r.refusal()
    assert "Traceback" not in r.err and r.out == ""
    assert line.startswith("error: the plan breaks a rule: --dp-attention under sglang: servers of ep 36 GPUs on "
                           "consecutive GPUs of nodes of 8 straddle node boundaries"), line
    assert "server 1 takes GPUs 0-35" in line and "tp-size / nnodes ranks on every node" in line, line
    # the valid ep: divisors of 72 above 1 that are whole nodes or divide a node
    assert "use --ep 2, 4, 8, 24, 72 on these 72 GPUs" in line and "--engine vllm" in line, line


def test_sglang_takes_whole_node_servers_and_even_shares_of_a_node(cli):
    for dp, ep, nodes in ((72, 24, 9), (16, 4, 2)):
        r = cli(*DSV3, "--nodes", str(nodes), "--dp", str(dp), "--ep", str(ep), "--engine", "sglang", "--json")
        assert r.code == 0, (ep, r.err)


def test_vllm_takes_uneven_ranks_per_node_and_prices_the_placement(cli):
    r = cli(*DSV3, "--nodes", "9", "--dp", "72", "--ep", "36", "--json")
    assert r.code == 0, r.err
    assert r.json()["copies"] == 2


def test_a_plan_on_fewer_gpus_than_the_cluster_is_refused_in_one_line_under_either_engine(cli):
    """Before: under sglang the rule was judged on ep 6 against nodes of 8 and its message looked for a server
    that straddles among the plan's 6 // 6 = 1 server (GPUs 0-5, inside node 0), found none and let StopIteration
    escape (exit 1, "internal error"). The plan's one server straddles nothing; the plan is refused for its GPU
    count only, as under vllm."""
    qwen = ("estimate", "--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2",
            "--dp-attention", "--dp", "6", "--ep", "6", "--moe-dispatcher", "deepep", "--redundant-experts", "4")
    for engine in ("sglang", "vllm"):
        line = cli(*qwen, "--engine", engine).refusal()
        assert line == "error: the plan breaks a rule: tp x pp x replicas (1 x 6 = 6) must equal the 16 GPUs; " \
                       "--dp (replicas) must be 16", (engine, line)


def test_a_pinned_straddling_ep_in_the_sglang_search_is_exit_2(cli):
    """Before: exit 3, "see the pruned table"; a pinned value no layout takes is bad input (#serve-edges)."""
    r = cli(*QWEN, "--hardware", "dgx-h100", "--nodes", "3", "--engine", "sglang", "--dp-attention", "--ep", "12",
            "--redundant-experts", "16")
    line = r.refusal()
    assert line.startswith("error: --ep 12: no serving layout of qwen3-30b-a3b on 24 GPUs takes it: --dp-attention "
                           "under sglang"), line
    assert "(rule dp_attention_nodes)" in line, line


# --- 3. plan files without a compute capability ----------------------------------------------------------------

TRAIN = ("estimate", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "2", "--ep", "8",
         "--sp", "--tp-comm-overlap", "--ep-comm-overlap", "--recompute", "selective", "--global-batch", "256")


def _strip_cc(path: Path, **top) -> Path:
    doc = json.loads(path.read_text())
    del doc["hardware"]["gpu"]["compute_capability"]
    doc.update(top)
    out = path.with_name(path.stem + "_nocc.json")
    out.write_text(json.dumps(doc))
    return out


def _queues(tmp: Path) -> list[str]:
    text = "\n".join(f.read_text() for f in tmp.glob("*.sh"))
    return re.findall(r"export CUDA_DEVICE_MAX_CONNECTIONS=(\d+)", text)


def test_a_plan_file_without_compute_capability_takes_the_profiles(cli, tmp_path: Path):
    """Before: the snapshot's GPU had compute capability None, so the TP overlap's one-queue rule was skipped:
    estimate --plan priced the EP overlap at full credit and the Megatron-LM export wrote 32."""
    path = tmp_path / "p.json"
    saved = cli(*TRAIN, "--save", path, "--json")
    assert saved.code == 0, saved.err
    nocc = _strip_cc(path)
    again = cli("estimate", "--plan", nocc, "--json")
    assert again.code == 0, again.err
    assert again.json()["time"]["step_s"] == pytest.approx(saved.json()["time"]["step_s"], rel=1e-12)
    assert cli("export", nocc, "--to", "megatron", "-o", tmp_path / "out").code == 0
    assert _queues(tmp_path / "out") == ["1"]
    # a count above 1 beside the TP overlap is refused from the stripped file too
    eight = tmp_path / "e.json"
    assert cli(*TRAIN, "--cuda-max-connections", "8", "--save", eight).code == 0
    line = cli("export", _strip_cc(eight), "--to", "megatron", "-o", tmp_path / "e").refusal()
    assert "CUDA_DEVICE_MAX_CONNECTIONS 8 beside TP 2's userbuffer overlap on h100" in line, line


def test_an_unknown_gpu_whose_reference_names_another_is_refused(cli, tmp_path: Path):
    path = tmp_path / "p.json"
    assert cli(*TRAIN, "--save", path).code == 0
    doc = json.loads(path.read_text())
    doc["hardware"]["gpu"]["name"] = "h100-custom"
    doc["hardware_ref"] = "dgx-h100"
    path.write_text(json.dumps(doc))
    bad = _strip_cc(path)
    for args in (("estimate", "--plan", bad), ("export", bad, "--to", "megatron", "-o", tmp_path / "o")):
        line = cli(*args).refusal()
        assert "the hardware snapshot's GPU h100-custom has no compute_capability, and its hardware_ref dgx-h100 " \
               "now has GPU h100-sxm (compute capability 9.0)" in line, line
        assert "add hardware.gpu.compute_capability" in line, line
    # without a reference and with no profile of that name: priced as a profile without the key (as before)
    doc = json.loads(bad.read_text())
    doc.pop("hardware_ref")
    bad.write_text(json.dumps(doc))
    assert cli("estimate", "--plan", bad).code == 0


def test_profiles_of_the_gpu_name_that_disagree_are_refused(cli, tmp_path: Path):
    """The plan's hardware_ref is a system file whose GPU is named h100-sxm with compute capability 8.0, the
    built-in h100-sxm says 9.0: which one the snapshot was is not known."""
    gpu = yaml.safe_load((ROOT / "hardware_profiles/gpus/h100-sxm.yaml").read_text())
    gpu["compute_capability"] = 8.0
    system = yaml.safe_load((ROOT / "hardware_profiles/systems/dgx-h100.yaml").read_text())
    system.update(name="my-h100", gpu=gpu)
    (tmp_path / "my.yaml").write_text(yaml.safe_dump(system))
    path = tmp_path / "p.json"
    assert cli(*TRAIN, "--save", path).code == 0
    doc = json.loads(path.read_text())
    doc["hardware_ref"] = "my.yaml"
    path.write_text(json.dumps(doc))
    line = cli("estimate", "--plan", _strip_cc(path)).refusal()
    assert "the hardware snapshot's GPU h100-sxm has no compute_capability and the profiles named h100-sxm give " \
           "8.0, 9.0" in line, line


def test_a_snapshot_gpu_without_a_name_is_refused_for_the_name(cli, tmp_path: Path):
    """Before: the missing name went to the profile look-up as the string "None", so the refusal read "the
    hardware snapshot's GPU None has no compute_capability, and its hardware_ref dgx-h100 now has GPU h100-sxm";
    now no profile is looked up and the snapshot's build names the missing field."""
    path = tmp_path / "p.json"
    assert cli(*TRAIN, "--save", path).code == 0
    doc = json.loads(_strip_cc(path).read_text())
    del doc["hardware"]["gpu"]["name"]
    assert doc["hardware_ref"] == "dgx-h100"
    path.write_text(json.dumps(doc))
    line = cli("estimate", "--plan", path).refusal()
    assert "GPU None" not in line and "compute_capability" not in line, line
    assert "name" in line and "(hardware)" in line, line
