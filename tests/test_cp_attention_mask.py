"""check_plan's cp_attention_mask rule: a context-parallel implementation that cannot run the model's attention masks
is refused. Transformer Engine's p2p ring (cp_impl te) asserts that a sliding window runs only with its a2a or
all_gather CP and a learnable softmax (attention sinks) only with a2a (NVIDIA/TransformerEngine@d0067d0,
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py, attn_forward_func_with_cp);
PyTorch's SDPA ring (torch-alltoall) takes no mask but is_causal (torch/distributed/tensor/experimental/
_context_parallel/_attention.py: 'attn_bias is not supported yet'); its FlexAttention CP (torch-allgather)
all-gathers the K/V and applies any block mask. And the exports that follow from it."""

from __future__ import annotations

from pathlib import Path

from llmplan.specs.check import check_plan
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import resolve_model

GPT_OSS = ("--model", "gpt-oss-20b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "1", "--pp", "1", "--cp", "2",
           "--seq-len", "8192", "--global-batch", "16", "--micro-batch", "1")


def test_te_ring_refuses_gpt_oss_windows_and_sinks(cli):
    r = cli("estimate", *GPT_OSS)
    assert r.code == 2
    assert r.err == (
        "error: the plan breaks a rule: cp_impl te cp_comm_type p2p with cp 2 cannot run gpt-oss-20b's 12 "
        "sliding-window layers (window 128) and attention sinks: Transformer Engine's p2p context parallelism runs "
        "only causal or full masks with the plain softmax; use --cp-comm-type a2a (with --cp-impl te), --cp-impl "
        "torch-allgather (FlexAttention's all-gather of the K/V, which applies any mask) or --cp 1\n")


def test_sdpa_ring_refuses_chunked_attention(cli):
    r = cli("estimate", "--model", "llama-4-scout", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "8", "--cp", "2",
            "--ep", "8", "--etp", "1", "--pp", "1", "--seq-len", "8192", "--global-batch", "16", "--micro-batch", "1",
            "--cp-impl", "torch-alltoall")
    assert r.code == 2
    assert r.err == (
        "error: the plan breaks a rule: cp_impl torch-alltoall with cp 2 cannot run llama-4-scout's 36 chunked "
        "layers (chunk 8192): PyTorch's SDPA ring takes only a causal mask; use --cp-impl torch-allgather "
        "(FlexAttention's all-gather of the K/V, which applies any mask) or --cp 1\n")


def test_flex_allgather_and_cp1_pass(cli):
    assert cli("estimate", *GPT_OSS, "--cp-impl", "torch-allgather").code == 0
    assert cli("estimate", *GPT_OSS[:-8], "--cp", "1", *GPT_OSS[-6:]).code == 0


def test_sinks_alone_refuse_only_the_te_ring():
    m = resolve_model("gpt-oss-20b").model_copy(update={"layer_types": None})  # every layer full, sinks kept
    base = dict(tp=1, pp=1, dp=4, cp=2, seq_len=8192, global_batch=16, micro_batch=1)
    rules = {impl: [v.rule for v in check_plan(m, ParallelPlan(**base, cp_impl=impl))]
             for impl in ("te", "torch-alltoall", "torch-allgather")}
    assert rules["te"].count("cp_attention_mask") == 1
    assert "cp_attention_mask" not in rules["torch-alltoall"] + rules["torch-allgather"]
    # TE: a learnable softmax offset only under a2a (attn_forward_func_with_cp asserts softmax_type vanilla or a2a)
    te = {ct: [v.rule for v in check_plan(m, ParallelPlan(**base, cp_comm_type=ct))] for ct in ("a2a", "all_gather")}
    assert "cp_attention_mask" not in te["a2a"] and te["all_gather"].count("cp_attention_mask") == 1
    plain = m.model_copy(update={"attention_sinks": False})  # a causal model: every implementation runs it
    assert all("cp_attention_mask" not in [v.rule for v in check_plan(plain, ParallelPlan(**base, cp_impl=i))]
               for i in rules)


def test_search_prunes_the_te_ring_for_windowed_models():
    """A search held to the p2p ring (a library call; the CLI tries a2a for this model: test_cp_comm_type.py)."""
    from llmplan.search.grid import Workload, default_space
    from llmplan.search.run import search
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.registry import resolve_system
    m, cluster = resolve_model("gpt-oss-20b"), ClusterSpec(system=resolve_system("dgx-h100"), num_nodes=1)
    w = Workload(global_batch=16, seq_len=16384)
    res = search(m, cluster, default_space(m, cluster, w), w, top=5)
    assert {x.rule: x.count for x in res.pruned}["cp_attention_mask"] > 0
    assert res.ranked and all(e.plan.cp == 1 for e in res.ranked)


def _plan(cli, tmp_path: Path, *args: str) -> Path:
    path = tmp_path / "plan.json"
    made = cli("estimate", *args, "--save", path)
    assert made.code == 0, made.err
    return path


def test_megatron_exports_refuse_the_torch_ring_and_point_to_te_a2a(cli, tmp_path):
    plan = _plan(cli, tmp_path, *GPT_OSS, "--cp-impl", "torch-allgather")
    for target in ("megatron", "megatron-bridge"):
        r = cli("export", plan, "--to", target, "-o", tmp_path / target)
        assert r.code == 2
        assert r.err == (
            f"error: {target} cannot express this plan: PyTorch's context-parallel ring (cp_impl torch-allgather, "
            "cp 2; Megatron-Core's attention runs Transformer Engine's); re-plan with --cp-impl te --cp-comm-type "
            "a2a, or export to torchtitan\n")


def test_bridge_pins_the_p2p_ring_it_priced(cli, tmp_path):
    """Megatron-Bridge recipes set their own cp_comm_type (gpt_oss and gemma3_vl a2a, glm5 allgather:
    NVIDIA-NeMo/Megatron-Bridge@067f987 src/megatron/bridge/recipes/); a cp > 1 plan priced as the p2p ring
    writes it over theirs, a cp 1 plan leaves it."""
    args = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--tp", "2", "--pp", "1",
            "--seq-len", "8192", "--global-batch", "16", "--micro-batch", "1")
    for cp, expect in ((2, 1), (1, 0)):
        sub = tmp_path / f"cp{cp}"
        sub.mkdir()
        plan = _plan(cli, sub, *args, "--cp", str(cp))
        r = cli("export", plan, "--to", "megatron-bridge", "-o", sub / "out")
        assert r.code == 0, r.err
        text = (sub / "out" / "megatron_bridge_pretrain.sh").read_text()
        assert text.count("'model.cp_comm_type=p2p'") == expect


def test_torchtitan_02_refuses_gpt_oss_cp_and_03_runs_it(cli, tmp_path):
    plan = _plan(cli, tmp_path, "--model", "gpt-oss-120b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "1",
                 "--cp", "2", "--ep", "8", "--etp", "1", "--pp", "1", "--seq-len", "8192", "--global-batch", "16",
                 "--micro-batch", "1", "--cp-impl", "torch-allgather")
    r = cli("export", plan, "--to", "torchtitan-0.2", "-o", tmp_path / "tt02")
    assert r.code == 2
    assert r.err == (
        "error: torchtitan-0.2 cannot express this plan: context parallelism (cp 2) of gpt-oss-120b (torchtitan "
        "v0.2.2's gpt_oss raises NotImplementedError: 'CP support for gpt-oss model is still in progress'); export "
        "to torchtitan (0.3), or re-plan with --cp 1\n")
    assert cli("export", plan, "--to", "torchtitan", "-o", tmp_path / "tt03").code == 0
