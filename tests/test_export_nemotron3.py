"""Issue 40: a built-in Nemotron-3 plan (hybrid Mamba-2 + latent MoE + MTP) exports to Megatron-LM, through the
real CLI (`llmplan search --save`, `llmplan export --to all`), with the flags NVIDIA's own Megatron-LM launch of
the model uses; the targets that cannot run it say why and name a target that can; every script written parses
(`bash -n`) and fits 80 columns. Serving exports of nemotron-3-super and qwen3-next parse with vLLM's and
SGLang's recorded parsers.

Expected values come from public sources, not from llmplan: NVIDIA/Megatron-LM
examples/post_training/modelopt/conf/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16.sh at d98e8a6 (MODEL_ARGS:
--num-experts 512, --moe-router-topk 22, --moe-latent-size 1024, ..., --hybrid-layer-pattern MEMEMEM*E...), and
the model's HF config.json mtp_hybrid_override_pattern "*E" with num_nextn_predict_layers 1 (quoted in
model_specs/nemotron-3-super.yaml's source)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from llmplan.export.hybrid import pattern_variable
from llmplan.planfile import load_plan
from tests.test_export import parse_serve_export, recorded_parser

# Megatron-LM d98e8a6, NVIDIA-Nemotron-3-Super-120B-A12B-BF16.sh: --hybrid-layer-pattern
SUPER_PATTERN = ("MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME")
# the same file's MoE / Mamba / attention flags (the values it passes)
SUPER_FLAGS = {"num_experts": "512", "moe_router_topk": "22", "moe_latent_size": "1024",
               "moe_shared_expert_intermediate_size": "5376", "moe_router_score_function": "sigmoid",
               "mamba_num_heads": "128", "mamba_head_dim": "64", "hidden_size": "4096", "ffn_hidden_size": "2688",
               "num_attention_heads": "32", "num_query_groups": "2", "kv_channels": "128",
               "position_embedding_type": "none", "normalization": "RMSNorm"}
SUPER_SWITCHES = ("squared_relu", "moe_router_enable_expert_bias", "group_query_attention",
                  "untie_embeddings_and_output_weights", "disable_bias_linear")
MTP_MODULE = "*E"  # HF config.json mtp_hybrid_override_pattern of Nemotron-3 Super


@pytest.fixture(scope="module")
def super_export(tmp_path_factory):
    """The walkthrough of issue 40: search nemotron-3-super on 8 DGX H100 nodes for Megatron-LM (--target megatron:
    the search keeps only plans that target writes; untargeted, #1 may be a plan only a target that cannot run a
    hybrid stack writes, e.g. ZeRO-3; ZeRO-2 it writes as Megatron-FSDP's optim_grads where it runs as priced,
    export.megatron.fsdp_zero2_refusals), save, export --to all."""
    from llmplan.cli import main

    d = tmp_path_factory.mktemp("n3")
    plan, out = d / "plan.json", d / "out"
    # --tp 1 --pp 2 (pp 2, vpp 4, so the pattern is split at 8 chunks), at about a quarter of the unpinned
    # search's CPU (3.2 against 12.7 s, 2026-12-07); what the tests below check (the model's flags, the split
    # pattern, the MTP module, the refusals) does not depend on the rest of the space. The unpinned search's #1 is
    # tp 2 pp 1 (277.2k tokens/s, tied with this layout's 283.5k: fewer parallel axes), at any --top since
    # docs/validation.md#search-superset (before, at --top 1 it showed this layout with hybridep, 275.2k).
    # The memory switches and the EP dispatch are pinned to what that search picks (bf16 gradients, no fp8
    # weights, DeepEP with its own kernels, EP overlap on; 2026-12-07): the saved plan is the same file but for its
    # "created" time, from 2 searches instead of 7 (1.7 against 6.8 CPU-s).
    for args in (["search", "--model", "nemotron-3-super", "--hardware", "dgx-h100", "--nodes", "8", "--top", "1",
                  "--tp", "1", "--pp", "2", "--target", "megatron", "--grad-dtype", "bf16", "--no-fp8-params",
                  "--moe-dispatcher", "deepep", "--moe-flex-backend", "deepep", "--ep-comm-overlap",
                  "--save", str(plan)],
                 ["export", str(plan), "--to", "all", "-o", str(out)]):
        try:
            main(args)
        except SystemExit as e:
            assert e.code in (0, None), (args, e.code)
    return load_plan(plan), out


def run_argv(script: Path, tmp_path: Path, entry_script: str = "pretrain_hybrid.py") -> list[str]:
    """The arguments the script passes to Megatron-LM's `entry_script`: bash runs it with a torchrun that prints
    its own arguments, one per line, so the shell's expansion (the pattern variable, the arrays) is what is
    parsed."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (stub / "torchrun").chmod(stat.S_IRWXU)
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                       env={"PATH": f"{stub}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")})
    assert r.returncode == 0, r.stderr
    argv = r.stdout.splitlines()
    entry = next(i for i, a in enumerate(argv) if a.endswith(entry_script))
    return argv[entry + 1:]


