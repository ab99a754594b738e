"""The published allocator peaks (benchmarks/data/allocator_logs.yaml) and their summary
(benchmarks/allocator_logs.py); docs/validation.md#allocator-logs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import allocator_logs as L  # noqa: E402

RECORDS = {r["id"]: r for r in L.load()}


@pytest.mark.parametrize("rid, published", [
    # NVIDIA/Megatron-LM issue 60: "after 5 iterations memory (MB) | allocated: 10250.5693359375 |
    # max allocated: 12606.06201171875 | reserved: 17482.0 | max reserved: 17482.0"
    ("mlm-issue60-gpt2-2.6b", 17482.0 / 12606.06201171875 - 1),
    # deepspeedai/DeepSpeed issue 3734, ZeRO-2: "current alloc=45.4646GB (delta=0.0000GB max=52.3739GB)
    # current cache=57.1406GB (delta=0.0000GB max=57.1406GB)"
    ("deepspeed-issue3734-13b-zero2", 57.1406 / 52.3739 - 1),
    # the same issue, ZeRO-3: "max=56.1189GB ... current cache=69.2051GB (delta=0.0000GB max=69.2051GB)"
    ("deepspeed-issue3734-13b-zero3", 69.2051 / 56.1189 - 1),
    # NeMo issue 14850, iteration 11: "max_memory_reserved: 57675874304 | max_memory_allocated: 53930270720"
    ("nemo2-qwen3-30b-a3b-issue14850", 57675874304 / 53930270720 - 1),
    # cloneofsimo/min-max-gpt PR 5: "Max Allocated / Max Reserved: 18706.66MB / 23816.00MB"
    ("min-max-gpt-pr5", 23816.00 / 18706.66 - 1),
])
def test_published_lines_read_as_quoted(rid: str, published: float) -> None:
    # Golden: each source's own numbers, 1e-5 relative (the data keeps the printed MiB to two decimals).
    assert L.measure(RECORDS[rid]).reserve == pytest.approx(published, rel=1e-5)


def test_a_record_is_read_at_its_largest_allocation() -> None:
    # The DeepSeek-V3 proxy baseline (Megatron-LM PR 1913's README): rank 0 has the largest max allocated,
    # 65203.93 MiB, with 74306 reserved; ranks 16 / 32 / 48 have 52228 / 45201 / 48166.
    m = L.measure(RECORDS["mlm-pr1913-dsv3-proxy-baseline"])
    assert m.max_allocated_gib == pytest.approx(65203.93 / 1024, rel=1e-9)
    assert m.reserve == pytest.approx(74306.0 / 65203.93 - 1, rel=1e-9)


def test_spread_by_stack_by_hand() -> None:
    # The three DeepSpeed-engine records, by hand: 9.10%, 23.32%, 27.31%.
    s = L.summarise([L.measure(r) for r in RECORDS.values()])["deepspeed"]
    assert s is not None and s.n == 3
    assert s.median == pytest.approx(69.2051 / 56.1189 - 1, rel=1e-6)
    assert s.low == pytest.approx(57.1406 / 52.3739 - 1, rel=1e-6)
    assert s.high == pytest.approx(23816.00 / 18706.66 - 1, rel=1e-6)


def test_records_are_well_formed() -> None:
    for rid, r in RECORDS.items():
        assert r["kind"] in ("url", "repo", "index"), rid
        assert r["stack"] in L.STACKS, rid
        assert r["unit"] in L.UNIT_BYTES, rid
        assert r["after_iterations"] >= 1, rid
        if r["kind"] == "url":
            assert r["source"].startswith("https://"), rid
        if r["kind"] == "repo":
            assert "@" in r["source"].split()[0], rid
        for line in r["lines"]:
            assert len(line) == 5, rid
            assert line[4] >= line[2], rid  # max reserved holds max allocated
            if line[1] is not None:
                assert line[2] >= line[1], rid
        if "max_inactive" in r:
            assert len(r["max_inactive"]) == len(r["lines"]), rid


def test_a_line_without_an_activation_peak_is_excluded() -> None:
    # max allocated within 1 MiB of allocated at every rank: the step's peak is not in the line (reset, or
    # never above the steady state); such records are kept out, and only those are for that reason.
    for rid, r in RECORDS.items():
        flat = all(line[1] is not None and (line[2] - line[1]) * L.UNIT_BYTES[r["unit"]] < 2**20
                   for line in r["lines"])
        assert flat == ("within 1 MiB" in r.get("excluded", "")), rid


def test_megatron_core_reserve_is_not_one_constant() -> None:
    # What kept the allowance unchanged: the Megatron-Core records sized like the fit records (>= 2 iterations,
    # peak >= 40 GiB) span more than a factor of 10 (dense Megatron-Core r0.8 GPT 7B 0.8%, NeMo 2 Llama 3 8B
    # on B200 30.1%).
    s = L.summarise([L.measure(r) for r in RECORDS.values()], 2, L.NEAR_CAPACITY_GIB)["megatron-core"]
    assert s is not None and s.n >= 10
    assert s.high > 10 * s.low


def test_a_flat_fraction_fits_both_binding_records_once_the_fresh_gradient_is_priced() -> None:
    # docs/validation.md#allocator-reserve: NeMo 24.07's GPT-3 20B ran and BLOOM's dp32 tp2 pp6 attempt did
    # not. Until BLOOM's fresh 3.6 GB embedding gradient was priced (docs/formulas.md#mem.fresh_grads,
    # docs/validation.md#bloom-oom-audit) the fraction the first allows was below the one the second needs;
    # now the second needs less than the first allows (as llmplan prices NeMo's model states: Apex's bucket
    # layout, docs/validation.md#nemo-fp8-mem, would close this window again). Since #split-allowance the
    # fraction is of the churned tensors only: BLOOM's needs under 5% of them, NeMo's allows more.
    t = L.thresholds()
    assert set(t) == set(L.BINDING)
    assert t["bloom-prequel-gbs-and-tp-variations-L72h14336a64-dp32tp2pp6mbs1gbs2048z1"] < \
        t["nemo2407-pretrain-gpt3-20b-64gpu-gbs256"]


def test_thresholds_divide_by_the_shipped_fraction_not_a_literal(monkeypatch) -> None:
    """thresholds() turns each record's allowance bytes (allocator_reserve.Row.frag, priced with the default
    MemoryAllowance) back into the tensors they are a fraction of: with the default fraction at 10% the bytes
    are 10% of the base, and the threshold is (capacity - (total - frag)) / (frag / 0.10). Before, 0.05 was
    written out, so a changed default gave thresholds off by the ratio."""
    import types

    import allocator_reserve as R

    row = R.Row(id="x", fam="f", kind="ran", total=100.0, capacity=95.0, frag=8.0, held=0.0, churned=0.0,
                smi=None, measured_gib=None)
    monkeypatch.setattr(R, "rows", lambda ids=None: [row])
    monkeypatch.setattr(L, "MemoryAllowance", lambda: types.SimpleNamespace(fragmentation=0.10))
    assert L.thresholds() == {"x": pytest.approx((95.0 - (100.0 - 8.0)) / 80.0)}
