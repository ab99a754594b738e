"""A disaggregated decode pool under speculative decoding (docs/formulas.md#serve.phase, #serve.disagg): the pool's
step is the speculative step (k draft steps + one verification step of k + 1 tokens per sequence), its TPOT is
that step over the expected tokens per step (Leviathan et al. 2023, eq. (1): (1 - a^(k+1)) / (1 - a)), its
memory carries the draft, and it agrees with the co-located estimate's speculative step for the same plan and
batch. Expected values are worked out by hand from those rules or taken from the co-located path."""

from __future__ import annotations

import pytest

LLAMA = ("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1", "--batch", "64",
         "--engine", "vllm", "--json")
EAGLE = ("--speculative", "eagle", "--spec-tokens", "3")
# DeepSeek-V3's decode pool on 72 H100s (LMSYS 2025-05-05 layout, as tests/test_serve_phases.py DECODE), with MTP
DSV3 = ("estimate", "--mode", "infer", "-m", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "9", "--tp", "1",
        "--dp", "72", "--ep", "72", "--dtype", "fp8", "--engine", "sglang", "--input-len", "2000", "--output-len",
        "100", "--batch", "64", "--dp-attention", "--moe-dispatcher", "deepep", "--two-batch-overlap",
        "--redundant-experts", "32", "--memory-fraction", "0.9", "--json")
# (--memory-fraction 0.9: as tests/test_serve_phases.py DECODE; SGLang's own default for this server is < 0)
MTP = ("--speculative", "mtp", "--spec-tokens", "1")


def _doc(cli, *args: str) -> dict:
    r = cli(*args)
    assert r.code == 0, r.err
    return r.json()


@pytest.mark.parametrize("base,spec", [(LLAMA, EAGLE), (DSV3, MTP)], ids=["llama-eagle", "dsv3-mtp"])
def test_speculative_decode_phase_is_the_colocated_speculative_step(cli, base, spec):
    # Agreement: the decode pool at batch B prices the same speculative step (draft, verification, tokens per step)
    # and TPOT as the co-located estimate of the same plan at the same batch; and the same memory (draft included).
    ph_doc = _doc(cli, *base, *spec, "--phase", "decode")
    co = _doc(cli, *base, *spec, "--phase", "both")
    ph, sp = ph_doc["phase"], co["speculative"]
    assert ph["speculative"]["draft_s"] == pytest.approx(sp["draft_s"], rel=1e-12)
    assert ph["speculative"]["verify_s"] == pytest.approx(sp["verify_s"], rel=1e-12)
    assert ph["speculative"]["tokens_per_step"] == sp["tokens_per_step"]
    assert ph["speculative"]["acceptance_rate"] == sp["acceptance_rate"]
    assert ph["step_s"] == pytest.approx(sp["step_s"], rel=1e-12)
    assert ph["tpot_s"] == pytest.approx(co["tpot_s"], rel=1e-12)
    assert ph["tpot_s"] == pytest.approx(ph["step_s"] / ph["speculative"]["tokens_per_step"], rel=1e-12)
    gpus_per_replica = 1
    assert ph["output_tokens_per_s_per_gpu"] == pytest.approx(64 / ph["tpot_s"] / gpus_per_replica, rel=1e-12)
    assert ph_doc["memory"] == co["memory"]


def test_plain_decode_phase_agrees_with_the_colocated_tpot_and_has_no_speculative_key(cli):
    ph_doc = _doc(cli, *LLAMA, "--phase", "decode")
    co = _doc(cli, *LLAMA, "--phase", "both")
    assert "speculative" not in ph_doc["phase"]
    assert ph_doc["phase"]["tpot_s"] == ph_doc["phase"]["step_s"] == pytest.approx(co["tpot_s"], rel=1e-12)


