"""Whether host (CPU) time on Grace could pace the Nemotron-3 GB200 TP2 micro-batches (docs/validation.md#grace-host-tp2).

For the 26.08 Nemotron-3 Super / Ultra MXFP8 rows, the 26.06.01 Nano rows (GB300 and GB200) and the 26.04.01
Super NVFP4 TP2 rows (B200 and GB200, one preset; "super*"), prints per micro-batch: llmplan's priced host
launch time (cost.kernels.layer_launch_average, forward once more over the recomputed share as cost.overhead.
host_seconds counts it, x KERNEL_LAUNCH_S x the GPU's host_op_factor), the GPU compute llmplan prices, the
measured step divided by the micro-batches, and `need`: how many times the priced launch time the host would have
to take for a micro-batch to run at the measured pace were it host-paced. Then, for the Ultra rows, the MXFP8
master-weight cast's operators split into views and kernel launches (cost.overhead), with the host seconds of
each at EAGER_OP_HOST_S and the Grace factor.

    python benchmarks/grace_host.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import accuracy as A
import hybrid_gap as H

from llmplan.cost.compute import KERNEL_LAUNCH_S
from llmplan.cost.kernels import layer_launch_average
from llmplan.cost.moe import EAGER_OP_HOST_S
from llmplan.cost.overhead import (BF16_CAST_SHARD_OPS, BF16_CAST_VIEW_OPS, MXFP8_CAST_SHARD_OPS,
                                   MXFP8_CAST_VIEW_OPS, mxfp8_cast_tensors, shard_overlaps)
from llmplan.cost.stages import max_stage_layers, mtp_weight_sets, recomputed_share
from llmplan.estimate import estimate_training

NANO = {("nano", g): f"mbridge-26.06.01-pretrain-nemotron-3-nano-dgx-{g}-8gpu-mxfp8-tp1pp1cp1ep8vpnagbs512mbs{b}"
        for g, b in (("gb300", 4), ("gb200", 2))}
PAIR = {("super*", g): f"mbridge-26.04.01-pretrain-nemotron-3-super-dgx-{g}-64gpu-nvfp4-tp2pp1cp1ep64vpnagbs512mbs1"
        for g in ("b200", "gb200")}
"""The 26.04.01 Super NVFP4 TP2 preset, the same on B200 (x86 host) and GB200 (Megatron-Bridge v0.5.0
NEMOTRON_3_SUPER_PRETRAIN_CONFIG_{B200,GB200}_NVFP4_V1: TP2, TE graphs of four scopes, no recompute, EP64)."""


def main() -> int:
    recs = {r["id"]: r for r in yaml.safe_load(A.DEFAULT_RUNS.read_text())}
    print(f"{'model':6s} {'gpu':5s} {'tp':>2s} {'mb':>3s} {'graphs':>6s} {'launch/mb':>9s} {'gpu/mb':>7s} "
          f"{'meas/mb':>7s} {'need':>5s} {'signed':>7s}")
    for (model, gpu), rid in {**H.ROWS, **NANO, **PAIR}.items():  # super*: 26.04.01 NVFP4
        m, cluster, plan = A.record_setup(recs[rid], "mbridge-moe")
        e = estimate_training(m, cluster, plan)
        n = plan.num_microbatches
        lk = layer_launch_average(m, plan)
        layers = max_stage_layers(m, plan)
        r = float(recomputed_share(plan, layers))
        launch = float((lk.fwd * (1 + r) + lk.bwd) * layers) * KERNEL_LAUNCH_S * cluster.system.gpu.host_op_factor
        got = H.row(recs[rid])
        meas_mb = got["measured_ms"] / n
        print(f"{model:6s} {gpu:5s} {plan.tp:2d} {n:3d} {plan.cuda_graphs:>6s} {1e3 * launch:9.0f} "
              f"{1e3 * float(e.time.compute) / n:7.0f} {meas_mb:7.0f} {meas_mb / 1e3 / launch:5.1f} "
              f"{100 * got['err']:+6.1f}%")
    for gpu in ("gb300", "gb200"):
        m, cluster, plan = A.record_setup(recs[H.ROWS[("ultra", gpu)]], "mbridge-moe")
        dense, expert, other = (float(x) for x in mxfp8_cast_tensors(m, plan))
        n_mtp = mtp_weight_sets(m)
        units = (m.num_hidden_layers + n_mtp) / plan.pp
        moe_units = (m.num_moe_layers + n_mtp * m.is_moe) / plan.pp
        local = float(shard_overlaps(dense, units, plan.optimizer_shard)
                      + shard_overlaps(expert, moe_units, plan.expert_optimizer_shard))
        local_other = float(shard_overlaps(other, units, plan.optimizer_shard))
        # BF16_CAST_SHARD_OPS is main_weight.view (a view) and model_param.data.copy_ (a kernel)
        views = MXFP8_CAST_VIEW_OPS * (dense + expert) + BF16_CAST_VIEW_OPS * other + local_other
        kernels = MXFP8_CAST_SHARD_OPS * local + (BF16_CAST_SHARD_OPS - 1) * local_other
        f = cluster.system.gpu.host_op_factor
        print(f"ultra {gpu} cast: {dense + expert:.0f} MXFP8 weights, {other:.0f} other parameters; "
              f"{views + kernels:.0f} operators\n  = {views:.0f} views ({1e3 * views * EAGER_OP_HOST_S * f:.0f} ms) "
              f"+ {kernels:.0f} kernel launches ({1e3 * kernels * EAGER_OP_HOST_S * f:.0f} ms), "
              f"{1e6 * EAGER_OP_HOST_S:.0f} us x {f:g} each")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
