"""Megatron-Bridge's mixed-precision presets written out field by field, for a plan whose gradient reduction
differs from its preset's grad_reduce_in_fp32.

Why not a `ddp.grad_reduce_in_fp32` override beside the preset's name: Megatron-Bridge (src/megatron/bridge/
training/config.py at r0.6.0 6124fbe, runtime_config_update) resolves a preset name after the overrides and its
MixedPrecisionConfig.setup copies every field it shares with the model, optimizer and DDP configs onto them
(training/mixed_precision.py, update_config_with_precision_overrides), so the preset's grad_reduce_in_fp32
replaces the override (branch agent/fix-cli-mixed-precision-overrides, 017108966, which would keep it, is not
merged into main at 067f987df); and `mixed_precision.grad_reduce_in_fp32` cannot follow a preset name in Hydra's
struct mode ("Could not override"). With `mixed_precision` null, runtime_config_update skips setup and the
model, optimizer and DDP keep the fields written here: the preset's values (its factory function, then
MixedPrecisionConfig.finalize: fp8_param / fp4_param from the *_param_gather fields), as setup would have
copied them, with grad_reduce_in_fp32 the plan's. Megatron-Bridge's performance recipes reach the same bf16
reduction in Python instead (perf_recipes/_common.py at 6124fbe, _benchmark_common and _perf_precision:
grad_reduce_in_fp32 set False on the preset object and on the DDP config), which a command line cannot do."""

from __future__ import annotations

DEFAULTS: dict[str, object] = {
    "fp32": False, "fp16": False, "bf16": False, "params_dtype": None, "pipeline_dtype": None,
    "autocast_dtype": None, "autocast_enabled": False, "grad_reduce_in_fp32": True, "fp8": None,
    "fp8_recipe": "tensorwise", "first_last_layers_bf16": False, "fp8_margin": 0, "fp8_amax_history_len": 1,
    "fp8_amax_compute_algo": "most_recent", "fp8_wgrad": True, "fp8_dot_product_attention": False,
    "fp8_multi_head_attention": False, "fp8_param": None, "fp8_param_gather": False, "fp4": None,
    "fp4_recipe": "nvfp4", "fp4_param": None, "fp4_param_gather": False, "loss_scale": None,
    "initial_loss_scale": 4294967296, "min_loss_scale": 1.0, "loss_scale_window": 1000, "hysteresis": 2,
    "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 0, "reuse_grad_buf_for_mxfp8_param_ag": False,
}
"""MixedPrecisionConfig's field defaults (training/mixed_precision.py at 6124fbe; initial_loss_scale 2**32 as an
integer, so that Hydra reads it exactly)."""

BF16 = {"bf16": True, "params_dtype": "bfloat16", "pipeline_dtype": "bfloat16", "grad_reduce_in_fp32": True}
FP16 = {"fp16": True, "params_dtype": "float16", "pipeline_dtype": "float16", "grad_reduce_in_fp32": False}
CURRENT = {"fp8": "hybrid", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True, "fp8_param_gather": True}

FIELDS: dict[str, dict[str, object]] = {
    "bf16_mixed": BF16,
    "fp16_mixed": FP16,
    "bf16_with_fp8_delayed_scaling_mixed": {**BF16, "fp8": "hybrid", "fp8_recipe": "delayed", "fp8_margin": 0,
                                            "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max",
                                            "fp8_param_gather": True},
    "bf16_with_mxfp8_mixed": {**BF16, "fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True,
                              "reuse_grad_buf_for_mxfp8_param_ag": True},
    "bf16_with_fp8_current_scaling_mixed": {**BF16, **CURRENT, "num_layers_at_start_in_bf16": 1,
                                            "num_layers_at_end_in_bf16": 1},
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": {**BF16, **CURRENT, "num_layers_at_start_in_bf16": 2,
                                                       "num_layers_at_end_in_bf16": 2},
    "bf16_with_fp8_subchannel_scaling_mixed": {**BF16, "fp8": "hybrid", "fp8_recipe": "blockwise"},
    "bf16_with_nvfp4_mixed": {**BF16, "fp4": "e2m1", "fp4_recipe": "nvfp4", "fp4_param_gather": True},
    "nemotron_3_super_bf16_with_nvfp4_mixed": {**BF16, "fp4": "e2m1", "fp4_recipe": "nvfp4",
                                               "fp4_param_gather": True, "first_last_layers_bf16": True,
                                               "num_layers_at_end_in_bf16": 14},
}
"""Each preset export.bridge names: the fields its factory function sets over DEFAULTS (training/mixed_precision.py
at 6124fbe: bf16_mixed, fp16_mixed and the presets built on bf16_mixed)."""

TARGETS: dict[str, tuple[str, ...]] = {
    "model": ("fp16", "bf16", "params_dtype", "pipeline_dtype", "autocast_dtype", "fp8", "fp8_recipe",
              "first_last_layers_bf16", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_wgrad",
              "fp8_dot_product_attention", "fp8_multi_head_attention", "fp8_param", "fp4", "fp4_recipe",
              "fp4_param", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"),
    "optimizer": ("fp16", "bf16", "params_dtype", "fp8_recipe", "loss_scale", "initial_loss_scale",
                  "min_loss_scale", "loss_scale_window", "hysteresis", "reuse_grad_buf_for_mxfp8_param_ag"),
    "ddp": ("grad_reduce_in_fp32", "fp8_param_gather", "fp4_param_gather", "reuse_grad_buf_for_mxfp8_param_ag"),
}
"""The MixedPrecisionConfig fields each config has (TransformerConfig, OptimizerConfig,
DistributedDataParallelConfig, as tests/data/launchers/megatron-bridge.json records them): what setup copies."""


def preset_values(name: str, amend: dict[str, object]) -> dict[str, object]:
    """The preset's fields after its factory, `amend` (the export's own mixed_precision.* settings) and finalize
    (fp8_param / fp4_param follow fp8_param_gather / fp4_param_gather: MixedPrecisionConfig.__setattr__ keeps
    them in sync once set, finalize fills them when None)."""
    values = {**DEFAULTS, **FIELDS[name], **amend}
    values["fp8_param"], values["fp4_param"] = values["fp8_param_gather"], values["fp4_param_gather"]
    return values


def written_out(name: str, amend: dict[str, object]) -> list[tuple[str, object]]:
    """`mixed_precision` null, then every field the preset's setup would copy, on the config that holds it."""
    values = preset_values(name, amend)
    return [("mixed_precision", None)] + [(f"{section}.{field}", values[field])
                                          for section, fields in TARGETS.items() for field in fields]