def test_nemotron3_super_exports_to_megatron_with_its_flags(super_export, tmp_path):
    pf, out = super_export
    ap, rec = recorded_parser("megatron-lm")
    ns, unknown = ap.parse_known_args(run_argv(out / "megatron_pretrain.sh", tmp_path))
    assert not unknown, f"flags Megatron-LM ({rec['commit'][:10]}) does not define: {unknown}"
    for key, value in SUPER_FLAGS.items():
        assert str(getattr(ns, key)) == value, key
    assert float(ns.moe_router_topk_scaling_factor) == 5.0
    assert all(getattr(ns, k) for k in SUPER_SWITCHES)
    # the unified pattern: the published main pattern split at the plan's pipeline chunks, then one MTP module
    main, *mtp = ns.hybrid_layer_pattern.split("/")
    assert main.replace("|", "") == SUPER_PATTERN
    assert main.count("|") + 1 == pf.plan.pp * pf.plan.vpp
    assert mtp == [MTP_MODULE] and int(ns.mtp_num_layers) == 1
    assert int(ns.num_layers) == len(SUPER_PATTERN)


def test_nemotron3_super_refusals_name_a_target_that_runs_it(super_export):
    from llmplan.export import render_all
    from llmplan.export.common import CannotExpress

    pf, out = super_export
    assert (out / "megatron_pretrain.sh").exists()
    for target in ("megatron-bridge", "torchtitan", "torchtitan-0.2"):
        with pytest.raises(CannotExpress) as e:
            render_all(pf, target)
        assert "hybrid layer stack of nemotron-3-super" in str(e.value) and "export to megatron" in str(e.value)


def test_every_exported_script_is_bash_clean_and_80_columns(super_export):
    _, out = super_export
    scripts = [f for f in out.iterdir() if f.suffix in (".sh", ".sbatch")]
    assert {f.name for f in scripts} >= {"megatron_pretrain.sh", "torchrun.sh", "job.sbatch"}
    for f in scripts:
        r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, (f.name, r.stderr)
        # exempt, as tests/test_export.py decides: a comment line of one word longer than a line (the spec's
        # published pattern in the header)
        wide = [n for n, line in enumerate(f.read_text().splitlines(), 1) if len(line) > 80
                and not (line.startswith("#") and len(line.lstrip("# ").split()) <= 1)]
        assert not wide, (f.name, wide)


@pytest.mark.parametrize("pattern", ["ME", "M*|EM/*E", SUPER_PATTERN + "|" + SUPER_PATTERN + "/*E/*E"])
def test_pattern_variable_gives_bash_the_same_pattern(pattern, tmp_path):
    flags, lines = pattern_variable(["--num-layers 2", f'--hybrid-layer-pattern "{pattern}"'])
    assert flags[0] == "--num-layers 2" and all(len(x) <= 80 for x in lines)
    script = tmp_path / "p.sh"
    script.write_text("\n".join(lines) + f"\nARGS=({' '.join(flags)})\nprintf '%s\\n' \"${{ARGS[@]}}\"\n")
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert r.stdout.splitlines() == ["--num-layers", "2", "--hybrid-layer-pattern", pattern]


