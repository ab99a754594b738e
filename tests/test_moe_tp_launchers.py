"""Megatron-Core's routed-expert limits are the Megatron exports' refusals, not plan rules: biased experts only at
expert tp 1 (NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/transformer_config.py __post_init__: "Bias in
Moe is only supported when ETP==1") and MoE at tp > 1 only with sequence parallelism in training (d98e8a6
megatron/core/transformer/moe/moe_layer.py MoELayer.forward raises ValueError). DeepSpeed's AutoTP (no Megatron
sequence parallelism at all) and torchtitan run such plans, so a search for them keeps them (the three commands a
review found refused, exit 2, when check_plan held these rules)."""

from __future__ import annotations

import json

import pytest

H100 = ["--hardware", "dgx-h100"]
KEPT = {  # target: the search a review found refused with check_plan's rules
    "mixtral-deepspeed": ["--model", "mixtral-8x7b", *H100, "--nodes", "4", "--target", "deepspeed", "--tp", "2",
                          "--pp", "1", "--ep", "1"],
    "gpt-oss-deepspeed": ["--model", "gpt-oss-20b", *H100, "--nodes", "1", "--target", "deepspeed", "--tp", "2",
                          "--pp", "1", "--ep", "1"],
    "qwen3-torchtitan": ["--model", "qwen3-30b-a3b", *H100, "--nodes", "2", "--target", "torchtitan", "--tp", "2"],
}


@pytest.mark.parametrize("case", sorted(KEPT))
def test_non_megatron_targets_keep_moe_tp_plans(cli, case):
    r = cli("search", *KEPT[case], "--top", "1", "--json")
    assert r.code == 0, r.err
    top = r.json()["plans"][0]["plan"]
    assert top["tp"] == 2 and not top["sp"]  # MoE at tp 2 without sp: what Megatron-Core alone refuses
    if case == "gpt-oss-deepspeed":
        assert top["etp"] == 2  # expert tp 2 on biased experts: what Megatron-Core alone asserts against


def test_megatron_target_refuses_them_with_megatron_reason(cli):
    r = cli("search", "--model", "mixtral-8x7b", *H100, "--nodes", "4", "--target", "megatron", "--tp", "2",
            "--pp", "1", "--ep", "1", "--no-sp")
    assert r.code == 2 and "Traceback" not in r.err
    assert "megatron cannot express this plan: tp 2 without sequence parallelism" in r.err
    assert "moe_layer.py" in r.err and "re-plan with --sp" in r.err
    # Unpinned, --target megatron keeps only plans with sp at tp > 1
    r = cli("search", "--model", "mixtral-8x7b", *H100, "--nodes", "4", "--target", "megatron", "--tp", "2",
            "--pp", "1", "--ep", "1", "--json")
    assert r.code == 0, r.err
    assert all(row["plan"]["sp"] for row in r.json()["plans"])


def test_saved_deepspeed_plan_exports_there_and_megatron_names_both_limits(cli, tmp_path):
    saved = tmp_path / "ds.json"
    r = cli("search", *KEPT["gpt-oss-deepspeed"], "--top", "1", "--save", saved, "--json")
    assert r.code == 0, r.err
    assert cli("export", saved, "--to", "deepspeed", "--out", tmp_path / "ds").code == 0
    doc = json.loads(saved.read_text())
    assert doc["plan"]["tp"] == 2 and not doc["plan"]["sp"]
    # Megatron-FSDP priced, and the unfused loss as Megatron runs it (DeepSpeed's is eager: export.common
    # UNFUSED_LOSS_RUNS), so that the Megatron export's expert rules are the ones it meets
    doc["plan"]["megatron_fsdp"] = True
    doc["plan"]["unfused_loss_impl"] = "vocab-parallel"
    (tmp_path / "a.json").write_text(json.dumps(doc))
    e = cli("export", tmp_path / "a.json", "--to", "megatron", "--out", tmp_path / "a")
    assert e.code == 2 and "expert tp 2 with gpt-oss-20b's expert biases" in e.err
    assert "Bias in Moe is only supported when ETP==1" in e.err and "re-plan with --etp 1" in e.err
    doc["plan"]["etp"] = 1
    (tmp_path / "b.json").write_text(json.dumps(doc))
    e = cli("export", tmp_path / "b.json", "--to", "megatron", "--out", tmp_path / "b")
    assert e.code == 2 and "tp 2 without sequence parallelism on gpt-oss-20b's MoE layers" in e.err
    assert "re-plan with --sp" in e.err
