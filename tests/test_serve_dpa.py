"""serve-dpa: --dp-attention over several pools follows a pinned --ep, and a DP-attention group is replicated
over the GPUs like any other serving layout.

1. Over pools, each pool takes --dp-attention as its system alone would; a pool with no DP-attention layout
   serves nothing (the pools table and JSON `pools_alone[].refusal` say why) and the search is refused (exit 2,
   every pool named with its reason) only when no pool has one. The disaggregated search follows the same rule:
   its prefill and decode instances come from the pools that have a DP-attention layout.
2. A DP-attention server of ep GPUs is copied over the GPUs as a TP / PP replica is (ServePlan dp = ep x copies,
   each copy an independent server): on 2 DGX H100, "dpa8 ep8 x2" runs 16 / 8 = 2 servers and serves twice one
   server's tokens/s at the same TTFT / TPOT. Before, the search ranked "dpa8 ep8" on 8 of the 16 GPUs first (by
   tokens/s per GPU) and over pools a 16-GPU pool served with 8.
"""

from __future__ import annotations

from pathlib import Path

import pytest
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
    assert "ep (32) must equal the 16 GPUs (tp x pp x dp), or divide them (dp / ep servers of ep > 1 GPUs); use --ep 16 | pool a100 (1 x dgx-a100, 8 GPUs): " \
           in lines[0] and lines[0].endswith("ep (32) must equal the 8 GPUs (tp x pp x dp), or divide them (dp / ep servers of ep > 1 GPUs); use --ep 8"), lines[0]