def test_speculative_decode_phase_moves_the_expected_way(cli):
    plain = _doc(cli, *LLAMA, "--phase", "decode")
    spec = _doc(cli, *LLAMA, *EAGLE, "--phase", "decode")
    p, s = plain["phase"], spec["phase"]
    # EAGLE's default acceptance 0.75 (specs.serve.ACCEPTANCE) at k = 3: 1 + .75 + .75^2 + .75^3 = 2.734375 tokens
    assert s["speculative"]["tokens_per_step"] == pytest.approx(2.734375, rel=1e-12)
    # a step carries k draft steps and 4 tokens per sequence: longer than a one-token step, yet per token shorter
    assert s["step_s"] > p["step_s"] and s["tpot_s"] < p["tpot_s"]
    assert s["output_tokens_per_s_per_gpu"] > p["output_tokens_per_s_per_gpu"]
    # memory carries the EAGLE head: one Llama-3.1-8B decoder layer (attention 4096 x (4096 + 2 x 1024 + 4096),
    # SwiGLU 3 x 4096 x 14336) and its 2h -> h input projection, bf16 (norms aside: within 0.01%)
    head = (4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096 * 4096) * 2
    assert spec["memory"]["weights"] - plain["memory"]["weights"] == pytest.approx(head, rel=1e-4)
    # ... and the draft's KV and the k draft slots: fewer tokens fit per GPU
    assert s["kv_capacity_tokens_per_gpu"] < p["kv_capacity_tokens_per_gpu"]
    assert s["max_concurrent_seqs"] < p["max_concurrent_seqs"]
    # nothing accepted: one token per (longer) step, slower than plain decoding
    none = _doc(cli, *LLAMA, *EAGLE, "--acceptance", "0", "--phase", "decode")["phase"]
    assert none["speculative"]["tokens_per_step"] == 1.0 and none["tpot_s"] == none["step_s"] > p["tpot_s"]


def test_mtp_decode_phase_adds_the_draft_layers_exchange(cli):
    # DeepSeek-V3's MTP layer is an MoE layer: its draft passes dispatch b (k + 1) tokens (SGLang's draft extend
    # after verification) and b for each other pass, the verification step b (k + 1); the plain step b.
    plain = _doc(cli, *DSV3, "--phase", "decode")["phase"]
    spec = _doc(cli, *DSV3, *MTP, "--phase", "decode")["phase"]
    assert plain["expert_exchange_s"] > 0
    assert spec["expert_exchange_s"] > plain["expert_exchange_s"]
    assert spec["speculative"]["draft_s"] > 0


def test_decode_phase_verification_pays_the_speculative_servers_padding(cli):
    # 100 requests x 4 tokens = 400: a list holding 400 replays the verification step unpadded, one whose next
    # size is 512 pads it by 112 tokens (graph_padded_tokens, vLLM counts tokens); so does the draft's first pass
    # over the same 400 tokens (cost.speculative.draft_pass_graphs); its one-token passes pad 100 to 128 in both.
    def phase(sizes: str) -> dict:
        return _doc(cli, "estimate", "--mode", "infer", "-m", "deepseek-v3", "--hardware", "dgx-h200", "--tp", "8",
                    *MTP[:-1], "3", "--batch", "100", "--phase", "decode", "--cuda-graph-sizes", sizes,
                    "--json")["phase"]["speculative"]
    exact = phase("1,2,4,8,16,32,64,128,256,400,512")
    padded = phase("1,2,4,8,16,32,64,128,256,512")
    assert padded["verify_s"] > exact["verify_s"] and padded["draft_s"] > exact["draft_s"]


def test_disaggregated_search_prices_speculative_decode_pools(cli):
    base = ("search", "--mode", "infer", "--disaggregated", "-m", "llama-3.1-8b", "--hardware", "dgx-h100",
            "--engine", "vllm", "--json")
    plain = _doc(cli, *base)
    spec = _doc(cli, *base, *EAGLE)
    assert spec["plans"] and plain["plans"]
    for plan in spec["plans"]:
        dec = plan["decode"]
        assert dec["tpot_s"] == pytest.approx(
            (dec["speculative"]["draft_s"] + dec["speculative"]["verify_s"]) / dec["speculative"]["tokens_per_step"],
            rel=1e-12)
        # the pool's load point is the decode phase at its batch (agreement with `estimate --phase decode`)
        one = _doc(cli, "estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp",
                   str(dec["tp"]), "--batch", str(int(dec["batch_per_replica"])), "--engine", "vllm", *EAGLE,
                   "--phase", "decode", "--json")["phase"]
        assert dec["output_tokens_per_s_per_gpu"] == pytest.approx(one["output_tokens_per_s_per_gpu"], rel=1e-9)
    for plan in plain["plans"]:
        assert "speculative" not in plan["decode"]
    # faster decoding per GPU: the best split needs fewer decode GPUs per prefill GPU and yields more per GPU
    assert spec["plans"][0]["tokens_per_s_per_gpu"] > plain["plans"][0]["tokens_per_s_per_gpu"]


