"""Issue 32, "layouts experts avoid": for each case the issue names, the search's first plan is a layout of the
kind a team runs (the published layout's kind, cited per case), or the output says why an unusual one wins:
"#1 vs best without CP" where #1 runs context parallelism (docs/validation.md#cpshort), "#1 vs best with EP"
with the bytes each GPU moves per step where #1 runs an MoE model without expert parallelism
(docs/validation.md#layout-audit). The real command runs; the checks read its JSON and its text."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import one_train_search

# (case, search arguments, the published layout and its source)
# The MoE cases pin the memory switches, the EP dispatcher and the EP overlap to the setting the free search
# picks (its "switches" JSON, 2026-12-07): the pinned search gives the same five plans in the same order, the
# same ties and the same explain keys (no with_ep, no without_cp), so what these tests check is unchanged; only
# the text's "switches:" lines go. The free searches ran 8-10 searches (15-25 CPU-s each), the pinned ones 1-2
# (2-6 CPU-s; tests/test_memory_switches.py, tests/test_search_deepep.py and tests/test_search_ep_overlap.py
# search those settings). The dense cases stay free.
MOE_PINS = "--grad-dtype bf16 --no-fp8-params --moe-dispatcher"
CASES = {
    # Llama 3 (Dubey et al. 2024, arXiv:2407.21783) Section 3.3.2 / Table 4: 405B pre-trained at 8,192 tokens
    # with tp8 cp1 pp16 on 16,384 H100; Section 3.4.1: the initial stage ran 4M-token batches of 4,096 tokens.
    "llama-405b-4k": ("-m llama-3.1-405b --hardware dgx-h100 --nodes 128 --seq-len 4096 --global-batch 1024",
                      {"cp": 1}),
    "llama-405b-16m": ("-m llama-3.1-405b --hardware dgx-h100 --nodes 2048 --seq-len 8192 --batch-tokens 16M",
                       {"cp": 1}),
    # Megatron-Bridge docs/performance-summary.md (25.09, 25.11): Qwen3-235B-A22B on 256 H100, 4,096 tokens,
    # tp2 pp8 ep32 vpp4, global batch 2048 (benchmarks/data: mbridge-25.09-...-qwen3-235b-a22b-...-h100-256gpu).
    "qwen3-235b-4k": ("-m qwen3-235b-a22b --hardware dgx-h100 --nodes 32 --seq-len 4096 --global-batch 2048 "
                      f"{MOE_PINS} deepep --moe-flex-backend deepep --ep-comm-overlap",
                      {"cp": 1, "ep_min": 2}),
    # NVIDIA/NeMo issue 9031: Mixtral-8x22B on DGX H100 with tp4 pp8 and EP (EP faster than without); NeMo's
    # recipes run it with Megatron's TP/PP/EP, no CP at 4K.
    "mixtral-8x22b-4k": ("-m mixtral-8x22b --hardware dgx-h100 --nodes 32 --seq-len 4096 --global-batch 1024 "
                         f"{MOE_PINS} alltoall --ep-comm-overlap",
                         {"cp": 1, "ep_min": 2}),
    # Smith et al. 2022 (MT-NLG, arXiv:2201.11990) Section 2.3: tp8 pp35 on 280-420 DGX A100, global batch
    # 1920 of 2,048 tokens.
    "mtnlg-530b-2k": ("-m gpt-529.6b --hardware dgx-a100 --nodes 280 --seq-len 2048 --global-batch 1920",
                      {"cp": 1, "tp": 8}),
    # Megatron-Bridge docs/performance-summary.md (25.09-26.08): DeepSeek-V3 on 256 GB200, 4,096 tokens,
    # tp1 pp4 ep64 vpp4, global batch 4096; DeepSeek-V3 report (arXiv:2412.19437) Section 3.2: EP64, ZeRO-1.
    "deepseek-v3-gb200": ("-m deepseek-v3 --hardware gb200-nvl72 --nodes 64 --seq-len 4096 --global-batch 4096 "
                          f"{MOE_PINS} deepep --moe-flex-backend hybridep --no-ep-comm-overlap",
                          {"cp": 1, "ep_min": 2}),
}


_SEARCHES: dict[str, tuple[dict[str, Any], str]] = {}
"""Each case's search, run once for the module: its JSON document and its text output (of one search)."""


def _search(cli: Any, case: str) -> tuple[dict[str, Any], str]:
    if case not in _SEARCHES:
        args = CASES[case][0].split()
        with one_train_search():  # the text renders the JSON's search result: one search, not two
            j, text = cli("search", *args, "--json"), cli("search", *args)
        assert j.code == 0 and text.code == 0, j.err or text.err
        _SEARCHES[case] = (j.json(), text.out)
    return _SEARCHES[case]


