"""Issue 32 ("layouts experts avoid, priced as they run"): where the search's #1 runs context parallelism, the
output names the best plan without it and what CP buys, part by part (report.search.without_cp_line; JSON
"without_cp" and explain "vs_without_cp"). Llama-3.1-405B at 8,192 tokens on 16,384 H100 with 16M tokens per
step (Dubey et al. 2024, The Llama 3 Herd of Models, Table 4) is the case: Meta ran tp8 pp16 dp128 cp1 and
names the lower batch per DP group (more pipeline bubble) as why 16K GPUs ran at 41% MFU against 43% on 8K
(§3.3.2); NVIDIA's H100 preset for the same model runs cp 2 at 8,192 tokens (NVIDIA-NeMo/Megatron-Bridge
scripts/performance/configs/llama/llama31_workload_base_configs.py at 0013c9a8,
LLAMA31_405B_PRETRAIN_CONFIG_H100_BF16_V1: tp8 pp8 cp2 vp8 on 1,024 GPUs), so a CP #1 here is a layout a team
runs, and the output says what it buys."""

from __future__ import annotations

import pytest
from conftest import one_train_search

ARGS = ("search", "--model", "llama-3.1-405b", "--hardware", "dgx-h100", "--nodes", "2048", "--seq-len", "8192",
        "--batch-tokens", "16M", "--top", "3")


def test_cp_winner_is_explained_against_the_best_plan_without_cp(cli):
    with one_train_search():  # the text renders the JSON's search result: one search, not two
        r, h = cli(*ARGS, "--json"), cli(*ARGS)
    assert r.code == 0 and h.code == 0, r.err + h.err
    doc, human = r.json(), h.out
    best, without = doc["plans"][0], doc["without_cp"]
    assert best["plan"]["cp"] > 1 and without["plan"]["cp"] == 1
    vs = doc["explain"]["vs_without_cp"]
    # the difference is #1's parts minus the cp 1 plan's, and #1 is the faster (it ranks first)
    assert vs["step_s"] == pytest.approx(best["time"]["step_s"] - without["time"]["step_s"], rel=1e-6)
    assert vs["throughput_ratio"] > 1
    # the human line says which plan and why (recompute or micro-batches per pipeline, whichever differ)
    line = " ".join(human.split())
    assert "#1 vs best without CP (" in line
    assert max(map(len, human.splitlines())) <= 80  # the line wraps inside the brief's 80 columns
    if best["plan"]["recompute"] != without["plan"]["recompute"]:
        assert f"without CP the best plan recomputes {without['plan']['recompute']}" in line


def test_no_cp_line_where_the_best_plan_runs_without_cp(cli):
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["plans"][0]["plan"]["cp"] == 1
    assert "without_cp" not in doc and "vs_without_cp" not in doc["explain"]
    h = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100")
    assert h.code == 0 and "best without CP" not in h.out
