"""Per-layer CUDA graphs of the MoE preprocess with the alltoall dispatcher (check_plan rule
cuda_graphs_moe_preprocess). NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py at d98e8a6
(__post_init__, the cuda_graph_modules checks) refuses moe_preprocess "when there are DtoH copies and
synchronizations in the preprocess step": with the alltoall dispatcher and the routing map padded for fp8 / fp4
(moe_router_padding_for_fp8), unless each expert's input is padded to capacity; moe/token_dispatcher.py there
(MoEAlltoAllTokenDispatcher.preprocess) returns before the host copy when padded to capacity (drop_and_pad: the
counts are `capacity` on the host) and sums num_out_tokens on the GPU, synced before permutation 1, otherwise."""

from __future__ import annotations

from llmplan.search.grid import from_plan
from llmplan.specs.check import check_plan
from llmplan.specs.check_switches import SWITCH_RULES
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems
from llmplan.specs.rule import as_bool

M, S = builtin_models(), builtin_systems()
RULE = "cuda_graphs_moe_preprocess"


def _plan(**kw) -> ParallelPlan:
    base = dict(ep=8, dp=8, etp=1, micro_batch=1, global_batch=64, seq_len=4096, zero=1, dtype="fp8",
                recipe="mxfp8", moe_router_padding=True, cuda_graphs="layers")
    return ParallelPlan(**{**base, **kw})


def test_graphed_preprocess_of_the_padded_routing_map_is_refused():
    m, cluster = M["qwen3-30b-a3b"], ClusterSpec(system=S["dgx-b200"], num_nodes=1)
    got = [v.message for v in check_plan(m, _plan(), cluster) if v.rule == RULE]
    assert len(got) == 1, got
    assert got[0].startswith("cuda_graphs layers with the alltoall dispatcher and moe_router_padding (qwen3-30b-a3b)")
    assert got[0].endswith("drop --moe-router-padding, pad to capacity with --moe-capacity-factor, or use "
                           "--train-cuda-graphs none")
    fine = (_plan(moe_router_padding=False), _plan(moe_capacity_factor=1.0), _plan(cuda_graphs="none"),
            _plan(recompute="selective", recompute_modules=("moe",)),  # the router and preprocess stay eager
            _plan(moe_dispatcher="deepep", moe_flex_backend="hybridep"))
    for ok in fine:
        assert RULE not in {v.rule for v in check_plan(m, ok, cluster)}, ok
    # the search's arrays read the same predicate
    rule = next(r for r in SWITCH_RULES if r.name == RULE)
    assert not as_bool(rule.ok(m, from_plan(_plan()), cluster)).any()
    assert as_bool(rule.ok(m, from_plan(_plan(moe_capacity_factor=1.0)), cluster)).all()


def test_the_megatron_export_graphs_the_preprocess_padded_to_capacity_and_refuses_the_padded_map(cli, tmp_path):
    import json

    common = ("-m", "qwen3-30b-a3b", "--hardware", "dgx-b200", "--nodes", "1", "--global-batch", "64",
              "--seq-len", "4096", "--ep", "8", "--precision", "mxfp8", "--train-cuda-graphs", "layers")
    saved = tmp_path / "cap.json"
    r = cli("estimate", *common, "--moe-capacity-factor", "1.0", "--moe-router-padding", "--save", saved)
    assert r.code == 0, r.err
    assert cli("export", saved, "--to", "megatron", "-o", tmp_path / "cap").code == 0
    script = "\n".join(p.read_text() for p in (tmp_path / "cap").rglob("*") if p.is_file())
    assert "--moe-pad-expert-input-to-capacity" in script and "moe_preprocess" in script
    r = cli("estimate", *common, "--moe-router-padding")
    assert r.code == 2 and "alltoall dispatcher and moe_router_padding (qwen3-30b-a3b)" in r.err, r.err
    doc = json.loads(saved.read_text())
    doc["plan"]["moe_capacity_factor"] = None
    saved.write_text(json.dumps(doc))
    r = cli("export", saved, "--to", "megatron", "-o", tmp_path / "map")
    assert r.code == 2 and "moe_router_padding" in r.err, r.err
