"""benchmarks/accuracy.py's constant fit and its processes.

The fit predicts every record once for all grid points of the fitted constants (the constants as arrays,
accuracy.grid_estimate); each element must be exactly what the scalar prediction with that point's constants
gives (the printed report must not change). The reference searches run as child processes that must not
outlive the report when it is killed (issue 39: two workers kept running for 48 minutes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("group", ["a100", "h100"])
def test_grid_prediction_equals_the_scalar_one_at_every_sampled_point(acc, published_records, group):
    records = published_records  # benchmarks/data's runs, as yaml.safe_load of acc.DEFAULT_RUNS gives them
    recs = [r for r in records if acc.family(r["id"]) in acc.TRAIN_FAMILIES and acc.clock_group(r) == group]
    grid = acc.combos(f"clock_{group}")
    errs = acc.throughput_errors(recs, {k: np.array([c[k] for c in grid]) for k in grid[0]})
    assert len(errs) > 100  # the records the fit scores (a broken grid path would drop them all)
    rng = np.random.default_rng(39)
    # Every record at the grid's two corners; every fourth (each family's paths still met) at two inner points.
    for j, some in [(0, recs), (len(grid) - 1, recs), *((int(k), recs[::4]) for k in rng.choice(len(grid), 2,
                                                                                                  replace=False))]:
        scalar = acc.throughput_errors(some, grid[j])
        assert set(scalar) == {r["id"] for r in some} & set(errs)
        diff = {i: (scalar[i], float(errs[i][j])) for i in scalar if scalar[i] != float(errs[i][j])}
        assert not diff, (grid[j], list(diff.items())[:3])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_reference_searches_die_with_the_report():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import accuracy; print('ready', flush=True); "
            "accuracy.reference_report()")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    wait = threading.Event()
    children: list[int] = []
    for _ in range(300):  # until every reference search has started
        out = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True, check=False).stdout
        children = [int(x) for x in out.split()]
        if len(children) >= 4 or p.poll() is not None:
            break
        wait.wait(0.1)
    assert p.poll() is None and children
    p.send_signal(signal.SIGKILL)  # as a timeout kills it: no handler runs in the parent
    p.wait()
    for _ in range(100):
        if not any(_alive(c) for c in children):
            break
        wait.wait(0.1)
    survivors = [c for c in children if _alive(c)]
    for c in survivors:  # leave nothing behind, then fail
        os.kill(c, signal.SIGKILL)
    assert not survivors
