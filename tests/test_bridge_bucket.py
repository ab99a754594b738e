"""The data-parallel gradient bucket as a plan field (ParallelPlan.dp_bucket_params; docs/validation.md#bridge-bucket).

Sources:
- NVIDIA/Megatron-LM core_r0.8.0 megatron/core/distributed/distributed_data_parallel.py: bucket_size None ->
  max(40000000, 1000000 x data-parallel size); megatron/training/arguments.py --ddp-bucket-size.
- NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/comm_overlap.py, CommOverlapConfig
  _get_optimizer_overlap_cfgs: `if self.data_parallel_size > 1: comm_overlap_cfg.bucket_size = 128 * 1024 * 1024`
  (line 543 at v0.1.0rc4, 540 at v0.2.0 and v0.3.0, 577 at v0.4.0, 564 at v0.5.0, 577 at v0.6.0), applied by
  setup only under ddp_config.use_distributed_optimizer.
Hand values are computed in the docstrings, not by the code under test; exact arithmetic.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from llmplan.cost.comm import dp_step_calls
from llmplan.cost.exposure import bucket_params, bucket_share
from llmplan.export import bridge, megatron
from llmplan.planfile import load_plan
from llmplan.specs.plan import ParallelPlan

PLANS = Path(__file__).parent / "data" / "plans"
BRIDGE_BUCKET = 128 * 1024 * 1024  # 134217728, typed from the source line, not read from llmplan


def _dense(**update):
    """tests/data/plans/dense_train.json (pp 4, vpp 5, zero 1, dp 2) with `update` on its plan."""
    pf = load_plan(PLANS / "dense_train.json")
    return dataclasses.replace(pf, plan=pf.plan.model_copy(update=update))


def test_default_is_megatron_core_and_the_field_replaces_it():
    """dp 2, cp 1: max(40M, 2M) = 40M by default; with the field, 134217728. A rank of 1e9 parameters: the last
    bucket's share 0.04 by default, 0.134217728 with Megatron-Bridge's bucket."""
    off, on = _dense().plan, _dense(dp_bucket_params=BRIDGE_BUCKET).plan
    assert float(bucket_params(off)) == 40e6 and float(bucket_params(on)) == BRIDGE_BUCKET
    assert float(bucket_share(off, 1e9)) == 0.04
    assert float(bucket_share(on, 1e9)) == BRIDGE_BUCKET / 1e9


def test_fewer_buckets_with_the_larger_bucket():
    """1e9 parameters over vpp 5: the first chunk of 2e8 in ceil(2e8 / 4e7) = 5 buckets by default, + 4 later chunks
    = 9 calls; with 134217728-parameter buckets ceil(2e8 / 134217728) = 2, + 4 = 6."""
    assert int(dp_step_calls(_dense().plan, 1e9, True)) == 9
    assert int(dp_step_calls(_dense(dp_bucket_params=BRIDGE_BUCKET).plan, 1e9, True)) == 6


def test_exports_write_the_bucket_only_when_set():
    assert "--ddp-bucket-size" not in " ".join(megatron.parallel_flags(_dense()))
    on = _dense(dp_bucket_params=BRIDGE_BUCKET)
    assert f"--ddp-bucket-size {BRIDGE_BUCKET}" in " ".join(megatron.parallel_flags(on))
    assert ("ddp.bucket_size", BRIDGE_BUCKET) in bridge.overrides(on)
    assert not [k for k, _ in bridge.overrides(_dense()) if k == "ddp.bucket_size"]


def test_accuracy_reads_bridge_bucket_for_bridge_rows_only():
    """Megatron-Bridge's performance rows under the distributed optimizer and dp x cp > 1 ran 128 x 2^20; one
    data-parallel rank, no distributed optimizer, or another stack: Megatron-Core's default (None)."""
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)

    for fam in ("bridge", "mbridge-dense", "mbridge-moe"):
        assert accuracy.bridge_bucket_params(fam, 1, 8) == BRIDGE_BUCKET
        assert accuracy.bridge_bucket_params(fam, 1, 1) is None
        assert accuracy.bridge_bucket_params(fam, 0, 8) is None
    for fam in ("megatron", "bridgecard", "nemo2407"):
        assert accuracy.bridge_bucket_params(fam, 1, 8) is None


def test_field_refuses_a_non_positive_bucket():
    with pytest.raises(ValidationError):
        ParallelPlan.model_validate(_dense().plan.model_dump() | {"dp_bucket_params": 0})