def test_one_gpu_has_no_dp_attention_layout_refused_on_one_system_and_skipped_over_pools(cli, tmp_path: Path):
    """One GPU: no wide-EP group. Before: one system exit 3 ("see the pruned table", none printed); over pools
    the pools table said "none tried: tp x pp above the pool's GPUs"."""
    solo = _one_gpu_system(tmp_path)
    one = cli(*QWEN, "--hardware", solo, "--nodes", "1", "--dp-attention")
    assert one.code == 2 and one.err.strip().splitlines() == [
        "error: --dp-attention: no DP-attention layout of qwen3-30b-a3b on 1 GPUs: the search tries wide-EP groups "
        "of even shares of a node, whole nodes, doubling, and every GPU (none: one GPU), each with ep over its GPUs dividing the 128 "
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


H100 = ("--hardware", "dgx-h100")


def _plan(doc: dict, ep: int) -> dict:
    return next(p for p in doc["plans"] if p["plan"]["ep"] == ep)


def test_a_dp_attention_server_is_copied_over_the_gpus_like_a_replica(cli):
    two = cli(*QWEN, *H100, "--nodes", "2", "--dp-attention", "--json")
    one = cli(*QWEN, *H100, "--nodes", "1", "--dp-attention", "--json")
    assert two.code == 0 and one.code == 0, (two.err, one.err)
    x2, x1 = _plan(two.json(), 8), _plan(one.json(), 8)
    # by hand: 16 GPUs / 8 GPUs per server = 2 servers, dp (attention ranks) 2 x 8 = 16
    assert (x2["gpus"], x2["plan"]["dp"], x2["copies"], x2["gpus_per_copy"]) == (16, 16, 2, 8)
    assert (x1["gpus"], x1["plan"]["dp"], x1["copies"], x1["gpus_per_copy"]) == (8, 8, 1, 8)
    assert x2["throughput"]["tokens_per_s"] == pytest.approx(2 * x1["throughput"]["tokens_per_s"], rel=1e-9)
    assert (x2["ttft_s"], x2["tpot_s"], x2["max_concurrent_seqs"]) == (x1["ttft_s"], x1["tpot_s"],
                                                                        x1["max_concurrent_seqs"])
    assert x2["throughput"]["tokens_per_s_per_gpu"] == pytest.approx(x1["throughput"]["tokens_per_s_per_gpu"])
    # every plan of the 16-GPU search uses the 16 GPUs
    assert all(p["gpus"] == 16 for p in two.json()["plans"]), [p["gpus"] for p in two.json()["plans"]]
    text = cli(*QWEN, *H100, "--nodes", "2", "--dp-attention")
    row = next(ln for ln in text.out.splitlines() if " dpa8 ep8 x2 " in ln)
    assert row.split()[4] == "16", row  # the GPUs column


def test_over_pools_a_16_gpu_pool_serves_with_16(cli, tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text(POOLS)
    r = cli(*QWEN, "--hardware", f, "--dp-attention", "--json")
    one = cli(*QWEN, *H100, "--nodes", "1", "--dp-attention", "--json")
    assert r.code == 0 and one.code == 0, (r.err, one.err)
    big = next(b for b in r.json()["by_pool"] if b["pool"] == "big")
    g = one.json()["plans"][0]["plan"]["ep"]  # one node's best server (serve-multinode: dpa4, two on a node)
    assert (big["gpus"], big["replicas"]) == (16, 16 // g), (big["gpus"], big["replicas"])
    assert big["tokens_per_s"] == pytest.approx(2 * _plan(one.json(), g)["throughput"]["tokens_per_s"], rel=1e-9)


def test_estimate_takes_dp_attention_servers_and_refuses_an_ep_that_does_not_divide(cli):
    base = ("estimate", "--mode", "infer", "--model", "qwen3-30b-a3b", *H100, "--dp-attention",
            "--moe-dispatcher", "deepep", "--json")
    two = cli(*base, "--nodes", "2", "--dp", "16", "--ep", "8")
    one = cli(*base, "--nodes", "1", "--dp", "8", "--ep", "8")
    assert two.code == 0 and one.code == 0, (two.err, one.err)
    assert two.json()["throughput"]["tokens_per_s"] == pytest.approx(2 * one.json()["throughput"]["tokens_per_s"])
    bad = cli(*base, "--nodes", "2", "--dp", "16", "--ep", "6")
    assert bad.code == 2 and "ep (6) must equal the 16 GPUs (tp x pp x dp), or divide them" in bad.err, bad.err


def test_min_gpus_adds_dp_attention_servers_one_at_a_time(cli):
    """With a request rate the fewest servers that carry it: one server's capacity (by hand from its tokens/s /
    256 output tokens) x 1.5 needs 2 servers, 16 GPUs; x 0.5 one, 8 GPUs."""
    one = cli(*QWEN, *H100, "--nodes", "1", "--dp-attention", "--ep", "8", "--json")
    cap = _plan(one.json(), 8)["throughput"]["tokens_per_s"] / 256
    for factor, gpus in ((0.5, 8), (1.5, 16)):
        r = cli(*QWEN, *H100, "--nodes", "4", "--dp-attention", "--ep", "8", "--objective", "min-gpus",
                "--request-rate", f"{cap * factor:.3f}", "--json")
        assert r.code == 0, r.err
        p = r.json()["plans"][0]
        assert (p["gpus"], p["copies"], p["plan"]["ep"]) == (gpus, gpus // 8, 8), (factor, p["gpus"], p["copies"])


def _launch_flags(text: str) -> list[str]:
    return [ln.strip().rstrip(" \\") for ln in text.splitlines() if ln.startswith("    --")]


def test_the_export_writes_one_server_of_a_copied_dp_attention_plan_and_says_how_many(cli, tmp_path: Path):
    """Each copy is the one-node plan's server: the same launch flags (SGLang --tp-size / --attn-dp-size 8, vLLM
    --data-parallel-size 8), and a comment says to start it on each of the 2 groups."""
    base = ("estimate", "--mode", "infer", "--model", "qwen3-30b-a3b", *H100, "--dp-attention",
            "--moe-dispatcher", "deepep", "--engine", "sglang")
    files = {}
    for name, extra in (("x2", ("--nodes", "2", "--dp", "16", "--ep", "8")),
                        ("x1", ("--nodes", "1", "--dp", "8", "--ep", "8"))):
        plan, out = tmp_path / f"{name}.json", tmp_path / name
        assert cli(*base, *extra, "--save", plan).code == 0
        r = cli("export", plan, "--to", "all", "-o", out)
        assert r.code == 0, r.err
        files[name] = {p.name: p.read_text() for p in out.iterdir()}
    for sh in ("sglang_serve.sh", "vllm_serve.sh"):
        assert _launch_flags(files["x2"][sh]) == _launch_flags(files["x1"][sh]), sh
        assert "as 2 independent servers of 8 GPUs (dp 16 / ep 8)" in files["x2"][sh], files["x2"][sh]
        assert "independent servers" not in files["x1"][sh]
    assert "--tp-size 8" in _launch_flags(files["x2"]["sglang_serve.sh"])
    assert "--attn-dp-size 8" in _launch_flags(files["x2"]["sglang_serve.sh"])
    assert "--data-parallel-size 8" in _launch_flags(files["x2"]["vllm_serve.sh"])


def test_over_pools_a_request_rate_runs_the_fewest_dp_attention_servers(cli, tmp_path: Path):
    """Before: exit 2 ("ep (8) must equal the 5 GPUs"): the rate's replicas were counted in attention ranks and
    a dpa8 plan re-priced at dp 5. Now in servers: pool big's share of 200 requests/s (in proportion to the
    capacities) over one server's capacity (the pool's / its servers), rounded up."""
    f = tmp_path / "c.yaml"
    f.write_text(POOLS)
    cap = cli(*QWEN, "--hardware", f, "--dp-attention", "--json")
    r = cli(*QWEN, "--hardware", f, "--dp-attention", "--request-rate", "200", "--json")
    assert cap.code == 0 and r.code == 0, (cap.err, r.err)
    caps = {b["pool"]: b["capacity_requests_per_s"] for b in cap.json()["by_pool"]}
    share = 200 * caps["big"] / sum(caps.values())
    full = next(b for b in cap.json()["by_pool"] if b["pool"] == "big")
    g = full["estimate"]["gpus_per_copy"]  # the pool's server (serve-multinode: dpa4, two on a node)
    servers = -(-share // (caps["big"] / full["replicas"]))
    big = next(b for b in r.json()["by_pool"] if b["pool"] == "big")
    assert (big["replicas"], big["gpus"], big["estimate"]["plan"]["dp"]) == (servers, g * servers, g * servers)
    assert big["requests_per_s"] == pytest.approx(share)
