"""benchmarks/gptoss_tokens.py (docs/validation.md#gptoss-gap-seq): per-token times agree with accuracy.py's error,
the sequence-length pairs are the rows the 25.11 table prints at 8,192 tokens against a 4,096-token row of the
same GPU and layout, and the attention split behaves as window + full causal layers must."""

from __future__ import annotations

import gptoss_tokens as T  # benchmarks/ is on the path (conftest)
import pytest


@pytest.mark.parametrize("pair", T.PAIRS)
def test_pairs_differ_in_sequence_only_where_the_table_says(published_runs, pair):
    short, long_ = (published_runs[rid] for rid in pair)
    # Megatron-Bridge performance-summary-archive.md, 25.11 table: GPT OSS 120B GB300 / GB200 at sequence 8192
    assert (short["model"]["seq_len"], long_["model"]["seq_len"]) == (4096, 8192)
    assert short["hardware"]["gpu"] == long_["hardware"]["gpu"]
    assert short["parallel"]["ep"] == long_["parallel"]["ep"] == 64
    # both GBS 1,280 on 64 GPUs: the 8,192 row processes twice the tokens a step
    assert short["parallel"]["global_batch"] == long_["parallel"]["global_batch"] == 1280


@pytest.mark.parametrize("pair", T.PAIRS)
def test_per_token_times_match_the_scored_error(published_runs, acc, pair):
    for rid in pair:
        rec = published_runs[rid]
        r = T.per_token(rec)
        (_, pred, meas), *_ = acc.predict(rec, acc.family(rid))
        # time per token is the reciprocal of tokens/s per GPU
        assert r["meas"] / r["pred"] == pytest.approx(pred / meas, rel=1e-9)
        assert r["meas"] == pytest.approx(1e6 / rec["measured"]["tokens_per_s_per_gpu"], rel=1e-12)


@pytest.mark.parametrize("pair", T.PAIRS)
def test_attention_splits_into_window_and_full_layers(published_runs, pair):
    short, long_ = (T.per_token(published_runs[rid]) for rid in pair)
    t = T.seq_test(short, long_)
    # 18 window layers (128 keys) cost less per token than 18 full causal layers at 4,096 tokens, and both are
    # positive: the 8,192 row's attention per token is below twice the 4,096 row's
    assert 0 < t["window"] < t["full"]
    assert long_["att"] < 2 * short["att"]
    # the non-attention work per token does not depend on the sequence
    assert long_["gemm"] == pytest.approx(short["gemm"], rel=0.01)
    # H1 carries more missing time to the longer row than H3 (full layers grow)
    assert t["h1"] > t["h3"]


def test_an_unscored_row_is_left_out(published_runs):
    skipped = next(r for rid, r in published_runs.items() if "26.06.01-pretrain-gpt-oss" in rid)
    assert T.per_token(skipped) is None
    other = next(r for rid, r in published_runs.items() if "qwen3-30b" in rid and rid.startswith("mbridge-"))
    assert T.per_token(other) is None


def test_label():
    assert T.label(T.PAIRS[0][1]) == "25.11 gb300 bf16"
    assert T.label("bridgecard-gb200-bf16-gpt-oss-120b-64gpu-gbs1280") == "card gb200 bf16"