def _unusual(plan: dict[str, Any], usual: dict[str, int]) -> list[str]:
    """The ways #1 departs from the published layout's kind: 'cp' (runs CP where the team did not), 'ep' (an MoE
    model at ep 1), 'tp' (another TP degree), 'pp' (stages of fewer than 4 layers)."""
    out = []
    if plan["cp"] > usual.get("cp", plan["cp"]):
        out.append("cp")
    if plan["ep"] < usual.get("ep_min", 1):
        out.append("ep")
    if "tp" in usual and plan["tp"] != usual["tp"]:
        out.append("tp")
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_first_plan_is_the_published_kind_or_the_output_says_why(cli, case):
    d, out = _search(cli, case)
    first = d["plans"][0]["plan"]
    unusual = _unusual(first, CASES[case][1])
    assert all(len(line) <= 80 for line in out.splitlines())
    if "cp" in unusual:  # CP where the team ran none: the line naming the best plan without it, and its JSON
        assert "vs_without_cp" in d["explain"] and "without_cp" in d
        assert "#1 vs best without CP" in out
    if "ep" in unusual:  # an MoE model at ep 1: the best EP plan and the bytes each moves per GPU per step
        assert "vs_with_ep" in d["explain"] and d["with_ep"]["plan"]["ep"] > 1
        flat = " ".join(out.split())
        assert "#1 vs best with EP" in flat and "per GPU per step" in flat
    assert "tp" not in unusual, first


def test_deep_pipelines_of_two_layers_are_not_first_at_16m_tokens(cli):
    # the case: 64 stages of two layers for the 405B at 16M tokens on 16k H100; Llama 3 ran pp16
    d, _ = _search(cli, "llama-405b-16m")
    assert 126 / d["plans"][0]["plan"]["pp"] >= 4, d["plans"][0]["plan"]


@pytest.mark.parametrize("case", ["qwen3-235b-4k", "mixtral-8x22b-4k", "deepseek-v3-gb200"])
def test_ep_line_only_where_first_plan_runs_an_moe_model_at_ep_1(cli, case):
    # the "best with EP" line and key explain only an MoE model at ep 1 in first place; silent where #1 runs EP
    d, out = _search(cli, case)
    at_ep1 = d["plans"][0]["plan"]["ep"] == 1
    assert ("with_ep" in d) == at_ep1 and ("vs_with_ep" in d["explain"]) == at_ep1
    assert ("#1 vs best with EP" in " ".join(out.split())) == at_ep1


def test_zero3_holds_the_whole_layer_in_use():
    # DeepSpeed's fetch_sub_module gathers every parameter of the module it runs; stage3_max_live_parameters
    # (1e9) caps only the prefetch (microsoft/DeepSpeed runtime/zero/partitioned_param_coordinator.py); FSDP2's
    # fully_shard gathers the whole module. DeepSeek-V3 at ep 1: a layer holds all 256 experts (about 1.1e10
    # parameters from its published config: 58 MoE layers of 256 x 3 x 7168 x 2048), so ZeRO-3's gathered
    # weights are at least one layer in bf16, far above the cap's 2 GB.
    from llmplan.estimate import estimate_training
    from llmplan.specs.plan import ClusterSpec, ParallelPlan
    from llmplan.specs.registry import builtin_models, builtin_systems

    m = builtin_models()["deepseek-v3"]
    cluster = ClusterSpec(system=builtin_systems()["gb200-nvl72"], num_nodes=64)
    plan = ParallelPlan(tp=1, pp=1, dp=256, zero=3, recompute="full", micro_batch=8, global_batch=4096,
                        seq_len=4096)
    e = estimate_training(m, cluster, plan)
    expert_layer = 256 * 3 * 7168 * 2048
    assert float(e.memory.other) > 2 * expert_layer  # bf16: two bytes per parameter


@pytest.mark.parametrize("case", ["qwen3-235b-4k", "deepseek-v3-gb200"])
def test_tied_moe_plans_put_expert_parallelism_first(cli, case):
    # Qwen3-235B on 256 H100 and DeepSeek-V3 on 256 GB200: dp-only ZeRO-3 (every expert gathered to every GPU
    # each micro-batch, 2.5-3x the bytes per GPU) is predicted within the model's resolution of the best EP
    # plan; every published run of either model uses EP (the sources in CASES), and so does the first plan.
    first = _search(cli, case)[0]["plans"][0]["plan"]
    assert first["ep"] > 1, first


def test_decide_prefers_ep_to_zero3_gathering_every_expert():
    from types import SimpleNamespace

    from llmplan.search.ties import decide

    def est(ep: int, zero: int, moe: bool = True) -> SimpleNamespace:
        plan = SimpleNamespace(tp=1, pp=1 if ep == 1 else 4, dp=8, cp=1, ep=ep, vpp=1, zero=zero, recompute="none")
        return SimpleNamespace(plan=plan, model=SimpleNamespace(is_moe=moe),
                               cluster=SimpleNamespace(system=SimpleNamespace(domain_gpus=8)),
                               memory=SimpleNamespace(total=40 * 2**30, capacity=80 * 2**30))  # both fit

    assert decide(est(1, 3), est(8, 1)) == (1, "experts kept on their EP ranks, not gathered by ZeRO-3 each "
                                              "micro-batch")
    assert decide(est(8, 1), est(1, 3))[0] == -1
    assert decide(est(1, 1), est(8, 1))[1].startswith("fewer parallel axes")  # ZeRO-1 gathers nothing per step


