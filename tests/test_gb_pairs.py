"""GB300 against GB200 on one unchanged recipe (docs/validation.md#gb-pairs): Megatron-Bridge's Llama 3 70B FP8
current-scaling preset on 64 GPUs (TP1 PP1, Megatron-FSDP, micro-batch 2, global batch 256; GB200 offloads 40
layers' activations, GB300 20: configs/llama3/workload_base_configs.py at v0.2.0 and configs/llama/
llama3_workload_base_configs.py at v0.3.0 - v0.4.2 alike) measured in five releases' tables. GB200 holds
4,040-4,357 tokens/s per GPU throughout; GB300 goes from 4,520 (25.11) to 5,003-5,248 (26.02 on), so the
measured ratio moves from 1.048 to 1.20-1.27 on the same hardware and recipe: software, not a board constant.
A hardware ratio llmplan prices must lie within that spread."""

import pytest

ROW = "mbridge-{rel}-pretrain-llama3-70b-dgx-{gpu}-64gpu-{fmt}-tp1pp1cp1ep{ep}"
RELEASES = {"25.11": ("fp8cs", "1vp1gbs256mbs2"), "26.02": ("fp8", "navpnagbs256mbs2"),
            "26.02.01": ("fp8", "navpnagbs256mbs2"), "26.04": ("fp8", "navpnagbs256mbs2"),
            "26.04.01": ("fp8", "navpnagbs256mbs2")}


def _ratio(acc, runs, rel: str) -> tuple[float, float]:
    fmt, tail = RELEASES[rel]
    out = []
    for gpu in ("gb300", "gb200"):
        rec = runs[ROW.format(rel=rel, gpu=gpu, fmt=fmt, ep=tail)]
        pred = next(p for q, p, _ in acc.predict(rec, acc.family(rec["id"])) if q == "tok/s/GPU")
        out.append((pred, rec["measured"]["tokens_per_s_per_gpu"]))
    (p300, m300), (p200, m200) = out
    return p300 / p200, m300 / m200


def test_identical_recipe_ratio_lies_within_the_releases_spread(published_runs, acc):
    ratios = {rel: _ratio(acc, published_runs, rel) for rel in RELEASES}
    measured = [m for _, m in ratios.values()]
    # the published numbers themselves (25.11: 4,520 / 4,312; 26.04: 5,243 / 4,143)
    assert ratios["25.11"][1] == pytest.approx(4520 / 4312, rel=1e-6)
    assert ratios["26.04"][1] == pytest.approx(5243 / 4143, rel=1e-6)
    assert max(measured) - min(measured) > 0.15  # the same recipe's ratio moves by more than 15 points
    for predicted, _ in ratios.values():  # one plan: one predicted ratio, inside the published spread
        assert min(measured) <= predicted <= max(measured)
