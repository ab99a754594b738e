"""A checkpoint of the whole job holds the MTP modules' weights and optimizer state (stop 65 #7): one weight set
under mtp_repeated_layer, one per module otherwise.

The hand count is DeepSeek-V3's MTP module from its config.json (deepseek-ai/DeepSeek-V3: hidden_size 7168,
moe_intermediate_size 2048, n_routed_experts 256, n_shared_experts 1, q_lora_rank 1536, kv_lora_rank 512,
qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, num_attention_heads 128) and the module's tensors
as its README_WEIGHTS.md lists them (a full MoE transformer layer, enorm, hnorm, eh_proj, shared_head.norm;
its embed_tokens and shared_head.head are the main model's, shared, so not counted again). Cross-check: the
model card gives 685B on Hugging Face = 671B main + 14B MTP; the module below plus the two shared 129,280 x
7,168 tensors the release stores again is 13.46B, which rounds with the card's figures (684.5 - 671.0)."""

from __future__ import annotations

import pytest

from llmplan.cost.goodput import checkpoint_job_bytes, checkpoint_rank_bytes
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()

H, FFN, E, HEADS = 7168, 2048, 256, 128
MLA = (H * 1536 + 1536 + 1536 * HEADS * (128 + 64)  # q_a_proj, q_a_layernorm, q_b_proj
       + H * (512 + 64) + 512 + 512 * HEADS * (128 + 128)  # kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
       + HEADS * 128 * H)  # o_proj
MOE = (E + 1) * 3 * H * FFN + E * H + E  # routed + shared experts, gate, e_score_correction_bias
MTP_MODULE = MLA + MOE + 2 * H * H + 5 * H  # eh_proj; input/post-attention norms, enorm, hnorm, shared_head.norm
ADAM = 2 + 4 + 4 + 4  # bf16 weight, fp32 master and two moments (ZeRO Section 3.1; gradients are not saved)


def plan() -> ParallelPlan:
    return ParallelPlan(tp=2, pp=8, dp=16, ep=32, etp=1, sp=True, zero=1, recompute="full", micro_batch=1,
                        global_batch=512, seq_len=4096, pp_first=7, pp_last=6)


def with_mtp(n: int, repeated: bool):
    return M["deepseek-v3"].model_copy(update={"num_nextn_predict_layers": n, "mtp_repeated_layer": repeated})


def test_hand_count_matches_the_card():
    assert MTP_MODULE == 11_610_068_224
    shared = 2 * 129_280 * H  # the embedding and head the release stores with the module again
    assert 13.5e9 <= MTP_MODULE + shared + 0.5e9 and MTP_MODULE + shared - 0.5e9 <= 14.5e9  # 685B - 671B


@pytest.mark.parametrize("n,repeated,modules", [(1, False, 1), (2, False, 2), (2, True, 1), (3, True, 1)])
def test_job_checkpoint_holds_each_mtp_weight_set_once(n, repeated, modules):
    p = plan()
    extra = checkpoint_job_bytes(with_mtp(n, repeated), p) - checkpoint_job_bytes(with_mtp(0, False), p)
    assert extra == pytest.approx(modules * MTP_MODULE * ADAM, rel=1e-9)


def test_busiest_ranks_share_and_the_job_agree_on_the_mtp_module():
    # the ranks' shares (which counted the module on the last stage before) add up to at least the job's bytes
    p, m = plan(), with_mtp(1, False)
    assert checkpoint_job_bytes(m, p) <= checkpoint_rank_bytes(m, p) * p.num_gpus
