"""How much one family's predictions move the other families' left-out errors (docs/validation.md#fit-stability).

Every training record is predicted once on the fit's grid (accuracy.fit_tables); each family's predictions are then
scaled by 1 +- delta in turn (a signed error e becomes (1 + delta) e + 100 delta), the leave-one-family-out fits
redone (accuracy.lofo, the source groups left out as the report does) and, for every other family, the change of
its left-out median |error| printed. A fit whose choice is stable moves the others by a fraction of a point; one
that jumps between near-equal grid points moves them by whole grid steps of their error.

    PYTHONPATH=$PWD python benchmarks/fit_stability.py [--delta 0.02] [--families nemo2407,bridge]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as acc  # noqa: E402


def left_out(records: list[dict]) -> tuple[dict[str, float], set[str]]:
    """Each training family's left-out median |error| (accuracy.lofo by source group), and the families with
    records in the fit."""
    fitted, scored, jackknife = acc.fit_tables(records)
    fams = set().union(*(set(v) for v in fitted.values()))
    return ({f: left for f, _, left, _ in acc.lofo(fitted, scored, jackknife) if left is not None and left == left},
            fams)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delta", type=float, default=0.02, help="relative change of one family's predictions")
    ap.add_argument("--families", default="", help="comma-separated families to perturb (default: every fitted one)")
    args = ap.parse_args(argv)
    records = yaml.safe_load(acc.DEFAULT_RUNS.read_text())
    predicted = acc.throughput_errors
    memo: dict[tuple, dict[str, float]] = {}
    scale: dict[str, float] = {}

    def errors(records: list[dict], consts: dict | None) -> dict[str, float]:
        key = tuple(r["id"] for r in records)
        if key not in memo:
            memo[key] = predicted(records, consts)
        return {i: (1 + scale.get(acc.family(i), 0.0)) * e + 100 * scale.get(acc.family(i), 0.0)
                for i, e in memo[key].items()}

    acc.throughput_errors = errors
    try:
        base, fitted = left_out(records)
        fams = [f for f in args.families.split(",") if f] or sorted(fitted)
        print("left out: " + ", ".join(f"{f} {v:.1f}" for f, v in sorted(base.items())))
        moves = []
        for f in fams:
            for d in (args.delta, -args.delta):
                scale.clear()
                scale[f] = d
                res = left_out(records)[0]
                moved = {g: res[g] - base[g] for g in base if g != f and g in res}
                moves += [abs(v) for v in moved.values()]
                big = ", ".join(f"{g} {v:+.1f}" for g, v in sorted(moved.items()) if abs(v) >= 0.05)
                print(f"  {f} {d:+.3f}: {big or 'no other family moves'}")
    finally:
        acc.throughput_errors = predicted
    if moves:
        print(f"other families' left-out moves: max {max(moves):.1f}, >= 1 point {sum(m >= 1 for m in moves)}, "
              f">= 2 points {sum(m >= 2 for m in moves)}, mean {sum(moves) / len(moves):.2f} over {len(moves)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
