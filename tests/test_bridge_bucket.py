"""The data-parallel gradient bucket as a plan field (ParallelPlan.dp_bucket_params; docs/validation.md#bridge-bucket).

Sources:
- NVIDIA/Megatron-LM core_r0.8.0 megatron/core/distributed/distributed_data_parallel.py: bucket_size None ->
  max(40000000, 1000000 x data-parallel size); megatron/training/arguments.py --ddp-bucket-size.
- NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/comm_overlap.py, CommOverlapConfig
  _get_optimizer_overlap_cfgs: `if self.data_parallel_size > 1: comm_overlap_cfg.bucket_size = 128 * 1024 * 1024`
  (line 543 at v0.1.0rc4, 540 at v0.2.0 and v0.3.0, 577 at v0.4.0, 564 at v0.5.0, 577 at v0.6.0), applied by
  setup only under ddp_config.use_distributed_optimizer, and setup runs only where the recipe set cfg.comm_overlap
  (training/config.py runtime_config_update).
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


def _row(rid, gpu="GB200 (NVL72 rack)", ref="26.04 NeMo container, pretrain table"):
    return {"id": rid, "hardware": {"gpu": gpu}, "source": {"ref": ref}}


def test_accuracy_reads_bridge_bucket_where_the_recipe_sets_comm_overlap():
    """128 x 2^20 only where the row's recipe set cfg.comm_overlap (CommOverlapConfig.setup runs only then:
    Megatron-Bridge training/config.py `if cfg.comm_overlap is not None`), under the distributed optimizer, dp x cp
    > 1 and overlap_grad_reduce on (Megatron-Core's DDP sets bucket_size None without it). Read from the sources
    (docs/validation.md#bucket-paths): a Llama 3 preset sets one (configs/llama/llama3_llm_pretrain.py); Nemotron-3
    Super's presets of v0.4.0 - v0.6.0 and GPT-OSS 120B's before v0.4.0 (and off GB200 / GB300 MXFP8 V2) do not;
    the Qwen3-30B-A3B card's recipe does (recipes/qwen/h100/qwen3_moe.py line 218 at 3a9559f01), the Qwen3-8B
    card's does not (recipes/qwen/h100/qwen3.py at 619cc20bd); the DeepSeek-V3 card's does but turns
    overlap_grad_reduce off (perf_recipes/deepseek/h100/deepseek_v3.py line 46 at 79308d0d9)."""
    import accuracy  # benchmarks/accuracy.py (conftest puts benchmarks/ on the path)

    f = accuracy.bridge_bucket_params
    llama = _row("mbridge-26.04-pretrain-llama3-70b-dgx-gb200-64gpu-bf16-x")
    for fam in ("bridge", "mbridge-dense"):
        assert f(llama, fam, 1, 8, True) == BRIDGE_BUCKET
        assert f(llama, fam, 1, 1, True) is None
        assert f(llama, fam, 0, 8, True) is None
        assert f(llama, fam, 1, 8, False) is None
    assert f(_row("mbridge-26.04-pretrain-nemotron-3-super-dgx-gb200-64gpu-x"), "mbridge-moe", 1, 32, True) is None
    oss = "mbridge-{}-pretrain-gpt-oss-120b-dgx-{}-64gpu-{}-x"
    assert f(_row(oss.format("26.02", "gb200", "bf16"), ref="26.02 NeMo"), "mbridge-moe", 1, 64, True) is None
    assert f(_row(oss.format("26.04", "gb200", "bf16")), "mbridge-moe", 1, 64, True) == BRIDGE_BUCKET
    assert f(_row(oss.format("26.04", "b300", "bf16"), gpu="B300"), "mbridge-moe", 1, 64, True) is None
    assert f(_row(oss.format("26.06", "gb300", "mxfp8"), gpu="GB300 (NVL72 rack)", ref="26.06 NeMo"),
             "mbridge-moe", 1, 64, True) == BRIDGE_BUCKET
    assert f(_row(oss.format("26.06", "b300", "mxfp8"), gpu="B300", ref="26.06 NeMo"), "mbridge-moe", 1, 64,
             True) is None
    card = _row("bridgecard-h100-bf16-qwen3-30b-a3b-16gpu-gbs1024", gpu="H100", ref="items")
    assert f(card, "bridgecard", 1, 16, True) == BRIDGE_BUCKET
    assert f(_row("bridgecard-h100-bf16-qwen3-8b-16gpu-gbs1024", gpu="H100"), "bridgecard", 1, 16, True) is None
    assert f(_row("bridgecard-h100-bf16-deepseek-v3-1024gpu-gbs16384", gpu="H100"), "bridgecard", 1, 64,
             False) is None
    for fam in ("megatron", "nemo2407"):
        assert f(llama, fam, 1, 8, True) is None


def test_field_refuses_a_non_positive_bucket():
    with pytest.raises(ValidationError):
        ParallelPlan.model_validate(_dense().plan.model_dump() | {"dp_bucket_params": 0})
