"""NeMo 24.07's pretraining rows (nemo2407) as benchmarks/accuracy.py builds them: tie flag, parameters, the
predicted step quantity against the table, memory against capacity, and the DP gradient reduce-scatter bytes of
a stage-0 rank (docs/validation.md#nemo-untied). Analysis only: nothing in llmplan reads this file.

    PYTHONPATH=$PWD python benchmarks/nemo_untied.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A

from llmplan.cost.comm import dp_transfers
from llmplan.cost.params import param_counts
from llmplan.estimate import estimate_training

GIB = 2**30


def main() -> int:
    runs = yaml.safe_load(Path(A.DEFAULT_RUNS).read_text())
    print(f"{'record':48s} {'tied':>5s} {'params B':>9s} {'rec B':>6s} {'pred':>8s} {'meas':>8s} {'err %':>6s} "
          f"{'mem GiB':>8s} {'cap':>6s} {'RS GB':>7s}")
    for rec in runs:
        rid = rec["id"]
        if not rid.startswith("nemo2407-pretrain-"):
            continue
        fam = A.family(rid)
        setup = A.record_setup(rec, fam, None)
        if setup is None:
            print(f"{rid:48s} not scored")
            continue
        m, c, p = setup
        e = estimate_training(m, c, p)
        q = [x for x in A.predict(rec, fam) if x[0] != "fits"]
        pred, meas = (float(q[0][1]), float(q[0][2])) if q else (float("nan"), float("nan"))
        rs = sum(float(t.calls) * float(t.message) for t in dp_transfers(m, p, 0, 0, stage=0)
                 if t.collective == "reduce-scatter")
        print(f"{rid[len('nemo2407-pretrain-'):]:48s} {str(m.tie_word_embeddings):>5s} "
              f"{param_counts(m).total / 1e9:9.3f} {rec['model'].get('params_b', 0):6.1f} {pred:8.1f} {meas:8.1f} "
              f"{100 * (pred / meas - 1):+6.1f} {float(e.memory.total) / GIB:8.2f} "
              f"{float(e.memory.capacity) / GIB:6.2f} {rs / 1e9:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