def test_with_ep_line_gives_each_plans_bytes_and_the_tie_rule_only_when_tied():
    # Qwen3-30B-A3B on 4 DGX H100: dp-only ZeRO-3 at ep 1 (the search's #1 at 256 x 4K when this was written)
    # against an EP plan; the line names the bytes each moves per GPU per step, over dp and over ep
    from llmplan.estimate import estimate_training
    from llmplan.report.search import with_ep_line
    from llmplan.specs.plan import ClusterSpec, ParallelPlan
    from llmplan.specs.registry import builtin_models, builtin_systems

    m = builtin_models()["qwen3-30b-a3b"]
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=4)
    base = dict(tp=1, global_batch=256, seq_len=4096)
    a = estimate_training(m, cluster, ParallelPlan(pp=1, dp=32, zero=3, recompute="full", micro_batch=4, **base))
    b = estimate_training(m, cluster, ParallelPlan(pp=2, dp=16, ep=2, vpp=8, zero=1, micro_batch=1, **base))
    gb = {k: float(e.comm.axes[k].bytes) / 1e9 for k, e in (("dp", a), ("ep", b))}
    line = with_ep_line(a, b)
    assert line.startswith("#1 vs best with EP (tp1 pp2 dp16 ep2 vpp8 zero1 none mb1): ")
    assert f"#1's ZeRO-3 moves {float(a.comm.bytes) / 1e9:,.0f} GB (dp {gb['dp']:,.0f})" in line
    assert f"it {float(b.comm.bytes) / 1e9:,.0f} GB (ep {gb['ep']:,.0f})" in line
    assert "tied" not in line  # no resolution given
    # the tie rule is named only where #1 is the slower of the two: in exactly one order of a pair
    tied = ["#1 first: the rule" in with_ep_line(x, y, 1.0, "the rule") for x, y in ((a, b), (b, a))]
    assert sorted(tied) == [False, True]
    assert "tied" not in with_ep_line(a, b, 1e-6, "the rule")  # outside the resolution: not tied


def test_zero3_gathering_every_expert_is_not_first_through_a_third_tied_plan(cli):
    # Qwen3-30B-A3B on 4 DGX H100: dp-only ZeRO-3, a plan on fewer axes than the EP plan and the EP plan all
    # tied; pairwise, ZeRO-3 beats the middle plan on fewer axes, the middle plan beats the EP plan, and the EP
    # plan beats ZeRO-3, so an insertion by neighbours alone left ZeRO-3 first (docs/validation.md#tie-order).
    # Since DeepEP with the EP overlap prices the EP layouts about 13% faster (the free search's pick,
    # 2026-12-07), no ZeRO-3 plan comes within the resolution there and the old command tested nothing
    # (docs/validation.md#tidy-70). The all-to-all dispatcher without the EP overlap brings dp32 ZeRO-3 back
    # (418,552 tok/s against the fastest 427,607), and --tp 1 keeps the middle layout's tp2 / tp4 copies out of
    # the 5-layout tie pool, so the pp2 dp16 ep2 layout is in it: the tie is asserted before the order.
    from llmplan.estimate import estimate_training
    from llmplan.search.ties import TIE_POOL, decide
    from llmplan.specs.plan import ClusterSpec, ParallelPlan
    from llmplan.specs.registry import builtin_models, builtin_systems

    r = cli("search", "-m", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "4", "--seq-len", "4096",
            "--global-batch", "256", "--grad-dtype", "bf16", "--no-fp8-params", "--moe-dispatcher", "alltoall",
            "--no-ep-comm-overlap", "--tp", "1", "--top", str(TIE_POOL), "--json")
    assert r.code == 0, r.err
    rows = r.json()["plans"]
    m = builtin_models()["qwen3-30b-a3b"]
    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=4)
    est = [estimate_training(m, cluster, ParallelPlan(**row["plan"])) for row in rows]  # JSON null backend: default
    gathers = [k for k, e in enumerate(est) if e.plan.ep == 1 and e.plan.zero >= 3]
    eps = [k for k, e in enumerate(est) if e.plan.ep > 1]
    # the tie: every pool row tied with every other, a gatherer and an EP plan among them, and a middle plan
    # (ep 1, ZeRO 0-2) closing the cycle of pairwise decisions
    assert all(sorted(row["tied_with"]) == [k for k in range(1, TIE_POOL + 1) if k != i]
               for i, row in enumerate(rows, 1)), [row["tied_with"] for row in rows]
    assert gathers and eps, [e.plan.describe() for e in est]
    z, e = gathers[0], eps[0]
    middle = [k for k, x in enumerate(est) if x.plan.ep == 1 and x.plan.zero < 3
              and decide(est[z], x)[0] < 0 and decide(x, est[e])[0] < 0]
    assert middle, [x.plan.describe() for x in est]
    assert decide(est[e], est[z]) == (-1, "experts kept on their EP ranks, not gathered by ZeRO-3 each micro-batch")
    # the order: the gatherer below the middle and the EP plan, so not first
    assert z > max(e, middle[0]) and rows[0]["plan"]["zero"] < 3, [x.plan.describe() for x in est]
