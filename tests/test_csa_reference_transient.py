"""DeepSeek-V4's compressed sparse attention off its fused path (docs/formulas.md#mem.indexer_reference): Megatron-LM
megatron/core/transformer/experimental_attention_variant/csa.py at 1e23526adc (_forward_unfused_csa) builds the fp32
causal mask [s, n_compressed] and, in training, calls FusedDSAIndexerLoss whatever dsa_indexer_loss_coeff is
(dsa.py fwd_fused_indexer_loss_naive -> compute_dsa_indexer_loss: no branch on the coefficient), so the index
scores, the KL target and the backward through the scores are those of V3.2's reference indexer with the loss on,
over the n_compressed = s / compress_rate_csa compressed keys. The fused path (fused attention on a GPU with a
published sparse gather rate: B200, GB200, GB300) holds none of it."""

from __future__ import annotations

import pytest

from llmplan.cost.activations import csa_reference_transient_bytes
from llmplan.estimate import estimate_training
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.specs.registry import builtin_models, builtin_systems

M, S = builtin_models(), builtin_systems()


@pytest.mark.parametrize(("kw", "per_pair"), [
    # by hand: V4-Flash 64 heads, H_I 64, compress_rate_csa 4; P = b (s/cp) (s/4) = 4096 x 1024 at s 4096, b 1.
    # index scores 2 x 4 x 64 = 512 B, KL target 17 x 64/t + 8, backward (4 + 1 + 4 + 4) x 64 + 4 = 836, each x P;
    # plus the fp32 causal mask, 4 B x (s/cp) x (s/4)
    ({"tp": 1}, 17 * 64 + 8 + 4),     # the target: 1096
    ({"tp": 8}, 836 + 4),             # the backward through the scores (the target is 17 x 8 + 8 = 144)
    ({"tp": 1, "cp": 2}, (17 * 64 + 8 + 4) / 2),  # the rank's s/2 query rows, every compressed key
])
def test_reference_csa_transient_by_hand(kw, per_pair):
    m = M["deepseek-v4-flash"]
    plan = ParallelPlan(**{"seq_len": 4096, **kw})
    assert csa_reference_transient_bytes(m, plan, False) == pytest.approx(per_pair * 4096 * 1024, rel=1e-12)
    assert float(csa_reference_transient_bytes(m, plan, True)) == 0.0  # fused attention, a gather rate
    unfused = plan.model_copy(update={"flash_attention": False})
    assert csa_reference_transient_bytes(m, unfused, True) == pytest.approx(per_pair * 4096 * 1024, rel=1e-12)
    assert csa_reference_transient_bytes(M["deepseek-v3.2"], plan, False) == 0.0  # its indexer: the V3.2 function
    assert csa_reference_transient_bytes(M["deepseek-v3"], plan, False) == 0.0


def test_estimate_holds_it_on_a_gpu_without_the_fused_kernels_rate():
    m = M["deepseek-v4-flash"]
    parts = {name: estimate_training(m, ClusterSpec(system=S[name], num_nodes=nodes),
                                     ParallelPlan(ep=8, dp=8, etp=1, micro_batch=1, global_batch=64, seq_len=4096,
                                                  zero=1)).memory.activation_parts
             for name, nodes in (("dgx-h100", 1), ("gb200-nvl72", 2))}  # 8 GPUs each (4 a GB200 tray)
    assert float(parts["dgx-h100"].indexer_workspace) == pytest.approx(1100 * 4096 * 1024, rel=1e-12)
    assert float(parts["gb200-nvl72"].indexer_workspace) == 0.0