@pytest.mark.parametrize("model", ["nemotron-3-super", "qwen3-next-80b-a3b"])
@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_hybrid_serving_exports_parse(cli, tmp_path, model, target):
    plan = tmp_path / "s.json"
    r = cli("search", "--mode", "infer", "--model", model, "--hardware", "dgx-h100", "--top", "1",
            "--save", plan)
    assert r.code == 0, r.err
    ns, unknown = parse_serve_export(load_plan(plan), target)
    assert not unknown, unknown
    # the recurrent state in the dtype the plan priced (bf16), not the engine's default
    assert (ns.mamba_ssm_cache_dtype if target == "vllm" else ns.mamba_ssm_dtype) == "bfloat16"


def test_qwen3_next_trains_on_megatron_with_gated_deltanet(cli, tmp_path):
    plan = tmp_path / "q.json"
    r = cli("estimate", "--model", "qwen3-next-80b-a3b", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "2",
            "--pp", "2", "--ep", "8", "--save", plan)
    assert r.code in (0, 3), r.err
    assert cli("export", plan, "--to", "megatron", "-o", tmp_path / "o").code == 0
    ns, unknown = recorded_parser("megatron-lm")[0].parse_known_args(
        run_argv(tmp_path / "o" / "megatron_pretrain.sh", tmp_path))
    assert not unknown
    # Qwen3-Next: 48 layers, every 4th gated attention, the rest Gated DeltaNet, each with an MoE block
    # (Qwen/Qwen3-Next-80B-A3B-Instruct config.json: full_attention_interval 4)
    main = ns.hybrid_layer_pattern.split("/")[0].replace("|", "")
    assert re.fullmatch(r"(GEGEGE\*E){12}", main), main
    assert ns.attention_output_gate


def test_a_zero3_hybrid_plan_is_told_a_fix_that_exports(cli, tmp_path):
    # gb200-nvl72, 8 nodes: a nemotron-3-super plan sharded with ZeRO-3 but priced without Megatron-FSDP, which
    # Megatron-LM's distributed optimizer does not run; the export runs ZeRO-3 only as Megatron-FSDP
    # optim_grads_params (docs/validation.md#mfsdp-plan), whose buffers that plan's price omits, and torchtitan /
    # DeepSpeed refuse the hybrid; the refusal's fix (re-price with --megatron-fsdp) must be one that then exports.
    base = ["--model", "nemotron-3-super", "--hardware", "gb200-nvl72", "--nodes", "8", "--tp", "1", "--pp", "1",
            "--ep", "32"]
    assert cli("estimate", *base, "--zero", "3", "--save", tmp_path / "z3.json").code in (0, 3)
    r = cli("export", tmp_path / "z3.json", "--to", "megatron", "-o", tmp_path / "a")
    assert r.code == 2 and "priced without megatron_fsdp" in r.err and "with --megatron-fsdp" in r.err
    assert "torchtitan" not in r.err
    # ZeRO-3 with the switch the fix names (Megatron-FSDP's memory priced: docs/validation.md#mfsdp-follow), and
    # ZeRO-2 with it, and ZeRO-1 (Megatron's distributed optimizer) all export
    for z, extra in (("3", ["--megatron-fsdp"]), ("2", ["--megatron-fsdp"]), ("1", [])):
        assert cli("estimate", *base, "--zero", z, *extra, "--save", tmp_path / f"m{z}.json").code in (0, 3)
        assert cli("export", tmp_path / f"m{z}.json", "--to", "megatron", "-o", tmp_path / f"b{z}").code == 0
