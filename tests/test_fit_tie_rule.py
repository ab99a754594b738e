"""benchmarks/accuracy.py's fit objective and tie rule (docs/validation.md#fit-stability, #stable-fit).

The objective is each family's mean |error|, whose delete-one-record jackknife is jackknife_means; the tied set is
the grid points within FIT_SE standard errors of the least point's objective (Hastie, Tibshirani & Friedman, The
Elements of Statistical Learning, 2nd ed., section 7.10: "no more than one standard error above the error of the
best model"), not within each point's own standard error of its difference from the least.
"""

from __future__ import annotations

import numpy as np
import pytest


def test_jackknife_means_by_hand(acc):
    nan = np.nan
    errors = np.array([[1.0, 2.0, 3.0, nan], [2.0, 4.0, 6.0, 8.0], [nan, 3.0, nan, nan]])
    out = acc.jackknife_means(errors)
    # Row 0: the others of record 0 are 2, 3 -> 2.5; of 1: 1, 3 -> 2; of 2: 1, 2 -> 1.5; the NaN record deleted
    # leaves 1, 2, 3 -> 2. Row 1: (20 - x) / 3. Row 2: deleting a NaN leaves the 3; deleting the 3 leaves none.
    want = np.array([[2.5, 2.0, 1.5, 2.0], [6.0, 16 / 3, 14 / 3, 4.0], [3.0, nan, 3.0, 3.0]])
    np.testing.assert_allclose(out, want)
    # A family of one record has no delete-one mean: NaN, and it leaves the objective's jackknife.
    assert np.isnan(acc.jackknife_means(np.array([[5.0], [7.0]]))).all()


def test_ties_are_within_one_se_of_the_least_point_so_the_tied_set_has_no_hole(acc):
    na, nh = (len(acc.GRID[f"clock_{g}"]) for g in acc.CLOCK_GROUPS)
    key = tuple((k, v[0]) for k, v in acc.GRID.items() if not k.startswith("clock_"))
    # The least point (A100 index 0, H100 index 2) has objective 1.0 and delete-one changes +1, -1, +1, -1:
    # jackknife SE sqrt(3/4 x 4) = sqrt(3). Its H100 neighbour is 0.5 SE above with the same changes (coherent:
    # its difference from the least has SE 0); the next one 0.8 SE above with noisy changes (+-4: difference SE
    # 3 sqrt(3)); every other point far above.
    d_best = np.array([1.0, -1.0, 1.0, -1.0])
    se = float(np.sqrt(3.0))
    mean = np.full((na, nh), 20.0)
    mean[0, 2], mean[0, 3], mean[0, 4] = 1.0, 1.0 + 0.5 * se, 1.0 + 0.8 * se
    delta = np.broadcast_to(d_best, (na, nh, 4)).copy()
    delta[0, 4] = d_best + np.array([3.0, -3.0, 3.0, -3.0])

    def jk_se(d: np.ndarray) -> float:
        return float(np.sqrt((len(d) - 1) / len(d) * ((d - d.mean()) ** 2).sum()))

    assert jk_se(d_best) == pytest.approx(se)
    # The data are what the case says: the old per-point rule (each point's difference SE) ties the far point
    # and not the coherent neighbour, a hole next to the least.
    old = [h for h in range(nh) if mean[0, h] <= 1.0 + jk_se(delta[0, h] - d_best) + 1e-12]
    assert old == [2, 4]
    tied = acc._tied({key: (mean, delta)}, {})
    h100 = acc.GRID["clock_h100"]
    assert sorted((c["clock_a100"], c["clock_h100"]) for c, _ in tied) == [
        (acc.GRID["clock_a100"][0], h100[h]) for h in (2, 3, 4)]
    assert sorted(v for _, v in tied) == pytest.approx([1.0, 1.0 + 0.5 * se, 1.0 + 0.8 * se])
    # Without a jackknife only exact ties remain.
    assert [(c["clock_h100"], v) for c, v in acc._tied({key: (mean, None)}, {})] == [(h100[2], 1.0)]