@pytest.mark.parametrize("args,needle", [
    (("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1", "--phase",
      "decode", "--speculative", "mtp", "--spec-tokens", "2"), "num_nextn_predict_layers 0"),
    (("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--tp", "1", "--pp", "2",
      "--dp", "4", "--phase", "decode", *EAGLE), "--pp 1"),
    (("search", "--mode", "infer", "--disaggregated", "-m", "llama-3.1-8b", "--hardware", "dgx-h100",
      "--speculative", "mtp", "--spec-tokens", "2"), "num_nextn_predict_layers 0"),
    (("search", "--mode", "infer", "--disaggregated", "-m", "llama-3.1-8b", "--hardware", "dgx-h100",
      "--speculative", "ngram", "--spec-tokens", "2"), "--acceptance"),
], ids=["phase-mtp-no-layers", "phase-pp", "disagg-mtp-no-layers", "disagg-ngram-no-acceptance"])
def test_bad_speculative_pools_exit_2_with_one_line(cli, args, needle):
    assert needle in cli(*args).refusal()


@pytest.mark.parametrize("spec,needle", [(("--speculative", "mtp", "--spec-tokens", "2"), "num_nextn_predict_layers 0"),
                                         (("--speculative", "ngram", "--spec-tokens", "2"), "--acceptance")],
                         ids=["mtp-no-layers", "ngram-no-acceptance"])
def test_disaggregated_search_over_pools_refuses_speculation_as_one_system_does(cli, tmp_path, spec, needle):
    # One rule (search.disagg.refuse_speculation) for both disaggregated searches: the same line, exit 2, over a
    # cluster of pools as over one system, before any split is priced.
    f = tmp_path / "c.yaml"
    f.write_text("pools:\n  - {system: dgx-h100, nodes: 1}\n  - {system: dgx-a100, nodes: 1}\nfabric: {gb_per_s: 50}\n")
    base = ("search", "--mode", "infer", "--disaggregated", "-m", "llama-3.1-8b", *spec)
    pools = cli(*base, "--hardware", str(f)).refusal()
    one = cli(*base, "--hardware", "dgx-h100").refusal()
    assert needle in pools and pools == one


@pytest.mark.parametrize("hardware", ["dgx-h100", "pools"])
@pytest.mark.parametrize("spec,needle", [(("--speculative", "mtp", "--spec-tokens", "2"), "num_nextn_predict_layers 0"),
                                         (("--speculative", "ngram", "--spec-tokens", "2"), "--acceptance")],
                         ids=["mtp-no-layers", "ngram-no-acceptance"])
def test_colocated_search_refuses_speculation_as_the_disaggregated_one_does(cli, tmp_path, hardware, spec, needle):
    # the co-located serving search, on one system or over pools, refuses the same job in the same line (exit 2)
    # where it ended with exit 3, "no serving plan fits", and every layout pruned by the one rule
    f = tmp_path / "c.yaml"
    f.write_text("pools:\n  - {system: dgx-h100, nodes: 1}\n  - {system: dgx-a100, nodes: 1}\nfabric: {gb_per_s: 50}\n")
    hw = str(f) if hardware == "pools" else hardware
    base = ("search", "--mode", "infer", "-m", "llama-3.1-8b", *spec)
    colocated = cli(*base, "--hardware", hw).refusal()
    assert needle in colocated and colocated == cli(*base, "--disaggregated", "--hardware", hw).refusal()
    doc = cli(*base, "--hardware", hw, "--json")
    assert doc.code == 2 and doc.json()["error"]["code"] == 2
