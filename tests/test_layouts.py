"""Custom pipeline layouts (Megatron-LM --pipeline-model-parallel-layout) and training past
max_position_embeddings (issue 39)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmplan.cost.memory import activation_bytes, inflight_microbatches, stage_memory
from llmplan.cost.params import layout_grid, rank_params, stage_layers
from llmplan.cost.schedule import makespan, pipeline_schedule
from llmplan.errors import LlmplanError
from llmplan.specs.layout import balanced_layout, format_layout, parse_layout
from llmplan.specs.check import check_plan
from llmplan.specs.stages import layout_problem as _layout_problem
from llmplan.specs.plan import MemoryAllowance, ParallelPlan
from llmplan.specs.registry import builtin_models

# Megatron-Bridge's DeepSeek-V3 H100 performance recipe: PP 8, VPP 4 (src/megatron/bridge/perf_recipes/deepseek/
# h100/deepseek_v3.py at 067f987, set_deepseek_v3_pipeline_model_parallel_layout(cfg.model, "Et|(tt|)*30mL")).
DSV3_PP8_VPP4 = "Et|(tt|)*30mL"
DSV3_ARGS = ("--model", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "128", "--tp", "2", "--pp", "8",
             "--ep", "64", "--etp", "1", "--global-batch", "8192", "--zero", "1", "--recompute", "full")


# --- the layout string ------------------------------------------------------------------------------------------

def test_megatron_documented_examples_parse():
    # Megatron-LM docs/user-guide/features/pipeline_parallel_layout.md (d98e8a6): "Et*3|(tt|)*29,m|L" with PP16
    # VPP2 gives PP rank 0 VPP 0 embedding + 3 decoders, VPP 1 two decoders; ranks 1-13 two and two; rank 14
    # two then the MTP layer; rank 15 two then the loss.
    chunks = parse_layout("Et*3|(tt|)*29,m|L")
    assert len(chunks) == 32
    grid = layout_grid(ParallelPlan(pp=16, vpp=2, pp_layout=chunks))
    assert grid[0] == ["Ettt", "tt"]
    assert all(grid[i] == ["tt", "tt"] for i in range(1, 14))
    assert grid[14] == ["tt", "m"] and grid[15] == ["tt", "L"]
    # parse_str_to_list's docstring: "Ettt|(tt|)*29,m|L" -> [E,t,t,t] + [t,t]*29 + [m], [L]
    assert parse_layout("Ettt|(tt|)*29,m|L") == ("Ettt",) + ("tt",) * 29 + ("m", "L")
    assert parse_layout("E||t|L") == ("E", "", "t", "L")  # the docs' empty stage
    # The docstring's unrolling examples: xy(ab|cd|ef)*2,pq -> xyab|cd|efab|cd|efpq (symbols E/t/m/L here)
    assert parse_layout("Et(tt|t|m)*2,L") == ("Ettt", "t", "mtt", "t", "mL")


@pytest.mark.parametrize("text", ["Et*3|(tt|)*29,m|L", "E||t|L", "Et*4|(t*4|)*14tmL", DSV3_PP8_VPP4,
                                  "Et*4|(tttt|)*14tmL", "EtL", "(|)*3,EtL"])
def test_format_round_trips(text):
    chunks = parse_layout(text)
    assert parse_layout(format_layout(chunks)) == chunks


@given(st.lists(st.text(alphabet="EtmL", max_size=6), min_size=1, max_size=40))
def test_format_round_trips_any_chunks(chunks):
    assert parse_layout(format_layout(chunks)) == tuple(chunks)


@pytest.mark.parametrize("text,needle", [("Et|x|L", "unknown symbol(s) x"), ("Et|(tt|)*99999999,L", "unroll")])
def test_bad_strings_are_one_line(text, needle):
    with pytest.raises(LlmplanError) as err:
        parse_layout(text)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_balanced_layout_is_megatron_bridges_for_deepseek_pp8_vpp4():
    assert balanced_layout(61, 8, 4, 1) == parse_layout(DSV3_PP8_VPP4)


@given(st.integers(1, 130), st.integers(1, 16), st.integers(1, 6), st.sampled_from(["llama-3.1-8b", "deepseek-v3"]))
def test_balanced_layouts_keep_megatrons_rules(L, pp, vpp, name):
    m = builtin_models()[name]
    m = m.model_copy(update={"num_hidden_layers": L, "first_k_dense_replace": min(m.first_k_dense_replace, L)})
    chunks = balanced_layout(L, pp, vpp, m.num_nextn_predict_layers)
    plan = ParallelPlan(pp=pp, vpp=vpp, global_batch=pp * 4, pp_layout=chunks)
    assert _layout_problem(m, plan) is None
    counts = [c.count("t") for c in chunks]
    assert max(counts) - min(counts[1:-1] or counts) <= 1 if len(counts) > 2 else True


# --- estimate ---------------------------------------------------------------------------------------------------

def test_deepseek_v3_pp8_vpp4_layout_is_accepted(cli):
    r = cli("estimate", *DSV3_ARGS, "--pp-layout", DSV3_PP8_VPP4, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["plan"]["vpp"] == 4 and doc["plan"]["pp"] == 8  # vpp inferred from 32 chunks / pp 8
    # chunk k on rank k mod 8: rank 0 holds "Et" + 3 x "tt" = 7 layers, rank 7 3 x "tt" + "mL" = 6, others 8
    assert doc["stage_layers"] == [7, 8, 8, 8, 8, 8, 8, 6]
    assert doc["plan"]["pp_layout"][0] == "Et" and doc["plan"]["pp_layout"][-1] == "mL"
    text = cli("estimate", *DSV3_ARGS, "--pp-layout", DSV3_PP8_VPP4)
    assert text.code == 0 and "32 virtual chunks (pp 8 x vpp 4)" in text.out
    assert max(len(line) for line in text.out.splitlines()) <= 80


def test_balanced_layout_from_the_command_line(cli):
    r = cli("estimate", *DSV3_ARGS, "--vpp", "4")  # 61 layers: no first/last split interleaves 4 ways on 8 stages
    assert r.code == 2 and "--pp-layout balanced" in r.err
    r = cli("estimate", *DSV3_ARGS, "--vpp", "4", "--pp-layout", "balanced", "--json")
    assert r.code == 0 and tuple(r.json()["plan"]["pp_layout"]) == parse_layout(DSV3_PP8_VPP4)
    r = cli("estimate", *DSV3_ARGS[:-6], "--pp-first-layers", "7", "--pp-last-layers", "6", "--vpp", "4",
            "--global-batch", "8192")
    assert r.code == 2 and '--pp-layout balanced (here "Et|(tt|)*30,mL")' in r.err


def test_layout_is_refused_beside_other_splits_and_vpp(cli):
    r = cli("estimate", *DSV3_ARGS, "--pp-layout", DSV3_PP8_VPP4, "--pp-layers", "7,8,8,8,8,8,8,6")
    assert r.code == 2 and "each set the pipeline split" in r.err
    r = cli("estimate", *DSV3_ARGS, "--pp-layout", DSV3_PP8_VPP4, "--vpp", "2")
    assert r.code == 2 and "has 32 chunks but pp x vpp is 8 x 2 = 16" in r.err and "use --vpp 4" in r.err


@pytest.mark.parametrize("layout,needle", [
    ("Et|(tt|)*30L", "holds 0 MTP layers (m) but deepseek-v3 trains 1 (num_nextn_predict_layers, or --mtp-layers); "
                      "put m before the final L"),
    ("Et|(tt|)*30mLL", "must end with the loss L and hold it once (it holds 2)"),
    ("t|(tt|)*30mLE", "must begin with the embedding E"),
    ("Et|(tt|)*29,tttmL", "has 31 chunks but pp x vpp is 8 x 4 = 32"),
    ("Et|(tt|)*29,t|mL", "holds 60 transformer layers (t) but deepseek-v3 has num_hidden_layers 61; add 1 t"),
    ("Et|(tt|)*29,tm|tL", "places a transformer layer (t) after an MTP layer (m)"),
    ("Et*5|(t*8|)*7,(|)*15,m|(|)*7,L", "puts MTP layers in chunk(s) 23"),
])
def test_bad_layouts_fail_with_one_line(cli, layout, needle):
    r = cli("estimate", *DSV3_ARGS, "--pp-layout", layout, "--vpp", "4")
    assert r.code == 2 and needle in r.err
    rule_lines = [line for line in r.err.splitlines() if "pp_layout" in line]
    assert len(rule_lines) == 1 and "Traceback" not in r.err


def test_check_plan_accepts_megatron_bridge_deepseek_layouts():
    # Megatron-Bridge perf recipes (067f987): GB300 PP2 VPP8 / PP4 VPP4 "Et*4|(t*4|)*14tmL", H100 PP8 VPP4.
    m = builtin_models()["deepseek-v3"]
    for pp, vpp, text in [(2, 8, "Et*4|(t*4|)*14tmL"), (4, 4, "Et*4|(t*4|)*14tmL"), (8, 4, DSV3_PP8_VPP4)]:
        plan = ParallelPlan(pp=pp, vpp=vpp, dp=8, ep=8, etp=1, global_batch=64, pp_layout=parse_layout(text))
        assert check_plan(m, plan) == []


# --- memory per stage -------------------------------------------------------------------------------------------

LLAMA70 = builtin_models()["llama-3.1-70b"]
# Llama 3.1 70B (hidden 8192, FFN 28672, 64 heads of 128, 8 KV heads; Meta's config.json): one layer's weights
# are q and o (2 x 8192^2), k and v (2 x 8192 x 1024) and the gated MLP (3 x 8192 x 28672); TP 8 shards them
# and replicates the two RMSNorm weights (2 x 8192).
LAYER_PARAMS_TP8 = (2 * 8192 ** 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672) / 8 + 2 * 8192


def _llama_plan(layout: str, **kw) -> ParallelPlan:
    return ParallelPlan(tp=8, pp=4, vpp=5, dp=1, sp=True, zero=1, global_batch=32, pp_layout=parse_layout(layout), **kw)


def test_stage_weights_follow_the_layout_layer_counts():
    # chunk k on rank k mod 4: rank 1 gets 3 + 4 x 4, rank 2 5 + 3 x 4 + 5, rank 3 4 + 3 x 4 + 3
    plan = _llama_plan("Et*4|t*3|t*5|t*4|" + "(t*4|t*4|t*4|t*4|)*3," + "t*4|t*4|t*5|t*3L")
    counts = [stage_layers(LLAMA70, plan, i)[0] for i in range(4)]
    assert counts == [20, 19, 22, 19]
    rp = [float(rank_params(LLAMA70, plan, i).total) for i in range(4)]
    assert rp[2] - rp[1] == pytest.approx(3 * LAYER_PARAMS_TP8, rel=1e-12)


def test_equal_chunk_layout_keeps_the_even_split_memory():
    even = ParallelPlan(tp=8, pp=4, vpp=5, dp=1, sp=True, zero=1, global_batch=32)
    lay = _llama_plan("Et*4|(t*4|)*18,t*4L")
    for i in range(4):
        a = stage_memory(LLAMA70, even, i, MemoryAllowance(), 80 * 2 ** 30)
        b = stage_memory(LLAMA70, lay, i, MemoryAllowance(), 80 * 2 ** 30)
        assert float(b.total) == pytest.approx(float(a.total), rel=1e-12)


def test_interleaved_peak_counts_the_chunks_in_flight():
    # Stage 0 warms up with 2(p-1) + (v-1)p + 1 = 22 chunk forwards: four rounds of chunk 0..3 for 4 micro-batches
    # and the first six of chunk 4; its heavy chunk placed first is in flight more often than placed last.
    heavy_first = _llama_plan("Et*8|t*4|t*4|t*4|" + "(t*4|t*4|t*4|t*4|)*3," + "t*0|t*4|t*4|t*4L")
    heavy_last = _llama_plan("Et*0|t*4|t*4|t*4|" + "(t*4|t*4|t*4|t*4|)*3," + "t*8|t*4|t*4|t*4L")
    assert stage_layers(LLAMA70, heavy_first, 0) == stage_layers(LLAMA70, heavy_last, 0) == (20, 0)
    first = float(activation_bytes(LLAMA70, heavy_first, 0).layers)
    last = float(activation_bytes(LLAMA70, heavy_last, 0).layers)
    even = float(activation_bytes(LLAMA70, _llama_plan("Et*4|(t*4|)*18,t*4L"), 0).layers)
    assert first > even > last
    # with equal chunks the walk over the schedule gives the closed form (Korthikanti et al. 2022, §4.2.3)
    per_layer = even / (20 * float(inflight_microbatches(heavy_first, 0)))
    assert per_layer * 20 * (2 * 3 + 4 * 4 + 1) / 5 == pytest.approx(even, rel=1e-12)


def test_most_loaded_stage_is_reported(cli):
    r = cli("estimate", *DSV3_ARGS, "--pp-layout", DSV3_PP8_VPP4, "--json")
    doc = r.json()
    m, plan = builtin_models()["deepseek-v3"], ParallelPlan(**doc["plan"])
    # the H100's compute capability 9.0 sets PyTorch's cuBLAS workspace (docs/formulas.md#mem.runtime)
    totals = [float(stage_memory(m, plan, i, MemoryAllowance(), doc["memory"]["capacity"],
                                 fp8_tn_only=True, compute_capability=9.0).total) for i in range(plan.pp)]
    assert doc["memory"]["stage"] == totals.index(max(totals))
    assert doc["memory"]["total"] == pytest.approx(max(totals), rel=1e-9)


# --- schedule and step time -------------------------------------------------------------------------------------

def test_even_chunk_shares_reproduce_the_default_schedule():
    f, b = [1.0, 1.2, 0.9, 1.1], [2.0, 2.4, 1.8, 2.2]
    even = [[0.5, 0.5]] * 4
    assert makespan(f, b, 8, 2, even) == pytest.approx(makespan(f, b, 8, 2), rel=1e-12)
    # Narayanan et al. 2021 §2.2: equal stages, interleaved over v: n(f+b) + (p-1)(f+b)/v
    assert makespan([1.0] * 4, [2.0] * 4, 8, 2, even) == pytest.approx(8 * 3 + 3 * 3 / 2)


@given(st.integers(2, 5), st.integers(1, 3), st.lists(st.floats(0.05, 1.0), min_size=15, max_size=15))
def test_unequal_chunks_respect_dependencies(p, rounds, draws):
    v, n = 3, p * rounds
    share = [[x / sum(draws[3 * i:3 * i + 3]) for x in draws[3 * i:3 * i + 3]] for i in range(p)]
    f = [1.0] * p
    b = [2.0] * p
    slots = pipeline_schedule(f, b, n, v, share)
    end = {(s.kind, s.stage, s.microbatch, s.chunk): s.end for s in slots}
    for s in slots:
        assert s.end - s.start == pytest.approx((f if s.kind == "forward" else b)[s.stage] * share[s.stage][s.chunk])
        if s.kind == "forward" and s.stage > 0:
            assert s.start >= end[("forward", s.stage - 1, s.microbatch, s.chunk)] - 1e-12
    assert max(s.end for s in slots) >= n * 3.0 - 1e-9  # no schedule beats the busiest stage's work


def test_layout_step_time_has_a_bubble_and_the_slowest_stage(cli):
    doc = cli("estimate", *DSV3_ARGS, "--pp-layout", DSV3_PP8_VPP4, "--json").json()
    t = doc["time"]
    assert t["bubble_s"] > 0 and t["step_s"] > t["compute_s"] + t["bubble_s"]


# --- export -----------------------------------------------------------------------------------------------------

def test_megatron_export_writes_the_layout(cli, tmp_path):
    plan = tmp_path / "ds.json"
    assert cli("estimate", *DSV3_ARGS, "--pp-layout", DSV3_PP8_VPP4, "--save", plan).code == 0
    assert cli("export", plan, "--to", "megatron", "-o", tmp_path / "out").code == 0
    script = (tmp_path / "out" / "megatron_pretrain.sh").read_text()
    flag = re.search(r'--pipeline-model-parallel-layout "([^"]+)"', script).group(1)
    chunks = parse_layout(flag)
    saved = tuple(json.loads(plan.read_text())["plan"]["pp_layout"])
    # MTP layers are written only where the script builds them (Megatron-LM: the layout's m count must equal
    # --mtp-num-layers, or be 0 without it)
    expect = saved if "--mtp-num-layers" in script else tuple(c.replace("m", "") for c in saved)
    assert chunks == expect and len(chunks) == 32
    assert "--num-layers-per-virtual-pipeline-stage" not in script and "--num-virtual-stages" not in script
    r = cli("export", plan, "--to", "torchtitan", "-o", tmp_path / "tt")
    assert r.code == 2 and not (tmp_path / "tt").exists()
    # the report draws the layout's chunks (each its own share of the stage's time)
    assert cli("report", plan, "-o", tmp_path / "r.html").code == 0
    values = re.search(r'<figure id="schedule" data-values="([^"]+)"', (tmp_path / "r.html").read_text()).group(1)
    assert json.loads(values.replace("&quot;", '"'))["vpp"] == 4


def test_torchtitan_refuses_chunks_without_a_layer(tmp_path):
    from llmplan.export.common import CannotExpress
    from llmplan.export.torchtitan import _check_layout
    from llmplan.planfile import PlanFile

    pf = PlanFile.__new__(PlanFile)
    object.__setattr__(pf, "plan", _llama_plan("Et*4|(t*4|)*18,t*4|L".replace("t*4|L", "t*4L")))
    _check_layout(pf, "torchtitan")  # every chunk holds a layer
    object.__setattr__(pf, "plan", ParallelPlan(tp=8, pp=4, vpp=2, dp=1, sp=True, global_batch=32,
                                                pp_layout=parse_layout("E|(t*16|)*5,t*0|L")))
    with pytest.raises(CannotExpress, match="chunk.s. 0, 6, 7 without a transformer layer"):
        _check_layout(pf, "torchtitan")


# --- training past max_position_embeddings ----------------------------------------------------------------------

# Qwen3-235B-A22B's config.json: max_position_embeddings 40960; Qwen's model card extends it to 131,072 tokens
# with YaRN (factor 4 over its 32,768 native context). Long-context training runs at 64k-128k.
QWEN_LONG = ("--model", "qwen3-235b-a22b", "--hardware", "dgx-h100", "--nodes", "64", "--tp", "4", "--pp", "2",
             "--cp", "8", "--ep", "8", "--etp", "1", "--seq-len", "131072", "--global-batch", "64", "--zero", "1",
             "--recompute", "full")


def test_training_past_max_position_embeddings_is_accepted_with_a_note(cli, tmp_path):
    r = cli("estimate", *QWEN_LONG)
    assert r.code == 0, r.err
    assert "note: seq_len 131,072 > max_position_embeddings 40,960 of qwen3-235b-a22b" in r.out
    doc = cli("estimate", *QWEN_LONG, "--json").json()
    assert doc["context_extension"]["factor"] == pytest.approx(131072 / 40960)
    assert "context_extension" not in cli("estimate", *QWEN_LONG[:-6], "--seq-len", "32768", "--json").json()
    plan = tmp_path / "long.json"
    assert cli("estimate", *QWEN_LONG, "--save", plan).code == 0
    assert cli("export", plan, "--to", "megatron", "-o", tmp_path / "out").code == 0
    script = (tmp_path / "out" / "megatron_pretrain.sh").read_text()
    for flag in ("--position-embedding-type yarn", "--yarn-original-max-position-embeddings 40960",
                 "--rotary-scaling-factor 3.2", "--max-position-embeddings 131072", "--seq-length 131072"):
        assert flag in script


def test_serving_past_max_position_embeddings_stays_refused(cli):
    r = cli("estimate", "--mode", "infer", "--model", "qwen3-235b-a22b", "--hardware", "dgx-h100", "--nodes", "4",
            "--tp", "8", "--pp", "2", "--input-len", "100000", "--output-len", "1000")
    assert r.code == 2
    assert "input_len + output_len (100000 + 1000 = 101000) exceeds max_position_embeddings (40960)" in r.err


def test_learned_positions_cannot_extend(cli):
    # GPT-3 175B: learned absolute positions, 2048 of them (Brown et al. 2020, Table 2.1 n_ctx)
    r = cli("estimate", "--model", "gpt3-175b", "--hardware", "dgx-h100", "--nodes", "64", "--tp", "8", "--pp", "8",
            "--seq-len", "4096")
    assert r.code == 2 and "learned position embeddings hold one row per position" in r.err


def test_megatron_refuses_a_second_rope_scaling(cli, tmp_path):
    # DeepSeek-V3's MLA already runs YaRN over its 163,840 positions (config.json rope_scaling): the export does
    # not stack another scaling on it
    plan = tmp_path / "ds-long.json"
    r = cli("estimate", "--model", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "128", "--tp", "8", "--pp",
            "16", "--cp", "8", "--ep", "8", "--etp", "1", "--pp-first-layers", "3", "--pp-last-layers", "2",
            "--seq-len", "262144", "--global-batch", "16", "--zero", "1", "--recompute", "full", "--save", plan)
    assert r.code == 0, r.err
    r = cli("export", plan, "--to", "megatron", "-o", tmp_path / "out")
    assert r.code == 2 and "already scales RoPE (MLA YaRN" in r.err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [
    ("--pp", "8", "--vpp", "3", "--pp-layout", "balanced", "--global-batch", "12"),  # a balanced layout, 12 of 8
    ("--pp", "4", "--vpp", "3", "--global-batch", "10"),  # the even split, 5 micro-batches of 4 stages
])
def test_a_partial_last_group_of_micro_batches_is_one_clear_error(cli, args):
    # Megatron-Core's interleaved schedule raises when the last group of pp micro-batches is partial
    # (pipeline_parallel/schedules.py at d98e8a6); the schedule simulation deadlocked on these plans and
    # `estimate` printed "internal error: RuntimeError: pipeline schedule deadlocked".
    r = cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", *args)
    assert r.code == 2 and "whole number of groups of pp" in r.err and "internal error" not in r.err, r.err


# gpt-1.7b has 24 layers: eight chunks of three on pp 4 interleave two ways (issue 35).
EIGHT_CHUNKS = "Et*3|t*3|t*3|t*3|t*3|t*3|t*3|t*3L"
GPT_PP4 = ("--model", "gpt-1.7b", "--hardware", "dgx-h100", "--nodes", "1", "--pp", "4", "--dp", "2",
           "--micro-batch", "1")


def test_an_explicit_vpp_1_beside_a_layout_is_checked_not_replaced(cli):
    r = cli("estimate", *GPT_PP4, "--global-batch", "8", "--pp-layout", EIGHT_CHUNKS, "--json")
    assert r.code == 0, r.err
    assert r.json()["plan"]["vpp"] == 2  # not given: chunks / pp, as Megatron-LM infers it
    r = cli("estimate", *GPT_PP4, "--global-batch", "8", "--pp-layout", EIGHT_CHUNKS, "--vpp", "1")
    assert r.code == 2 and "has 8 chunks but pp x vpp is 4 x 1 = 4" in r.err and "use --vpp 2" in r.err


def test_partial_microbatch_group_fix_fits_the_split(cli):
    # 6 / (1 x 2) = 3 micro-batches: not a whole group of pp 4. Without a layout --vpp 1 is the way out; with
    # one, the layout sets vpp, so the way out is a layout of one chunk per stage.
    r = cli("estimate", *GPT_PP4, "--global-batch", "6", "--vpp", "2")
    assert r.code == 2 and "or do not interleave: --vpp 1" in r.err
    r = cli("estimate", *GPT_PP4, "--global-batch", "6", "--pp-layout", EIGHT_CHUNKS)
    assert r.code == 2 and "give a --pp-layout of pp (4) chunks, one per stage" in r.err and "--vpp 1" not in r.err
    r = cli("estimate", *GPT_PP4, "--global-batch", "6", "--pp-layout", "Et*5|t*6|t*6|t*7L")
    assert r.code == 0, r.err  # the fix it names runs


def test_one_micro_batch_is_singular(cli):
    r = cli("estimate", "--model", "gpt-1.7b", "--hardware", "dgx-h100", "--nodes", "1", "--global-batch", "8",
            "--micro-batch", "1")
    assert r.code == 0 and "1 micro-batch per replica" in " ".join(r.out.split())
    r = cli("estimate", "--model", "gpt-1.7b", "--hardware", "dgx-h100", "--nodes", "1", "--global-batch", "16",
            "--micro-batch", "1")
    assert r.code == 0 and "2 micro-batches per replica" in " ".join(r.out.split())
