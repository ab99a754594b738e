"""GPT-OSS 120B's Megatron-Bridge rows per token, and a sequence-length test of where the gap scales
(docs/validation.md#gptoss-gap-seq).

Part 1, for every scored GPT-OSS 120B mbridge-moe / bridgecard row: the preset as llmplan reads it (sequence,
micro-batch, EP, PP, recompute modules, CUDA graphs, dispatcher, EP overlap), the signed error (+ = predicted
faster), the predicted and measured time per token per GPU (1 / tokens/s/GPU, us), their difference ("miss"),
and the slowest stage's priced attention, GEMM and memory-bound time per token of a micro-batch (us); m/gemm and
m/attn the missing time over the priced GEMM and attention time per token per GPU (the stage's times x PP: a
stage runs 1 / PP of the layers for PP x a GPU's tokens).

Part 2, the 25.11 table's GB300 / GB200 rows ran at sequence 8,192 (the table's Sequence Length and GA columns);
every later GPT-OSS row runs 4,096. Per token, GPT-OSS's 18 sliding-window layers (128 keys) cost the same at
both lengths and its 18 full causal layers twice as much at 8,192, so the priced attention per token at the two
lengths splits into window W and full F (att4 = W + F, att8 = W + 2F). Three ways to place the 4,096 row's
missing time, each sized on the 4,096 row and carried to the 8,192 row:

* H1 all attention x k: the 8,192 row misses (k - 1) x att8;
* H2 the window layers' attention x k: it misses (k - 1) x W (the same per token as at 4,096);
* H3 anything per token (GEMMs, memory-bound passes, per-query-row work): the same per token as at 4,096.

Nothing here changes a prediction: `python benchmarks/gptoss_tokens.py [MODEL]` (about 10 s; MODEL a piece of
the row ids, default gpt-oss-120b, e.g. qwen3-30b-a3b for part 1 only).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A  # noqa: E402

from llmplan.estimate import estimate_training  # noqa: E402

PAIRS = (("mbridge-26.02-pretrain-gpt-oss-120b-dgx-gb300-64gpu-bf16-tp1pp1cp1ep64vpnagbs1280mbs4",
          "mbridge-25.11-pretrain-gpt-oss-120b-dgx-gb300-64gpu-bf16-tp1pp1cp1ep64vp1gbs1280mbs2"),
         ("mbridge-26.02-pretrain-gpt-oss-120b-dgx-gb200-64gpu-bf16-tp1pp1cp1ep64vpnagbs1280mbs4",
          "mbridge-25.11-pretrain-gpt-oss-120b-dgx-gb200-64gpu-bf16-tp1pp1cp1ep64vp1gbs1280mbs1"))
"""(4,096-token row, 8,192-token row) of one GPU, both BF16 EP64 on 64 GPUs of an NVL72 rack."""


def seq_test(short: dict, long_: dict) -> dict[str, float]:
    """The three placements of the 4,096-token row's missing time (us per token) carried to the 8,192 row."""
    full = long_["att"] - short["att"]  # the full causal layers' attention per token doubles with the sequence
    window = short["att"] - full
    miss = short["meas"] - short["pred"]
    return {"window": window, "full": full, "miss": miss, "k_all": 1 + miss / short["att"],
            "k_window": 1 + miss / window, "meas": long_["meas"],
            "h1": long_["pred"] + miss / short["att"] * long_["att"], "h3": long_["pred"] + miss}


def label(rid: str) -> str:
    """release GPU precision of a row id (bridgecard rows: card GPU precision)."""
    if rid.startswith("bridgecard-"):
        return "card " + " ".join(rid.split("-")[1:3])
    rel, rest = rid.split("-pretrain-", 1)
    rest = rest.split("-dgx-", 1)[1]
    return " ".join([rel.removeprefix("mbridge-"), *rest.split("-")[0:3:2]])


def per_token(rec: dict, model: str = "gpt-oss-120b") -> dict | None:
    """Predicted / measured us per token per GPU and the stage's parts per token of the rows of `model` (a piece
    of the row id); None where not scored."""
    fam = A.family(rec["id"])
    if model not in rec["id"] or fam not in ("mbridge-moe", "bridgecard") or A.skip_reason(rec):
        return None
    setup = A.record_setup(rec, fam)
    if setup is None or not A.predict(rec, fam):
        return None
    m, c, p = setup
    e = estimate_training(m, c, p)
    s, tok = e.time.stage, p.micro_batch * p.seq_len
    pred = 1e6 * c.num_gpus / float(e.throughput.tokens_per_s)
    meas = 1e6 / rec["measured"]["tokens_per_s_per_gpu"]
    return {"id": rec["id"], "plan": p, "pred": pred, "meas": meas,
            "att": 1e6 * float(s.attention) / tok, "gemm": 1e6 * float(s.gemm) / tok,
            "mb": 1e6 * float(s.memory_bound) / tok}


def main(argv: list[str] | None = None) -> int:
    model = (argv if argv is not None else sys.argv[1:] or ["gpt-oss-120b"])[0]
    recs = yaml.safe_load(A.DEFAULT_RUNS.read_text())
    rows = [r for r in (per_token(rec, model) for rec in recs) if r]
    print(f"{'row':20s} {'seq':>5s} {'mbs':>3s} {'ep':>3s} {'pp':>2s} {'recompute':17s} {'graphs':9s} "
          f"{'disp':8s} ovl {'err':>6s} {'pred':>6s} {'meas':>6s} {'miss':>6s} {'attn':>5s} {'gemm':>5s} {'mem':>5s} "
          f"{'m/gemm':>6s} {'m/attn':>6s}")
    seen = set()
    for r in rows:
        if r["id"] in seen:
            continue
        seen.add(r["id"])
        p = r["plan"]
        rc = ",".join(p.recompute_modules) or p.recompute
        print(f"{label(r['id']):20s} {p.seq_len:5d} {p.micro_batch:3d} {p.ep:3d} {p.pp:2d} {rc:17s} "
              f"{p.cuda_graphs[:9]:9s} {p.moe_dispatcher[:8]:8s} {int(p.ep_comm_overlap):3d} "
              f"{100 * (r['meas'] / r['pred'] - 1):+6.1f} "
              f"{r['pred']:6.2f} {r['meas']:6.2f} {r['meas'] - r['pred']:6.2f} {r['att']:5.2f} {r['gemm']:5.2f} "
              f"{r['mb']:5.2f} {(r['meas'] - r['pred']) / (p.pp * r['gemm']):6.2f} "
              f"{(r['meas'] - r['pred']) / (p.pp * r['att']):6.2f}")
    if model != "gpt-oss-120b":
        return 0
    by_id = {r["id"]: r for r in rows}
    print("\nsequence-length test (us per token per GPU): measured 8,192 row against each way of placing the gap")
    for short, long_ in PAIRS:
        t = seq_test(by_id[short], by_id[long_])
        print(f"{label(long_):14s}: W {t['window']:.2f} F(4k) {t['full']:.2f}; 4k row misses {t['miss']:.2f} "
              f"(all attention x{t['k_all']:.2f} or window x{t['k_window']:.2f}); 8k measured {t['meas']:.2f}, "
              f"H1 {t['h1']:.2f} ({100 * (t['h1'] / t['meas'] - 1):+.1f}%), "
              f"H2 = H3 {t['h3']:.2f} ({100 * (t['h3'] / t['meas'] - 1):+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
