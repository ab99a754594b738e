"""serve-edges2: four serving-search edges, each through the CLI.

1. ep_serve_engine: SGLang and TensorRT-LLM split a replica's TP ranks into EP groups, so ep must divide tp
   (sgl-project/sglang v0.5.23, python/sglang/srt/runtime_context.py: moe_tp_size = tp_size // moe_ep_size //
   moe_dp_size and _validate_parallel's tp_size == moe_ep_size x moe_dp_size x moe_tp_size; NVIDIA/TensorRT-LLM
   @b35ac1b6, tensorrt_llm/mapping.py, MappingBase: moe_tp_size x moe_ep_size must equal tp_size). ep 3 at tp 4
   passed before.
2. A pinned --tp wider than the NVLink domain is served (vLLM and SGLang run TP over nodes) and priced over the
   scale-out network; the search says so in a warning.
3. --dp-attention over pools: the refusal names the pool(s) that have no DP-attention layout.
4. The pools table labels a DP-attention layout as the one-system table does (dpaN epN).
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
QWEN_MOE = ("search", "--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "1")


def test_sglang_ep_that_does_not_divide_tp_is_refused_with_the_valid_choices(cli):
    """qwen3-30b-a3b: 128 experts + 16 redundant = 144, which 3 divides; at tp 4 SGLang takes ep 1, 2, 4 (the
    divisors of 4, all dividing 144, by hand). Before: searched, exit 0, a "tp4 pp1 x2 ep3" plan."""
    r = cli(*QWEN_MOE, "--engine", "sglang", "--redundant-experts", "16", "--tp", "4", "--ep", "3")
    assert r.code == 2 and r.out == "", (r.code, r.out)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.err, r.err
    assert lines[0].startswith("error: --ep 3: no serving layout of qwen3-30b-a3b on 8 GPUs takes it: "
                               "ep (3) must divide tp (4) under sglang"), lines[0]
    assert "valid ep at tp 4: 1, 2, 4 (rule ep_serve_engine)" in lines[0], lines[0]
    assert "pin one of --ep 1, 2, 4 on these GPUs" in lines[0], lines[0]


def test_trtllm_follows_the_same_rule_and_an_ep_dividing_tp_still_searches(cli):
    trt = cli(*QWEN_MOE, "--engine", "trtllm", "--redundant-experts", "16", "--tp", "4", "--ep", "3")
    assert trt.code == 2 and "ep (3) must divide tp (4) under trtllm" in trt.err, trt.err
    ok = cli(*QWEN_MOE, "--engine", "sglang", "--redundant-experts", "16", "--tp", "4", "--ep", "2", "--top", "1",
             "--json")
    assert ok.code == 0, ok.err
    assert (ok.json()["plans"][0]["plan"]["tp"], ok.json()["plans"][0]["plan"]["ep"]) == (4, 2)


def _h100_domain16(tmp_path: Path) -> Path:
    """dgx-h100 with a (hypothetical) NVLink domain of 16 GPUs: the same GPU, NVLink rate and NICs, two nodes
    behind one scale-up fabric, so a tp 16 group never leaves NVLink."""
    spec = yaml.safe_load((ROOT / "hardware_profiles/systems/dgx-h100.yaml").read_text())
    spec.update(name="dgx-h100-nvl16", nvlink_domain_gpus=16)
    f = tmp_path / "nvl16.yaml"
    f.write_text(yaml.safe_dump(spec))
    return f


def test_a_pinned_tp_across_nvlink_domains_is_priced_over_the_network_and_said(cli, tmp_path: Path):
    args = ("search", "--mode", "infer", "--model", "llama-3.1-70b", "--nodes", "2", "--tp", "16", "--top", "1")
    two = cli(*args, "--hardware", "dgx-h100", "--json")
    one = cli(*args, "--hardware", _h100_domain16(tmp_path), "--json")
    assert two.code == 0 and one.code == 0, (two.err, one.err)
    a, b = two.json()["plans"][0], one.json()["plans"][0]
    assert a["plan"]["tp"] == b["plan"]["tp"] == 16 and a["workload"] == b["workload"]
    # the same plan, batch and GPUs: only the TP group's fabric differs, so the step over IB is the slower one
    assert a["tpot_s"] > b["tpot_s"], (a["tpot_s"], b["tpot_s"])
    span = [w for w in a["warnings"] if w.startswith("tp 16 spans 2 NVLink domains of 8 GPUs")]
    assert len(span) == 1 and "--tp 8 --pp 2 keeps TP on NVLink" in span[0], a["warnings"]
    assert not any("NVLink domains" in w for w in b["warnings"]), b["warnings"]
    text = cli(*args, "--hardware", "dgx-h100")
    assert text.code == 0 and "warning (#1): tp 16 spans 2 NVLink domains of 8 GPUs" in text.out, text.out


POOLS = "pools:\n  - {system: dgx-h100, nodes: 2, name: big}\n  - {system: dgx-a100, nodes: 1}\nfabric: {gb_per_s: 50}\n"


def test_dp_attention_over_pools_names_the_pool_without_a_layout(cli, tmp_path: Path):
    """--ep 16 fits the DP-attention group of pool big (16 GPUs), not the 8 GPUs of pool dgx-a100. serve-dpa: as
    a pinned --ep, the pool without a layout serves nothing and the pools table says why (it refused the search
    before)."""
    f = tmp_path / "c.yaml"
    f.write_text(POOLS)
    r = cli("search", "--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", f, "--dp-attention", "--ep", "16")
    assert r.code == 0 and "Traceback" not in r.err, r.err
    flat = " ".join(r.out.split())
    assert ("dgx-a100: no layout tried: the plan breaks a rule: --dp-attention shards the experts over every GPU"
            in flat and "ep (16) must equal the 8 GPUs" in flat), r.out
    assert "none tried" not in flat and "big: no layout" not in flat, r.out


def test_dp_attention_over_pools_names_every_pool_once_when_all_break_it(cli, tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text(POOLS)
    r = cli("search", "--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", f, "--dp-attention", "--pp", "2")
    assert r.code == 2, r.err
    assert r.err.startswith("error: pools big (2 x dgx-h100, 16 GPUs), dgx-a100 (1 x dgx-a100, 8 GPUs): the plan "
                            "breaks a rule: --dp-attention runs attention whole on every GPU"), r.err


def test_the_pools_table_labels_a_dp_attention_layout_as_the_one_system_table(cli, tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text("pools:\n  - {system: dgx-h100, nodes: 1, name: h100}\n  - {system: dgx-a100, nodes: 1}\n"
                 "fabric: {gb_per_s: 50}\n")
    pools = cli("search", "--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", f, "--dp-attention")
    one = cli(*QWEN_MOE, "--dp-attention", "--top", "1")
    assert pools.code == 0 and one.code == 0, (pools.err, one.err)
    # serve-multinode: the search tries DP-attention servers of half a node too; on one DGX H100 two dpa4
    # servers rank first, on the A100 pool one dpa8 server
    assert " dpa4 ep4 x2 " in one.out, one.out
    rows = [ln for ln in pools.out.splitlines() if ln.strip().startswith(("h100 ", "dgx-a100 "))]
    assert len(rows) == 2 and " dpa4 ep4" in rows[0] and " dpa8 ep8 " in rows[1], pools.out
    assert "x8 ep8" not in pools.out and "dpaN: DP attention on N GPUs" in " ".join(pools.out.split()), pools.out
