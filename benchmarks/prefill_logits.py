"""The wideep prefill rows under the prefill output layer at one row per prompt (docs/validation.md#prefill-logits).

For every scored prefill row of benchmarks/data/wide_ep_serving.yaml it prints the predicted step (one batch of
tokens_per_batch prompt tokens per GPU) with the output layer and sampler at every prompt token (the rule before)
and at one row per prompt (cost.inference.prefill_logit_rows), the error of each against the measured input
tokens/s, and the step's parts as priced (compute beside the routed experts, the routed experts, the DeepEP
exchange, each for the whole batch before any overlap; the attention core alone and its rate). Then, for the
H100 rows (the same layout at 1,000 / 2,000 / 4,096-token prompts), how the measured and the predicted step grow
with the prompt. Nothing here changes a prediction: `python benchmarks/prefill_logits.py` (a few seconds).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import WIDE_EP_RUNS  # noqa: E402

import llmplan.cost.serve_step as S  # noqa: E402
from llmplan.cost.compute import attended_keys  # noqa: E402
from llmplan.cost.inference import batched_prompts  # noqa: E402
from llmplan.cost.serve_moe import tbo_split_share  # noqa: E402
from llmplan.serving import job_for_plan, loaded_model, replica_spans, running_plan, serving_operator_uses  # noqa: E402
from llmplan.specs.plan import ClusterSpec  # noqa: E402
from llmplan.specs.registry import builtin_models, builtin_systems  # noqa: E402
from llmplan.specs.serve import ServeJob, ServePlan  # noqa: E402


def row_parts(rec: dict) -> dict:
    """The step of one wideep prefill record, priced both ways, and its parts (seconds, FLOP)."""
    system = builtin_systems()[rec["system"]]
    cluster = ClusterSpec(system=system, num_nodes=rec["nodes"], gpus_per_node=rec.get("gpus_per_node"))
    par = dict(rec["plan"])
    plan = ServePlan(tp=1, pp=1, dp=par["ep"], **par)
    wl = rec["workload"]
    job = ServeJob(input_len=wl["input_len"], output_len=wl["output_len"], engine="sglang", batch=1,
                   max_num_batched_tokens=wl.get("tokens_per_batch", 8192))
    m = loaded_model(builtin_models()["deepseek-v3"], job)
    job = job_for_plan(m, job, plan, system)
    spans = replica_spans(plan, cluster)
    plan = running_plan(plan, serving_operator_uses(m, system.gpu))
    T = float(job.max_num_batched_tokens)
    pairs = T * attended_keys(m, min(job.uncached_input, T) / 2)
    rows = batched_prompts(job)

    def step(logit_rows, p=pairs) -> float:
        return float(S.step_seconds(m, plan, system, spans, T, p, 0.0, engine="sglang", logit_rows=logit_rows,
                                    tbo_share=tbo_split_share(job.uncached_input, T)))

    rest, routed = S.step_compute_parts(m, plan, system, spans, T, pairs, 0.0, False, "sglang", None, rows)
    rest0, _ = S.step_compute_parts(m, plan, system, spans, T, 0.0, 0.0, False, "sglang", None, rows)
    qk, v = S.attention_pair_dims(m, plan, False)
    return {"tokens": T, "prompts": rows, "old": step(None), "new": step(rows),
            "measured": T / rec["measured"]["input_tokens_per_s_per_gpu"], "rest": float(rest),
            "routed": float(routed), "exchange": float(S.expert_exchange_seconds(m, plan, system, spans, T, False,
                                                                                  "sglang")),
            "attention_s": float(rest - rest0),
            "attention_flop": float(2 * pairs * m.num_attention_heads * (qk + v) * m.num_hidden_layers),
            "input_len": wl["input_len"]}


def main() -> int:
    recs = [r for r in yaml.safe_load(WIDE_EP_RUNS.read_text())
            if not r.get("excluded") and r["plan"]["phase"] == "prefill"]
    print("wideep prefill rows: step per GPU (ms), output layer at every prompt token (old) / one row per prompt "
          "(new); error of input tok/s against measured")
    h100 = []
    for rec in recs:
        p = row_parts(rec)
        err = {k: 100 * (p["measured"] / p[k] - 1) for k in ("old", "new")}
        print(f"  {rec['id']:38s} {p['prompts']:4.1f} prompts  old {p['old'] * 1e3:6.1f} ({err['old']:+5.1f}%)  "
              f"new {p['new'] * 1e3:6.1f} ({err['new']:+5.1f}%)  measured {p['measured'] * 1e3:6.1f}  | rest "
              f"{p['rest'] * 1e3:5.0f} routed {p['routed'] * 1e3:5.0f} exchange {p['exchange'] * 1e3:5.0f}  "
              f"attention {p['attention_s'] * 1e3:5.1f} ms at {p['attention_flop'] / p['attention_s'] / 1e12:4.0f} "
              "TFLOP/s")
        if rec["id"].startswith("wideep-lmsys-h100-prefill"):
            h100.append(p)
    print("H100 EP32 rows, step growth with the prompt (ms):")
    for a, b in zip(h100, h100[1:]):
        print(f"  {a['input_len']} -> {b['input_len']}: measured +{(b['measured'] - a['measured']) * 1e3:5.1f}, "
              f"predicted +{(b['new'] - a['new']) * 1e3:5.1f}, attention priced +"
              f"{(b['attention_s'] - a['attention_s']) * 1e3:5.1f} for +"
              f"{(b['attention_flop'] - a['attention_flop']) / 1e12:4.1f} TFLOP")
    return 0


if __name__ == "__main__":
    sys.exit(main())
