"""The vectorised search against the one-plan estimate: the check several agreement tests share."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from llmplan.estimate import estimate_training
from llmplan.search.evaluate import evaluate
from llmplan.specs.check import check_plan


def valid_sample(m, cluster, plans, seed: int, scan: int, n: int, keep: Callable = lambda p: True) -> list[int]:
    """Up to `n` indices of `plans` that check_plan accepts and `keep(plan)` holds for, from the first `scan` of
    a seeded permutation (the sample the agreement tests price both ways)."""
    order = np.random.default_rng(seed).permutation(len(plans))[:scan]
    return [int(i) for i in order if not check_plan(m, plans.plan(int(i)), cluster) and keep(plans.plan(int(i)))][:n]


def assert_arrays_agree(m, cluster, plans, idx: Sequence[int], rel: float = 1e-9) -> None:
    """Plans `idx` of the plan arrays `plans`, evaluated together, price the memory and step time
    estimate_training prices for each alone."""
    assert len(idx)
    vec = evaluate(m, cluster, plans.take(np.asarray(idx)))
    for j, i in enumerate(idx):
        scalar = estimate_training(m, cluster, plans.plan(i))
        assert float(vec.memory.total[j]) == pytest.approx(float(scalar.memory.total), rel=rel)
        # the activations, their cp_comm_type part (docs/formulas.md#mem.cp_comm) and the DSA indexer's transient
        # (docs/formulas.md#mem.indexer_reference), not only the sum
        for get in (lambda x: x.activations, lambda x: x.activation_parts.cp_workspace,
                    lambda x: x.activation_parts.indexer_workspace):
            v = get(vec.memory)
            v = v[j] if isinstance(v, np.ndarray) and v.shape else v
            assert float(v) == pytest.approx(float(get(scalar.memory)), rel=rel, abs=1e-6)
        assert float(vec.step.total[j]) == pytest.approx(float(scalar.time.total), rel=rel)
