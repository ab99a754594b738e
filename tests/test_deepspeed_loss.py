"""DeepSpeed's unfused loss at tp > 1 (unfused_loss_impl eager-vocab-parallel, docs/validation.md#edges-70):
deepspeedai/DeepSpeed deepspeed/sequence/cross_entropy.py at a64a221ef, _VocabParallelCrossEntropy (backend torch),
takes `logits = vocab_parallel_logits.float()` beside its 16-bit input, then `exp_logits = torch.exp(logits -
global_max...)`, a new fp32 tensor for the difference and another for its exp: 2 + 4 + 4 + 4 = 14 bytes a logit at
once in the forward, above PyTorch's eager cross_entropy's 12 (its backward: the log_softmax output, the incoming
gradient and the input gradient, three fp32 copies). At tp 1 DeepSpeed runs the Hugging Face model's eager loss."""

from __future__ import annotations

import json

import pytest

from llmplan.cost.memory import activation_bytes
from llmplan.export.common import UNFUSED_LOSS_RUNS
from llmplan.specs.plan import ParallelPlan
from llmplan.specs.registry import builtin_models

M = builtin_models()


@pytest.mark.parametrize(("tp", "per_logit"), [(1, 12), (2, 14), (8, 14)])
def test_deepspeed_vocab_parallel_loss_holds_four_tensors_of_the_logits_at_once(tp, per_logit):
    m = M["llama-3.1-8b"]
    base = dict(tp=tp, dp=8 // tp, zero=3, recompute="full", seq_len=4096, global_batch=8 // tp, fused_loss=False)
    ds = activation_bytes(m, ParallelPlan(**base, unfused_loss_impl="eager-vocab-parallel"), 0).output
    eager = activation_bytes(m, ParallelPlan(**base), 0).output
    fused = activation_bytes(m, ParallelPlan(**{**base, "fused_loss": True}), 0).output
    logits = (eager - fused) / (12 - 4)  # the rank's logits (its padded vocabulary shard x tokens): fused holds 4
    assert logits == pytest.approx(4096 * m.vocab_size / tp, rel=0.01)
    assert ds - eager == pytest.approx((per_logit - 12) * logits)


def test_deepspeed_export_runs_the_vocab_parallel_loss_at_tp_above_one(cli, tmp_path):
    # a search for DeepSpeed prices its loss (export.common.UNFUSED_LOSS_RUNS); the same plan priced with eager's
    # 12 bytes a logit at tp 2 is refused with the fix, and a tp 1 plan priced eager is exported (priced alike)
    assert UNFUSED_LOSS_RUNS["deepspeed"] == "eager-vocab-parallel"
    common = ("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--global-batch", "64",
              "--seq-len", "4096", "--target", "deepspeed", "--top", "1")
    for tp in (2, 1):
        saved = tmp_path / f"tp{tp}.json"
        r = cli(*common, "--tp", str(tp), "--save", saved)
        assert r.code == 0, r.err
        doc = json.loads(saved.read_text())
        assert doc["plan"]["unfused_loss_impl"] == "eager-vocab-parallel" and not doc["plan"]["fused_loss"]
        assert cli("export", saved, "--to", "deepspeed", "-o", tmp_path / f"ok{tp}").code == 0
        doc["plan"]["unfused_loss_impl"] = "eager"
        saved.write_text(json.dumps(doc))
        r = cli("export", saved, "--to", "deepspeed", "-o", tmp_path / f"eager{tp}")
        if tp == 2:
            assert r.code == 2 and "re-plan with --unfused-loss-impl eager-vocab-parallel" in r.err, r.err
        else:
            assert r.code == 0, r.err
