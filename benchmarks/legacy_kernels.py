"""The legacy Megatron layer's kernels (docs/validation.md#legacy-kernels): per family whose rows ran
megatron/model/transformer.py's ParallelTransformerLayer (Megatron-LM 2020-2023, the Megatron-DeepSpeed forks),
the launches per layer and micro-batch llmplan prices (cost.kernels.layer_launch_average: Megatron-Core's layer
on Transformer Engine) beside the legacy layer's hand count (legacy_layer.legacy_layer_kernels). Analysis only:
nothing in llmplan reads this file.

--price runs benchmarks/accuracy.py (its arguments after `--`) with the legacy count priced for every plan
without fused attention, which in the validation rows are exactly these families (patched in this process).

    PYTHONPATH=. python benchmarks/legacy_kernels.py
    PYTHONPATH=. python benchmarks/legacy_kernels.py --price -- --quiet
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy as A  # noqa: E402
import llmplan.cost.step as S  # noqa: E402
from legacy_layer import legacy_layer_kernels  # noqa: E402
from llmplan.cost.kernels import Kernels, layer_launch_average  # noqa: E402

LEGACY = ("megatron2020", "narayanan2021", "korthikanti2022", "megascale", "bloom", "mtnlg")
"""The families whose rows ran the legacy layer (accuracy.py prices them without fused attention)."""


def priced_with_legacy(m: Any, plan: Any) -> Kernels:
    """layer_launch_average, with the legacy layer's count for a plan without fused attention."""
    return layer_launch_average(m, plan) if plan.flash_attention else legacy_layer_kernels(m, plan)


def table() -> None:
    """One line per distinct (family, count): the priced and the legacy launches, forward / backward."""
    recs = yaml.safe_load(A.DEFAULT_RUNS.read_text())
    seen: dict[tuple, int] = {}
    for rec in recs:
        fam = A.family(rec["id"])
        if fam not in LEGACY:
            continue
        setup = A.record_setup(rec, fam)
        if setup is None:
            continue
        m, _, plan = setup
        te, legacy = layer_launch_average(m, plan), legacy_layer_kernels(m, plan)
        key = (fam, float(te.fwd), float(te.bwd), float(legacy.fwd), float(legacy.bwd), plan.tp, plan.sp,
               plan.grad_accumulation)
        seen[key] = seen.get(key, 0) + 1
    print(f"{'family':16} {'rows':>4} {'tp':>3} {'sp':>3} {'grad acc.':>9} {'priced':>8} {'legacy':>8}")
    for (fam, tf, tb, lf, lb, tp, sp, ga), n in seen.items():
        print(f"{fam:16} {n:4d} {tp:3d} {'sp' if sp else '-':>3} {ga:>9} {tf:3.0f} {tb:4.0f} {lf:3.0f} {lb:4.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--price", action="store_true", help="run accuracy.py with the legacy count priced")
    ap.add_argument("rest", nargs="*", help="accuracy.py's arguments (after --)")
    args = ap.parse_args()
    if not args.price:
        table()
        return 0
    S.layer_launch_average = priced_with_legacy  # type: ignore[assignment]
    return A.main(args.rest)


if __name__ == "__main__":
    sys.exit(main())
