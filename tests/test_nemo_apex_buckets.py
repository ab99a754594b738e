"""Apex 810ffae374's bucket layout under NeMo r2.0.0rc1's per-layer buckets (benchmarks/nemo_apex_buckets.py;
docs/validation.md#nemo-fp8-mem). Expected values are worked by hand from the cited source lines."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import nemo_apex_buckets as B  # noqa: E402

# GPT-3 20B (NeMo-Framework-Launcher 24.07 conf/training/gpt3/20b.yaml): 44 layers, hidden 6144, FFN 4 x 6144,
# TP 2, DP 32, GPT-2 BPE 50,304 padded to 128 x TP = 50,432 (25,216 a rank), 2048 learned positions.
BUCKET = 220 * 2**20 // 2  # bucket_cap_mb 220 of bf16 = 115,343,360 elements; / 32 = 3,604,480, a multiple of 64
LAYER = 9216 * 6144 + 9216 + 6144 * 3072 + 12288 * 6144 + 12288 + 6144 * 12288  # QKV, proj, fc1, fc2 + 2 biases


def test_bucket_size_is_the_cap_over_dp_floored_to_128_bytes() -> None:
    assert B.bucket_elements(220, 2, 32) == BUCKET == 115_343_360
    # 100 MiB of bf16 over 24 ranks: 52,428,800 / 24 = 2,184,533.3 -> 2,184,533 -> floored to 64: 2,184,512
    assert B.bucket_elements(100, 2, 24) == 2_184_512 * 24


def test_gpt3_20b_layers_take_two_whole_buckets_each() -> None:
    calls = B.gpt_calls(44, 6144, 24576, 2, 25216, 2048)
    buckets = B.apex_layout(calls, BUCKET, 64)
    normal = [b for b in buckets if b.key == B.NORMAL]
    fp32 = [b for b in buckets if b.key == B.FP32]
    assert LAYER == 226_513_920 and 2 * BUCKET > LAYER > BUCKET
    # 43 layers of 2 buckets, then the first layer with the 44 x 6 + 2 sequence-parallel vectors: 2 more
    assert len(normal) == 88 and sum(b.filled for b in normal) == 44 * LAYER + (44 * 6 + 2) * 6144
    assert max(b.offset + b.size for b in normal) == 88 * BUCKET
    # the fp32-grad embeddings (25,216 x 6144 + 2048 x 6144 = 167,510,016) in 2 buckets whose offsets start after
    # bucket 0 (Apex's last_bucket_id() returns 0 when no later bucket has the dtypes): a 3-bucket buffer
    assert sum(b.filled for b in fp32) == 167_510_016
    assert [b.offset for b in fp32] == [BUCKET, 2 * BUCKET]
    assert max(b.offset + b.size for b in fp32) == 3 * BUCKET == 346_030_080


def test_the_hole_falls_on_whichever_dtypes_come_second() -> None:
    # the fp32 parameters in the first call start at offset 0 (no bucket yet: last_bucket_id() is -1); the bf16
    # layer after them then starts after bucket 0 (fp32), so the bf16 buffer is the one with the 1-bucket hole
    buckets = B.apex_layout([[(167_510_016, B.FP32)], [(LAYER, B.NORMAL)]], BUCKET, 64)
    assert [(b.key, b.offset) for b in buckets] == [(B.FP32, 0), (B.FP32, BUCKET), (B.NORMAL, BUCKET),
                                                    (B.NORMAL, 2 * BUCKET)]


def test_each_call_starts_a_bucket_and_fragments_align_to_64() -> None:
    # two calls of 10 elements in a 1000-element bucket: two buckets; in one call: one, second at 64
    assert len(B.apex_layout([[(10, B.NORMAL)], [(10, B.NORMAL)]], 1000, 64)) == 2
    one = B.apex_layout([[(10, B.NORMAL), (10, B.NORMAL)]], 1000, 64)
    assert len(one) == 1 and one[0].filled == 74
