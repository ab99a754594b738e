"""serve-dpa: --dp-attention over several pools follows a pinned --ep, and a DP-attention group is replicated
over the GPUs like any other serving layout.

1. Over pools, each pool takes --dp-attention as its system alone would; a pool with no DP-attention layout
   serves nothing (the pools table and JSON `pools_alone[].refusal` say why) and the search is refused (exit 2,
   every pool named with its reason) only when no pool has one. The disaggregated search follows the same rule:
   its prefill and decode instances come from the pools that have a DP-attention layout.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
QWEN = ("search", "--mode", "infer", "--model", "qwen3-30b-a3b")
POOLS = "pools:\n  - {system: dgx-h100, nodes: 2, name: big}\n  - {system: dgx-a100, nodes: 1, name: a100}\n" \
        "fabric: {gb_per_s: 50}\n"


def _one_gpu_system(tmp_path: Path) -> Path:
    """dgx-h100 cut to one GPU a node: no wide-EP group (wide_ep_sizes of one GPU is empty)."""
    spec = yaml.safe_load((ROOT / "hardware_profiles/systems/dgx-h100.yaml").read_text())
    spec.update(name="h100-solo", gpus_per_node=1, nvlink_domain_gpus=1)
    f = tmp_path / "solo.yaml"
    f.write_text(yaml.safe_dump(spec))
    return f


def test_a_pool_that_cannot_take_dp_attention_serves_nothing_and_the_others_serve(cli, tmp_path: Path):
    """Before: exit 2 ("pool a100 ...: ep (16) must equal the 8 GPUs"), though pool big alone serves."""
    f = tmp_path / "c.yaml"
    f.write_text(POOLS)
    r = cli(*QWEN, "--hardware", f, "--dp-attention", "--ep", "16", "--json")
    one = cli(*QWEN, "--hardware", "dgx-h100", "--nodes", "2", "--dp-attention", "--ep", "16", "--top", "1", "--json")
    assert r.code == 0 and one.code == 0, (r.err, one.err)
    doc = r.json()
    assert [b["pool"] for b in doc["by_pool"]] == ["big"], doc["by_pool"]
    assert doc["by_pool"][0]["estimate"]["plan"] == one.json()["plans"][0]["plan"]
    alone = {p["pool"]: p for p in doc["pools_alone"]}
    assert alone["big"]["refusal"] is None and alone["big"]["feasible"] >= 1
    assert alone["a100"]["feasible"] == 0 and "ep (16) must equal the 8 GPUs" in alone["a100"]["refusal"]


def test_dp_attention_no_pool_takes_is_refused_naming_each_pool_and_reason(cli, tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text(POOLS)
    r = cli(*QWEN, "--hardware", f, "--dp-attention", "--ep", "32")
    assert r.code == 2 and r.out == "" and "Traceback" not in r.err, (r.code, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith("error: pool big (2 x dgx-h100, 16 GPUs): the plan breaks a rule: "), lines[0]
    assert "ep (32) must equal the 16 GPUs (tp x pp x dp); use --ep 16 | pool a100 (1 x dgx-a100, 8 GPUs): " \
           in lines[0] and lines[0].endswith("ep (32) must equal the 8 GPUs (tp x pp x dp); use --ep 8"), lines[0]


def test_one_gpu_has_no_dp_attention_layout_refused_on_one_system_and_skipped_over_pools(cli, tmp_path: Path):
    """One GPU: no wide-EP group. Before: one system exit 3 ("see the pruned table", none printed); over pools
    the pools table said "none tried: tp x pp above the pool's GPUs"."""
    solo = _one_gpu_system(tmp_path)
    one = cli(*QWEN, "--hardware", solo, "--nodes", "1", "--dp-attention")
    assert one.code == 2 and one.err.strip().splitlines() == [
        "error: --dp-attention: no DP-attention layout of qwen3-30b-a3b on 1 GPUs: the search tries wide-EP groups "
        "of whole nodes, doubling, and every GPU (none: one GPU), each with ep over its GPUs dividing the 128 "
        "experts (with --redundant-experts, else 0 or 32 redundant); add GPUs or drop --dp-attention"], one.err
    f = tmp_path / "c.yaml"
    f.write_text(f"pools:\n  - {{system: dgx-h100, nodes: 2, name: big}}\n  - {{system: {solo}, nodes: 1, "
                 "name: solo}\nfabric: {gb_per_s: 50}\n")
    r = cli(*QWEN, "--hardware", f, "--dp-attention")
    flat = " ".join(r.out.split())
    assert r.code == 0 and "solo: no layout tried: --dp-attention: no DP-attention layout" in flat, (r.err, r.out)
    assert "none tried" not in flat, r.out


def test_disaggregated_dp_attention_uses_the_pools_that_take_it(cli, tmp_path: Path):
    """Per role, the same rule: prefill and decode DP-attention instances sit on pools that have a layout (the
    one-GPU pool has none); refused only when no pool has one."""
    solo = _one_gpu_system(tmp_path)
    f = tmp_path / "c.yaml"
    f.write_text(f"pools:\n  - {{system: dgx-h100, nodes: 2, name: big}}\n  - {{system: {solo}, nodes: 1, "
                 "name: solo}\nfabric: {gb_per_s: 50}\n")
    r = cli(*QWEN, "--hardware", f, "--dp-attention", "--disaggregated", "--json")
    assert r.code == 0, r.err
    plans = r.json()["plans"]
    assert plans and all(x[ph]["pool"] == "big" and x[ph]["dp_attention"] for x in plans
                         for ph in ("prefill", "decode")), plans
    g = tmp_path / "d.yaml"
    g.write_text(f"pools:\n  - {{system: {solo}, nodes: 1, name: s1}}\n  - {{system: {solo}, nodes: 1, name: s2}}\n"
                 "fabric: {gb_per_s: 50}\n")
    no = cli(*QWEN, "--hardware", g, "--dp-attention", "--disaggregated")
    assert no.code == 2 and no.err.startswith("error: pools s1 (1 x h100-solo, 1 GPUs), s2 (1 x h100-solo, 1 GPUs): "
                                              "--dp-attention: no DP-attention layout"), no.err
