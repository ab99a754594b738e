"""Megatron-Bridge PR #1760's BF16 pair (Qwen3-235B-A22B, 64 B200, PP8 VP4 EP8, alltoall, only the EP overlap
toggled: 17.2 s on -> 16.0 s off) taken apart: where llmplan's off-arm step goes, the expert all-to-alls against
their line-rate floor, and the rows that share the off arm's all-to-all path or its precision
(docs/validation.md#pr1760-pair).

The off arm's all-to-alls are MoEAlltoAllTokenDispatcher's synchronous `all_to_all_single` calls on the compute
stream (NVIDIA/Megatron-LM megatron/core/transformer/moe/token_dispatcher.py `token_dispatch`, `token_combine`
and tensor_parallel/mappings.py `_AllToAll` at 5455f0a, the submodule of Megatron-Bridge a6e92de5f): without the
overlap nothing runs beside them, so all of their time is in the step. Their floor is the bytes that leave the
GPU at the NVLink's one-way rate (`SystemSpec.intra_node_bytes_per_s`) with no efficiency loss.

    python benchmarks/pr1760_pair.py
"""

from __future__ import annotations

from typing import Any

import accuracy as A
from runs import load_runs

from llmplan.cost.comm import transfer_seconds
from llmplan.estimate import estimate_training
from llmplan.topology.graph import link_profile

ARMS = ("bridgecard-b200-bf16-qwen3-235b-a22b-64gpu-gbs1024-ep-overlap-off-pr1760",
        "bridgecard-b200-bf16-qwen3-235b-a22b-64gpu-gbs1024-ep-overlap-on-pr1760")
"""The pair's records (benchmarks/data/published_runs.yaml): off arm, on arm."""

SAME_PATH = ("mbridge-26.02-pretrain-qwen3-235b-a22b-dgx-b200-256gpu-mxfp8-tp1pp8cp1ep8vpnagbs8192mbs1",
             "mbridge-26.04.01-pretrain-qwen3-235b-a22b-dgx-b200-256gpu-mxfp8-tp1pp8cp1ep8vpnagbs8192mbs1",
             "mbridge-25.09-pretrain-qwen3-235b-a22b-tokendrop-dgx-b200-64gpu-fp8-tp1pp8cp1ep8vp2gbs1024mbs1")
"""Scored B200 rows of the same model on the off arm's all-to-all path: alltoall dispatcher, EP8 inside one
NVLink node, bf16 dispatch, no EP overlap."""

SAME_PRECISION = ("mbridge-25.11-pretrain-qwen3-235b-a22b-dgx-gb200-256gpu-bf16-tp1pp8cp1ep32vp3gbs8192mbs1",
                  "mbridge-25.11-pretrain-qwen3-235b-a22b-dgx-gb300-256gpu-bf16-tp1pp4cp1ep16vp12gbs8192mbs2")
"""The scored Blackwell BF16 rows of the same model (25.11, HybridEP, no EP overlap)."""


def measured_step(rec: dict) -> float:
    """Seconds a step, from the record's tokens per second per GPU."""
    return rec["model"]["seq_len"] * rec["parallel"]["global_batch"] / (
        rec["measured"]["tokens_per_s_per_gpu"] * rec["hardware"]["gpus"])


def take_apart(rec: dict) -> dict[str, Any]:
    """llmplan's step of one record, its parts and the all-to-all floor (seconds; err: tokens/s, + = fast)."""
    fam = A.family(rec["id"])
    m, cluster, plan = A.record_setup(rec, fam)
    e = estimate_training(m, cluster, plan)
    t = e.time
    sysm, n = cluster.system, plan.ep
    a2as = [x for x in e.comm.axes["ep"].transfers if x.collective == "all-to-all"]
    a2a = max(a2as, key=lambda x: x.message)  # the tokens' calls; the other: the routing probabilities' (fp32)

    def floor(x: Any) -> float:  # one call: one rank's send buffer less its own share, at the link's rate
        return x.message * (n - 1) / n / sysm.intra_node_bytes_per_s + (n - 1) * link_profile(sysm).intra.latency
    total, meas = float(t.total), measured_step(rec)
    ep, axis = float(t.exposed["ep"]), float(e.comm.axes["ep"].seconds)
    probs = [x for x in a2as if x is not a2a]
    return {"id": rec["id"], "total": total, "meas": meas, "err": 100 * (meas / total - 1),
            "compute": float(t.compute), "bubble": float(t.bubble), "ep": ep, "pp": float(t.exposed["pp"]),
            "overhead": float(t.overhead), "optimizer": float(t.optimizer), "calls": a2a.calls,
            "message": a2a.message, "call_s": transfer_seconds(a2a, sysm) / a2a.calls, "floor_call_s": floor(a2a),
            "probs_calls": sum(x.calls for x in probs), "probs_message": max((x.message for x in probs), default=0.0),
            "probs_s": sum(transfer_seconds(x, sysm) for x in probs),
            "ep_floor": ep * sum(floor(x) * x.calls for x in a2as) / axis}


def main() -> None:
    runs = {r["id"]: r for r in load_runs()}
    print("PR #1760 BF16 pair: step s, llmplan's parts and the measured step (err: tokens/s, + = priced fast)")
    for rid in ARMS:
        r = take_apart(runs[rid])
        print(f"  {rid.split('-ep-overlap-')[1][:-7] + ' arm':8s} priced {r['total']:6.2f} measured {r['meas']:5.2f} err {r['err']:+5.1f}% | "
              f"compute {r['compute']:5.2f} bubble {r['bubble']:4.2f} ep {r['ep']:4.2f} pp {r['pp']:4.2f} "
              f"overhead {r['overhead']:4.2f} optimizer {r['optimizer']:4.2f}")
    off = take_apart(runs[ARMS[0]])
    print(f"off arm's all-to-alls: {off['calls']:.0f} calls of {off['message'] / 1e6:.1f} MB (T x k x h x 2 B), "
          f"priced {off['call_s'] * 1e3:.3f} ms each, line-rate floor {off['floor_call_s'] * 1e3:.3f} ms; exposed "
          f"{off['ep']:.2f} s, at the floor {off['ep_floor']:.2f} s")
    print(f"  and the routing probabilities' all-to-alls: {off['probs_calls']:.0f} calls of "
          f"{off['probs_message'] / 1e3:.1f} kB (T x k x 4 B), {off['probs_s']:.3f} s a step on the EP axis")
    rest = off["total"] - off["ep"]
    print(f"  the rest of the priced step {rest:.2f} s vs measured {off['meas']:.2f} s; with the all-to-alls at their "
          f"floor the arm prices {rest + off['ep_floor']:.2f} s ({100 * (off['meas'] / (rest + off['ep_floor']) - 1):+.1f}%)")
    for title, ids in (("same all-to-all path (alltoall, EP8 in one B200 node, no overlap)", SAME_PATH),
                       ("same precision (BF16, Blackwell, 25.11)", SAME_PRECISION)):
        print(title)
        for rid in ids:
            r = take_apart(runs[rid])
            print(f"  {rid.split('-pretrain-')[0]:15s} {rid.split('-dgx-')[1][:48]:48s} priced {r['total']:6.2f} measured {r['meas']:6.2f} err {r['err']:+5.1f}%")


if __name__ == "__main__":
    main()
