"""The pipeline-schedule timeline that `llmplan report` draws (llmplan/cost/schedule.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmplan.cost.schedule import pipeline_schedule, stage_order


def makespan(slots):
    return max(s.end for s in slots)


def test_equal_stages_match_the_published_bubble():
    # Narayanan et al. 2021 §2.2: with equal stages, 1F1B takes (n + p - 1)(f + b) and interleaving over v chunks
    # shrinks the bubble to (p - 1)(f + b) / v (n a multiple of p).
    for p, n, v in [(4, 8, 1), (4, 8, 2), (8, 16, 2), (4, 12, 3), (2, 2, 1), (1, 5, 1)]:
        f, b = 1.0, 2.0
        assert abs(makespan(pipeline_schedule([f] * p, [b] * p, n, v)) - (n * (f + b) + (p - 1) * (f + b) / v)) < 1e-9


def test_warm_up_counts():
    # Stage i of 1F1B warms up with p - i - 1 forwards; interleaved with 2(p - i - 1) + (v - 1)p.
    order = stage_order(4, 8, 1, 1)
    assert [k for k, _, _ in order[:3]] == ["forward", "forward", "forward"] and order[3][0] == "backward"
    order = stage_order(4, 8, 2, 0)
    assert all(k == "forward" for k, _, _ in order[:10]) and order[11][0] == "backward"


@given(st.integers(1, 6), st.integers(1, 12), st.lists(st.floats(0.1, 5.0), min_size=6, max_size=6))
def test_slots_respect_order_and_dependencies(p, n, times):
    f = times[:p]
    b = [2 * x for x in f]
    slots = pipeline_schedule(f, b, n)
    assert len(slots) == 2 * p * n
    end = {(s.kind, s.stage, s.microbatch): s.end for s in slots}
    for s in slots:
        if s.kind == "forward" and s.stage > 0:
            assert s.start >= end[("forward", s.stage - 1, s.microbatch)] - 1e-12
        if s.kind == "backward":
            prior = ("backward", s.stage + 1, s.microbatch) if s.stage < p - 1 else ("forward", s.stage, s.microbatch)
            assert s.start >= end[prior] - 1e-12
    for i in range(p):  # a stage runs one slot at a time
        mine = sorted((s for s in slots if s.stage == i), key=lambda s: s.start)
        assert all(a.end <= c.start + 1e-12 for a, c in zip(mine, mine[1:]))
    # The step-time model's closed form n·max + Σ − max bounds the 1F1B makespan from above, and no schedule
    # beats n micro-batches on the slowest stage.
    per = [x + y for x, y in zip(f, b)]
    assert n * max(per) - 1e-9 <= makespan(slots) <= n * max(per) + sum(per) - max(per) + 1e-9


# Zero-bubble and DualPipe schedules (DeepSeek-V3 technical report, Table 2): with F the forward and B the
# backward of a micro-batch on a stage and W = B/2 its weight-gradient half, the bubble is
# 1F1B (p-1)(F+B), ZB1P (p-1)(F+B-2W), DualPipe (p/2-1)(F&B+B-3W) with F&B = F+B; DualPipe holds twice the
# parameters and PP+1 micro-batches of activations, and hides the EP all-to-alls behind the paired batch.
def _schedules(model="llama-3.1-70b", system="dgx-h100", **kw):
    from llmplan.estimate import estimate_training
    from llmplan.specs.plan import ClusterSpec, ParallelPlan
    from llmplan.specs.registry import builtin_models, builtin_systems

    m, cluster = builtin_models()[model], ClusterSpec(system=builtin_systems()[system], num_nodes=8)
    base = dict(tp=8, pp=8, dp=1, sp=True, zero=1, global_batch=32, seq_len=4096, recompute="selective", **kw)
    return {s: estimate_training(m, cluster, ParallelPlan(**base, pp_schedule=s))
            for s in ("1f1b", "zero-bubble", "dualpipe")}


def test_zero_bubble_and_dualpipe_bubbles_follow_table_2():
    e = _schedules()
    sc = e["1f1b"].time.stage
    F, B = float(sc.forward), float(sc.total - sc.forward)
    W, p = B / 2, 8
    base = float(e["1f1b"].time.bubble)
    assert float(e["zero-bubble"].time.bubble) == pytest.approx(base * (F + B - 2 * W) / (F + B), rel=1e-9)
    assert float(e["dualpipe"].time.bubble) == pytest.approx(base * (p / 2 - 1) * (F + 2 * B - 3 * W)
                                                             / ((p - 1) * (F + B)), rel=1e-9)
    assert float(e["dualpipe"].time.bubble) < float(e["zero-bubble"].time.bubble) < base


def test_dualpipe_memory_and_ep_overlap():
    e = _schedules()
    one, dual = e["1f1b"].memory, e["dualpipe"].memory
    # each rank holds stages i and pp-1-i (deepseek-ai/DualPipe): rank 0 the embedding and the output layer
    from llmplan.cost.params import rank_params
    from llmplan.specs.registry import builtin_models

    plan, m = e["dualpipe"].plan, builtin_models()["llama-3.1-70b"]
    pair = rank_params(m, plan, 0).total + rank_params(m, plan, plan.pp - 1).total
    assert float(dual.params_on_rank) == pytest.approx(float(pair), rel=1e-12)
    assert float(dual.optimizer) == pytest.approx(2 * float(one.optimizer), rel=1e-3)  # two stages' params
    # PP + 1 stage-micro-batches of activations on a rank (Table 2), 1F1B's first stage PP (equal stages here)
    p = plan.pp
    assert float(dual.activation_parts.layers) == pytest.approx(float(one.activation_parts.layers) * (p + 1) / p,
                                                                rel=1e-12)
    moe = _schedules(model="mixtral-8x7b", ep=8, etp=1)
    assert float(moe["dualpipe"].time.exposed["ep"]) < float(moe["1f1b"].time.exposed["ep"])


def test_dualpipe_rank_holds_a_tied_embedding_once_and_every_rank_pp_plus_one_stage_batches():
    # DeepSeek-V3 report §3.2.3: with DualPipe the embedding and the output head sit on one rank, which shares
    # them physically; Table 2: PP + 1 micro-batches of activations per rank, middle ranks included
    # (DualPipe.step: pp - i forwards of stage i and i + 1 of stage pp-1-i before the first backward of stage i).
    from llmplan.cost.memory import stage_memory
    from llmplan.cost.params import padded_vocab, rank_params
    from llmplan.specs.plan import MemoryAllowance, ParallelPlan
    from llmplan.specs.registry import builtin_models

    m = builtin_models()["gpt3-175b"]
    assert m.tie_word_embeddings
    plan = ParallelPlan(tp=8, pp=8, dp=1, global_batch=32, seq_len=2048, recompute="full", pp_schedule="dualpipe")
    rank0 = stage_memory(m, plan, 0, MemoryAllowance(), 80 * 2**30)
    both = rank_params(m, plan, 0).total + rank_params(m, plan, 7).total
    assert float(rank0.params_on_rank) == pytest.approx(float(both) - padded_vocab(m.vocab_size, 8) * m.hidden_size / 8,
                                                        rel=1e-12)
    one = ParallelPlan(**{**plan.model_dump(), "pp_schedule": "1f1b"})
    per_stage_batch = float(stage_memory(m, one, 7, MemoryAllowance(), 1.0).activation_parts.layers)  # 1 in flight
    for i in (1, 3):
        held = stage_memory(m, plan, i, MemoryAllowance(), 1.0).activation_parts.layers
        assert float(held) == pytest.approx((plan.pp + 1) * per_stage_batch, rel=1e-12)


def test_schedule_rules_and_exports(cli, tmp_path):
    bad = cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--tp", "8",
              "--pp", "7", "--pp-schedule", "dualpipe", "--global-batch", "64")
    assert bad.code == 2 and "pp (7) must be even" in bad.err
    # DualPipe.step asserts num_chunks even and >= 2 x ranks (deepseek-ai/DualPipe, dualpipe/dualpipe.py)
    for gb in ("8", "17"):
        few = cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--tp", "8",
                  "--pp", "8", "--pp-schedule", "dualpipe", "--global-batch", gb)
        assert few.code == 2 and "even number of micro-batches per step, at least 2 x pp (8) = 16" in few.err
        assert f"gives {gb}" in few.err
        assert "make it an even number 16 or more with --global-batch or --micro-batch" in few.err
    inter = cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--tp", "8",
                "--pp", "8", "--vpp", "2", "--pp-schedule", "zero-bubble", "--global-batch", "64")
    assert inter.code == 2 and "one stage per rank" in inter.err
    plan = tmp_path / "zb.json"
    assert cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--tp", "8",
               "--pp", "8", "--zero", "1", "--pp-schedule", "zero-bubble", "--global-batch", "64",
               "--save", plan).code == 0
    r = cli("export", plan, "--to", "megatron", "-o", tmp_path / "out")
    assert r.code == 2 and "zero-bubble pipeline schedule" in r.err and not (tmp_path / "out").exists()
