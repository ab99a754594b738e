"""Activation offload to host memory (ParallelPlan.offload_layers): what leaves HBM and what the copies cost.

Megatron-Core's layer-level offload (--cpu-offloading-num-layers N) runs every transformer layer under
Transformer Engine's CPU-offload context: the saved activations of the first N layers are copied to pinned host
memory on a side stream during forward and copied back during backward, beside the compute. Transformer
Engine's default schedule (transformer_engine/pytorch/cpu_offload.py, DefaultOffloadSynchronizer, TE >= 2.10)
lets layer i's copy run until layer L - N + i starts its forward, and starts its reload L - N - 1 layers
before its backward, so that at most L - N layers' activations are on the GPU at once.

All functions are pure and work elementwise on plan arrays (llmplan/arith.py).
"""

from __future__ import annotations

from typing import Any

from llmplan.arith import maximum, minimum, where
from llmplan.cost.activations import layer_activations
from llmplan.cost.params import stage_layers
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ParallelPlan


def offloaded_share(plan: ParallelPlan, layers: Any) -> Any:
    """Share of a stage's transformer-layer activations (one micro-batch) that sit in host memory at the peak,
    the end of the forward pass: N of its L layers, the average layer's bytes each (exact for a stack of
    identical layers). Source: NVIDIA/TransformerEngine transformer_engine/pytorch/cpu_offload.py
    (get_cpu_offload_context: activation memory (num_layers - num_offloaded_layers) x T).
    Derived: docs/formulas.md#mem.offload"""
    return where(layers > 0, minimum(plan.offload_layers, layers) / maximum(layers, 1), 0.0)


def offload_layer_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes of one average layer's saved activations of one micro-batch: what one offloaded layer copies to
    host memory in forward and back in backward (offload runs without pipeline stages, check_plan, so the
    stage is the whole stack). 0 without offload. Derived: docs/formulas.md#mem.offload"""
    if not plan.offload_layers:
        return 0.0
    la = layer_activations(m, plan)
    n_dense, n_moe = stage_layers(m, plan, 0)
    return (n_dense * la.dense + n_moe * la.moe) / maximum(n_dense + n_moe, 1)


def offload_exposed(m: ModelSpec, plan: ParallelPlan, copy_s: Any, pass_s: Any) -> Any:
    """Seconds one pass (forward or backward) of one micro-batch waits for the offload copies. The pass runs
    L layers of t = pass_s / L each; the N = offload_layers copies (copy_s each) run one after another on a
    side stream. Forward: layer q's copy to host starts when its compute ends, and layer L - N + q starts only
    when it is done. Backward, in backward order: the reload of layer N - 1 - q starts as step q + 1 begins,
    and that layer's backward, step L - N + q, waits for it. Both: the q-th copy is released at the end of
    step q and due before step q + 1 + g, g = L - N - 1; a late copy holds the compute back, which delays the
    later releases. Walked layer by layer (elementwise on arrays): exact for that schedule.
    Source: NVIDIA/TransformerEngine transformer_engine/pytorch/cpu_offload.py (DefaultOffloadSynchronizer:
    finish_offload_map, start_reload_map). Derived: docs/formulas.md#mem.offload"""
    L = m.num_hidden_layers
    n = min(int(plan.offload_layers), L - 1)
    t = pass_s / L
    gap = L - n - 1
    end, free, waited = 0.0 * t, 0.0 * t, 0.0 * t
    done: list[Any] = []  # when each copy is done
    for k in range(L if n > 0 else 0):
        if 0 <= k - gap - 1 < n:  # this layer waits for copy k - gap - 1
            late = maximum(done[k - gap - 1] - end, 0.0)
            waited, end = waited + late, end + late
        end = end + t
        if k < n:
            free = maximum(free, end) + copy_s
            done.append(free)
    return waited


def host_offload_bytes(m: ModelSpec, plan: ParallelPlan) -> Any:
    """Bytes of host memory one GPU's offloaded activations take at the peak (the end of the forward pass): N of
    the L layers at offload_layer_bytes each, one micro-batch in flight (offload runs without pipeline stages,
    check_plan). Equals ActivationBytes.offloaded of training_memory (tested); the GPUs of a node share its
    host memory (SystemSpec.host_usable_bytes, check_plan rule offload_host_memory).
    Derived: docs/formulas.md#mem.host"""
    return offload_layer_bytes(m, plan) * minimum(plan.offload_layers, m.num_hidden_layers)
