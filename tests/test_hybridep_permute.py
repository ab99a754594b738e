"""HybridEP's own token permute and unpermute (moe.hybridep_permute) in place of Transformer Engine's, counted by hand.

Sources: NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/moe/token_dispatcher.py (_HybridEPManager:
get_permuted_hidden_states_by_experts returns the dispatch output unchanged, so no TE permute, row-id map or
probs-gradient fill runs) and fused_a2a.py (HybridEPDispatch.backward is combine_with_unpermute,
HybridEPCombine.backward dispatch_with_permute); deepseek-ai/DeepEP hybrid-ep @94a9f8f6
csrc/hybrid_ep/extension/permute.cu (permute_kernel: one warp per received "dense" row, loaded once, stored to
each of the rank's routed experts; unpermute_kernel: reads each routed expert row, sums in fp32, writes the dense
row) and executor/executor.cu (the standalone permute reads the registered buffer the dispatch wrote)."""
from math import comb

import pytest

from llmplan.cost.elementwise import moe_permute_passes, moe_routing_train_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()


def flex(ep: int, backend: str, **kw) -> ParallelPlan:
    return ParallelPlan(dp=ep, ep=ep, moe_dispatcher="deepep", moe_flex_backend=backend, **kw)


def test_nemotron_3_super_ep64_by_hand():
    # 512 experts, top-22, latent width 1,024, 8 experts a rank at EP64: a token reaches
    # 64 x P(a rank holds any of its 22) ranks, one bf16 row each (2 B an element).
    m = M["nemotron-3-super"]
    rows = 64 * (1 - comb(512 - 8, 22) / comb(512, 22))
    permute = 2 * 1024 * rows + 2 * 1024 * 22  # read each received row once, write its 22 expert copies
    unpermute = 2 * 1024 * 22 + 2 * 1024 * rows  # read the 22 expert rows, write one summed row per rank
    metadata = 2 * 64 * 512  # the scan reads the gathered bool map twice, 64 ranks x 512 experts a token
    forward, backward = moe_permute_passes(m, flex(64, "hybridep"))
    assert forward == pytest.approx(permute + unpermute + metadata, rel=1e-12)
    assert backward == pytest.approx(unpermute + permute, rel=1e-12)  # the pair reversed, no probs fill


def test_no_transformer_engine_row_id_map_or_fill_with_hybridep():
    # With one rank (rows = 1) HybridEP moves TE's token bytes exactly, and neither TE's 17E row-id map (forward)
    # nor its 4E probs-gradient fill (backward): the difference is those alone.
    m = M["nemotron-3-nano"]
    E = m.num_experts
    te = moe_permute_passes(m, ParallelPlan())
    hy = moe_permute_passes(m, flex(1, "hybridep"))
    assert te[0] - hy[0] == pytest.approx(17 * E)
    assert te[1] - hy[1] == pytest.approx(4 * E)


def test_other_dispatchers_keep_transformer_engines_kernels():
    m = M["qwen3-30b-a3b"]
    te = moe_permute_passes(m, ParallelPlan())
    assert moe_permute_passes(m, ParallelPlan(dp=8, ep=8)) == te  # alltoall
    assert moe_permute_passes(m, flex(8, "deepep")) == te  # DeepEP's normal kernels, then TE's permute


def test_received_rows_grow_with_ep_and_the_rerun_charges_the_forward_again():
    m = M["nemotron-3-super"]
    f8, f64 = moe_permute_passes(m, flex(8, "hybridep"))[0], moe_permute_passes(m, flex(64, "hybridep"))[0]
    assert f64 > f8  # more ranks a token reaches, more rows to read and write
    plan = flex(64, "hybridep", seq_len=4096)
    rerun = flex(64, "hybridep", seq_len=4096, recompute="selective", recompute_modules=("moe",))
    assert 3 * (moe_routing_train_bytes(m, rerun) - moe_routing_train_bytes(m, plan)) == pytest.approx(
        f64 + (37 + 38) * m.num_experts)  # the permute pair's forward and the eager router's and its unfused
    # auxiliary loss's forward rerun (router_aux_loss_coef 1e-4: docs/formulas.md#moe.aux_loss_bytes)
