"""Published runs and a hardware fact read as their public sources state them (docs/validation.md#record-fixes):
PR #1760's on arm runs delay_wgrad_compute, the 25.11 GB300 Llama 3 8B rows ran micro-batch 2, the B300 reports
148 SMs at a 1.1 kW limit, and the 25.09 DeepSeek-V3 H100 row ran the EP overlap and its selective recompute."""

from __future__ import annotations

import pytest

from llmplan.cost.flops import module_recompute_flops
from llmplan.specs.registry import builtin_systems

PR1760_ON = "bridgecard-b200-bf16-qwen3-235b-a22b-64gpu-gbs1024-ep-overlap-on-pr1760"
PR1760_OFF = "bridgecard-b200-bf16-qwen3-235b-a22b-64gpu-gbs1024-ep-overlap-off-pr1760"
GB300_8B = ("bridge-2511-gb300-fp8-cs-llama3-8b-8gpu-gbs128", "bridge-2511-gb300-mxfp8-llama3-8b-8gpu-gbs128")
DSV3_H100 = "mbridge-25.09-pretrain-deepseekv3-dropless-dgx-h100-1024gpu-fp8-tp2pp8cp1ep64vp4gbs8192mbs1"


def test_pr1760_on_arm_runs_the_deferred_weight_gradients(published_runs, row_plan):
    # NVIDIA-NeMo/Megatron-Bridge scripts/performance/utils/overrides.py at a6e92de5f (PR #1760's merge) and at its
    # parent, _set_moe_a2a_overlap_overrides: moe_a2a_overlap sets overlap_moe_expert_parallel_comm = True AND
    # comm_overlap.delay_wgrad_compute = True; the PR's diff toggles only moe_a2a_overlap of the BF16 preset
    assert published_runs[PR1760_ON]["parallel"].get("delay_wgrad") is True
    on, off = row_plan(PR1760_ON), row_plan(PR1760_OFF)
    assert (on.ep_comm_overlap, on.delay_wgrad) == (True, True)
    assert (off.ep_comm_overlap, off.delay_wgrad) == (False, False)


@pytest.mark.parametrize("rid", GB300_8B)
def test_gb300_llama3_8b_rows_ran_the_tables_micro_batch(published_runs, row_plan, rid):
    # Megatron-Bridge docs/performance-summary.md at v0.2.1 (1c43b39285; "25.11 NeMo Container", DGX-GB300):
    # LLAMA3_8B, 8 GPUs, GBS 128, MBS 2, TP1 PP1 CP1, GA 8. The release's preset (LLAMA3_8B_GB300_*_BASE_CONFIG,
    # configs/llama3/workload_base_configs.py at v0.2.0 / v0.2.1) says micro_batch_size 4 (GA 4), which the
    # launcher's -mb overrides (utils/helpers.py set_user_overrides); the table's GA 8 is MBS 2's
    plan = row_plan(rid)
    assert plan.micro_batch == 2 and plan.dp == 8
    assert plan.global_batch // (plan.dp * plan.micro_batch) == 8  # the table's GA column
    assert "parallel.micro_batch" in published_runs[rid]["field_confidence"]


def test_b300_reports_148_sms_at_a_1100_w_limit():
    # ademeure/QuickRunCUDA investigations/B300_REFERENCE.md at 98ed57d221 ("Hardware Identity", NVIDIA B300 SXM6
    # AC, sm_103a, driver 580.126.09): SMs 148; power min 200 W, max 1100 W. The 160 of "Inside NVIDIA Blackwell
    # Ultra" is the full die; GB300 enables 152 (facebookexperimental/triton PR #2768), the HGX B200 148.
    gpus = {s.gpu.name: s.gpu for s in builtin_systems().values()}
    assert (gpus["b300"].sm_count, gpus["b300"].power_limit_w) == (148, 1100)
    assert (gpus["gb300"].sm_count, gpus["b200"].sm_count) == (152, 148)


def test_2509_deepseek_v3_h100_row_runs_the_ep_overlap_and_its_recompute(row_setup):
    # Megatron-Bridge scripts/performance/run_script.py at v0.1.0rc4 (6725f7049), DeepSeek-V3 on H100: DeepEP
    # (flex), A2A_1F1B (overlap_moe_expert_parallel_comm and delay_wgrad_compute True) and recompute_modules
    # ["mla_up_proj", "mlp"]. Megatron-Core core_v0.14.0 (pyproject: megatron-core>=0.14.0a0,<0.15.0) accepts the
    # flex dispatcher with the overlap (transformer_config.py: moe_token_dispatcher_type in ['alltoall', 'flex'])
    # and its fine-grained schedule handles DeepEP (models/gpt/fine_grained_callables.py, enable_deepep)
    m, _, plan = row_setup(DSV3_H100)
    assert (plan.moe_dispatcher, plan.ep_comm_overlap, plan.delay_wgrad) == ("deepep", True, True)
    assert set(plan.recompute_modules) == {"mla_up_proj", "mlp"} and plan.recompute == "selective"
    # core_v0.14.0 transformer_layer.py: "mlp" sets recompute_mlp only `if not isinstance(self.mlp, MoELayer)`,
    # so it recomputes the 3 dense layers' MLP and nothing of the 58 MoE layers
    up_only = plan.model_copy(update={"recompute_modules": ("mla_up_proj",)})
    assert module_recompute_flops(m, plan, True) == pytest.approx(module_recompute_flops(m, up_only, True))
    assert module_recompute_flops(m, plan, False) > module_recompute_flops(m, up_only, False) > 0
