"""`llmplan export`: golden files per target for three plans (dense training, MoE training with EP,
inference), files that parse, a Megatron argument round trip, refusals, and safe writes.

Golden files live in tests/golden/export/<plan>/; after an intended change to an exporter, regenerate them
with `LLMPLAN_UPDATE_GOLDEN=1 python -m pytest tests/test_export.py` and review the diff.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from llmplan import __version__
from llmplan.export import render_all
from llmplan.export.common import CannotExpress
from llmplan.planfile import PlanFile, load_plan

HERE = Path(__file__).parent
PLANS = HERE / "data" / "plans"
GOLDEN = HERE / "golden" / "export"
CASES = {"dense_train": "all", "moe_train": "all", "fsdp_train": "all", "serve": "all", "uneven_train": "all",
         "layout_train": "all"}


def normalise(text: str) -> str:
    return text.replace(f"llmplan {__version__}", "llmplan VERSION")


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_files(case):
    files, skipped = render_all(load_plan(PLANS / f"{case}.json"), CASES[case])
    folder = GOLDEN / case
    if os.environ.get("LLMPLAN_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, text in files.items():
            (folder / name).write_text(normalise(text))
        (folder / "skipped.json").write_text(json.dumps(skipped, indent=2) + "\n")
    expected = {p.name: p.read_text() for p in folder.iterdir() if p.name != "skipped.json"}
    assert {n: normalise(t) for n, t in files.items()} == expected
    assert skipped == json.loads((folder / "skipped.json").read_text())


def _written(tmp_path: Path, case: str) -> Path:
    out = tmp_path / case
    files, _ = render_all(load_plan(PLANS / f"{case}.json"), "all")
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_file_parses_and_starts_with_the_plan(tmp_path, case):
    import tomllib

    out = _written(tmp_path, case)
    for f in out.iterdir():
        text = f.read_text()
        if f.suffix in (".sh", ".sbatch"):
            assert subprocess.run(["bash", "-n", str(f)], capture_output=True).returncode == 0, f.name
            assert text.splitlines()[1].startswith("# llmplan") and "predicted:" in text
        elif f.suffix == ".json":
            cfg = json.loads(text)
            assert cfg["comment"][0].startswith("llmplan") and any("predicted:" in c for c in cfg["comment"])
        elif f.suffix == ".toml":
            tomllib.loads(text)
            assert text.startswith("# llmplan") and "v0.2.2" in text


# Megatron-LM flag names (Megatron-LM megatron/training/arguments.py (core_v0.15.0)): the round trip accepts exactly these.
MEGATRON_VALUE_FLAGS = {
    # Megatron parses the backend into its AttnBackend enum (recorded choices print as AttnBackend.<name>).
    "--attention-backend": lambda v: v if v.startswith("AttnBackend.") else f"AttnBackend.{v}",
    "--num-layers": int, "--hidden-size": int, "--ffn-hidden-size": int, "--num-attention-heads": int,
    "--kv-channels": int, "--num-query-groups": int, "--seq-length": int, "--max-position-embeddings": int,
    "--position-embedding-type": str, "--rotary-base": int, "--rope-scaling-factor": float, "--normalization": str,
    "--num-experts": int, "--moe-router-topk": int, "--moe-ffn-hidden-size": int,
    "--moe-shared-expert-intermediate-size": int, "--moe-layer-freq": str, "--moe-token-dispatcher-type": str,
    "--q-lora-rank": int, "--kv-lora-rank": int, "--qk-head-dim": int, "--qk-pos-emb-head-dim": int,
    "--v-head-dim": int, "--tensor-model-parallel-size": int, "--pipeline-model-parallel-size": int,
    "--num-layers-per-virtual-pipeline-stage": int, "--context-parallel-size": int,
    "--expert-model-parallel-size": int, "--expert-tensor-parallel-size": int, "--micro-batch-size": int,
    "--global-batch-size": int, "--recompute-granularity": str, "--recompute-method": str,
    "--recompute-num-layers": int, "--fp8-format": str, "--attention-dropout": float, "--hidden-dropout": float,
    "--decoder-first-pipeline-num-layers": int, "--decoder-last-pipeline-num-layers": int,
    "--num-virtual-stages-per-pipeline-rank": int, "--pipeline-model-parallel-layout": str,
}


def recorded_parser(name: str, types: dict | None = None) -> tuple[argparse.ArgumentParser, dict]:
    """An argparse parser with the flags a launcher's real parser defines (tests/data/launchers/NAME.json,
    recorded by tools/launcher_flags.py; release or commit inside): an unknown flag, a switch given a value,
    a value outside the flag's choices or a missing value fails. `types` converts values for round trips."""
    rec = json.loads((HERE / "data" / "launchers" / f"{name}.json").read_text())
    ap = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    for flag, spec in rec["flags"].items():
        if flag in ("-h", "--help"):
            continue
        if spec["takes"] == "switch":
            ap.add_argument(flag, action="store_true")
        else:
            kind = (types or {}).get(flag, str)
            ap.add_argument(flag, type=kind, nargs="+" if spec["takes"] == "list" else None,
                            choices=[kind(c) for c in spec["choices"]] if "choices" in spec else None)
    return ap, rec


def parse_megatron(script: str) -> tuple[argparse.Namespace, dict[str, int]]:
    """Parse every argument array of the script with the flags of Megatron-LM's own parser (recorded from
    megatron/training/arguments.py); types for the round trip come from MEGATRON_VALUE_FLAGS."""
    ap, rec = recorded_parser("megatron-lm", MEGATRON_VALUE_FLAGS)
    args: list[str] = []
    # a hybrid's pattern is built in a variable a line at a time (export.hybrid.pattern_variable)
    pattern = "".join(re.findall(r'^HYBRID_LAYER_PATTERN\+?="([^"$`\\]*)"$', script, re.M))
    for name in ("MODEL_ARGS", "PARALLEL_ARGS", "TRAIN_ARGS", "DATA_ARGS"):
        block = re.search(rf"^{name}=\((.*?)\)[ \t]*(?:#[^\n]*)?$", script, re.S | re.M).group(1)
        block = block.replace('"$HYBRID_LAYER_PATTERN"', f'"{pattern}"')
        args += shlex.split(block.replace("${TRAIN_ITERS:-1000}", "1000"), comments=True)
    env = {k: int(v) for k, v in re.findall(r"^(NNODES|GPUS_PER_NODE)=\$\{\w+:-(\d+)\}", script, re.M)}
    ns, unknown = ap.parse_known_args(args)
    assert not unknown, f"flags Megatron-LM ({rec['commit'][:10]}) does not define: {unknown}"
    return ns, env


@pytest.mark.parametrize("case", ["dense_train", "moe_train", "uneven_train", "layout_train"])
def test_megatron_round_trip(case):
    pf = load_plan(PLANS / f"{case}.json")
    files, _ = render_all(pf, "megatron")
    ns, env = parse_megatron(files["megatron_pretrain.sh"])
    p = pf.plan
    tp, pp, cp = ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.context_parallel_size
    dp = env["NNODES"] * env["GPUS_PER_NODE"] // (tp * pp * cp)  # Megatron: DP = world / (TP x PP x CP)
    assert (tp, pp, dp, cp) == (p.tp, p.pp, p.dp, p.cp)
    assert (ns.expert_model_parallel_size or 1) == p.ep
    assert (ns.micro_batch_size, ns.global_batch_size) == (p.micro_batch, p.global_batch)
    assert ns.global_batch_size % (ns.micro_batch_size * dp) == 0
    assert ns.sequence_parallel == p.sp and ns.use_distributed_optimizer == (p.zero == 1)
    if p.vpp > 1:
        assert pf.model.num_hidden_layers // pp // ns.num_layers_per_virtual_pipeline_stage == p.vpp
    assert ns.num_layers == pf.model.num_hidden_layers and ns.num_query_groups == pf.model.kv_heads
    assert (ns.decoder_first_pipeline_num_layers or 0, ns.decoder_last_pipeline_num_layers or 0) == (p.pp_first,
                                                                                                     p.pp_last)
    # Llama-style models train without dropout; Megatron's default (0.1) must not apply.
    assert (ns.attention_dropout, ns.hidden_dropout) == (pf.model.attention_dropout, pf.model.hidden_dropout)


def test_deepspeed_batch_identity():
    files, _ = render_all(load_plan(PLANS / "dense_train.json").__class__(
        **{**load_plan(PLANS / "dense_train.json").__dict__,
           "plan": load_plan(PLANS / "dense_train.json").plan.model_copy(update={"sp": False, "vpp": 1, "grad_reduce": "all-reduce",
                                                                  "grad_accumulation": "cast-add",
                                                                  "overlap_param_gather": False,
                                                                  # the pipeline engine runs without AutoTP
                                                                  "tp": 1, "dp": 16})}),
        "deepspeed")
    cfg = json.loads(files["ds_config.json"])
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 16
    assert cfg["zero_optimization"]["stage"] == 1 and cfg["bf16"]["enabled"] is True


ASSIGNMENTS = re.compile(r"^\s*(?:[A-Z_][A-Z0-9_]*=\S+\s+)*")
"""Environment assignments before a command (CUDA_VISIBLE_DEVICES=0,1 vllm serve ...)."""


def command_argv(script: str, program: str, index: int = 0) -> list[str]:
    """The arguments after `program` in the script's `index`-th launch command (continuation lines joined; a
    multi-node script's common "${ARGS[@]}" array expanded in place, export.serve_nodes.node_script; environment
    assignments before the command left out)."""
    text = script.replace("\\\n", " ")
    line = [ASSIGNMENTS.sub("", x) for x in text.splitlines() if ASSIGNMENTS.sub("", x).startswith(program)][index]
    array = re.search(r"^ARGS=\(\n(.*?)^\)$", script, re.S | re.M)
    if array is not None:
        line = line.replace('"${ARGS[@]}"', " ".join(x.strip() for x in array.group(1).splitlines()))
    return shlex.split(line.replace('"$MODEL"', "org/model").rstrip(" &"))[len(shlex.split(program)):]


SERVE_PROGRAMS = {"vllm": "vllm serve", "sglang": "python -m sglang.launch_server"}
"""The launch command of each serving engine's exported script."""


def parse_serve_export(pf, target: str) -> tuple[argparse.Namespace, list[str]]:
    """The serving export of `pf` for `target` parsed by the engine's recorded parser: (namespace, flags the
    parser does not define), with vLLM's positional model tag allowed."""
    script = next(iter(render_all(pf, target)[0].values()))
    ap, _ = recorded_parser(target)
    if target == "vllm":
        ap.add_argument("model_tag", nargs="?")
    return ap.parse_known_args(command_argv(script, SERVE_PROGRAMS[target]))


@pytest.mark.parametrize("target,program,changes", [
    ("vllm", "vllm serve", {}), ("sglang", "python -m sglang.launch_server", {}),
    ("vllm", "vllm serve", {"kv_dtype": "bf16", "weight_dtype": "bf16"}),
    ("sglang", "python -m sglang.launch_server", {"kv_dtype": "bf16", "weight_dtype": "bf16"}),
])
def test_serving_flags_parse_with_the_launchers_parsers(target, program, changes):
    # Issue 16: vLLM's serve parser (0.33.0) and SGLang's ServerArgs parser (0.5.23) define every flag the
    # export writes, with a value where they take one and within their choices.
    base = load_plan(PLANS / "serve.json")
    pf = dataclasses.replace(base, plan=base.plan.model_copy(update=changes))
    script = next(iter(render_all(pf, target)[0].values()))
    ap, rec = recorded_parser(target)
    if target == "vllm":
        ap.add_argument("model_tag", nargs="?")
    ns, unknown = ap.parse_known_args(command_argv(script, program))
    assert not unknown, f"flags {rec['launcher']} {rec['version']} does not define: {unknown}"
    p = pf.plan
    tp, dp = (ns.tensor_parallel_size, ns.data_parallel_size) if target == "vllm" else (ns.tp_size, ns.dp_size)
    assert (int(tp), int(dp)) == (p.tp, p.dp)


def test_vllm_flags():
    files, _ = render_all(load_plan(PLANS / "serve.json"), "vllm")
    text = files["vllm_serve.sh"]
    for flag in ("--tensor-parallel-size 4", "--data-parallel-size 2", "--max-model-len 2560",
                 "--kv-cache-dtype fp8", "--quantization fp8", "--max-num-seqs 256", "--enable-prefix-caching"):
        assert flag in text


def edited(tmp_path: Path, case: str, **changes) -> Path:
    doc = json.loads((PLANS / f"{case}.json").read_text())
    for key, value in changes.items():
        section, field = key.split("__")
        doc[section][field] = value
    path = tmp_path / f"{case}-edited.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("case,changes,target,needle", [
    # megatron_fsdp prices nothing under a pipeline: Megatron-FSDP's optim_grads_params is refused under one
    ("dense_train", {"plan__zero": 3}, "megatron", "ZeRO-3 (Megatron-FSDP optim_grads_params) under a pipeline"),
    ("dense_train", {"plan__zero": 2}, "deepspeed", "pipeline parallelism (pp 4) with ZeRO stage 2"),
    ("dense_train", {}, "torchtitan", "ZeRO-1"),
    ("dense_train", {}, "vllm", "it is a training plan and vllm takes serving plans"),
    ("serve", {}, "megatron", "it is a serving plan and megatron takes training plans"),
    ("serve", {"plan__ep": 3}, "vllm", "ep_experts"),
    # Uneven stages: DeepSpeed's PipelineModule partitions cannot pin per-stage layer counts.
    ("uneven_train", {"plan__sp": False, "plan__tp": 1, "plan__dp": 1024}, "deepspeed", "uneven pipeline stages"),
    # AutoTP trains with ZeRO 0-2 only (DeepSpeed's AutoTP training tutorial).
    ("fsdp_train", {"plan__tp": 2, "plan__dp": 8}, "deepspeed", "with ZeRO stage 3"),
])
def test_cannot_express_exits_2(cli, tmp_path, case, changes, target, needle):
    path = edited(tmp_path, case, **changes) if changes else PLANS / f"{case}.json"
    r = cli("export", path, "--to", target, "-o", tmp_path / "out")
    assert r.code == 2, r.out
    assert needle in r.err or needle.replace("ep_experts", "") in r.err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_invalid_or_old_plan_files(cli, tmp_path):
    r = cli("export", edited(tmp_path, "dense_train", plan__tp=3), "--to", "megatron", "-o", tmp_path)
    assert r.code == 2 and "no longer passes its rules" in r.err and "tp (3) must divide" in r.err
    doc = json.loads((PLANS / "dense_train.json").read_text())
    doc["schema"] = 0
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    r = cli("export", old, "--to", "megatron", "-o", tmp_path)
    assert r.code == 2 and "schema 0 is not supported" in r.err
    r = cli("export", tmp_path / "missing.json", "--to", "megatron")
    assert r.code == 2 and "does not exist" in r.err


def test_no_overwrite_without_force_and_no_temp_files(cli, tmp_path):
    out = tmp_path / "out"
    assert cli("export", PLANS / "serve.json", "--to", "all", "-o", out).code == 0
    before = (out / "vllm_serve.sh").read_text()
    (out / "vllm_serve.sh").write_text("# mine\n")
    r = cli("export", PLANS / "serve.json", "--to", "all", "-o", out)
    assert r.code == 2 and "pass --force" in r.err
    assert (out / "vllm_serve.sh").read_text() == "# mine\n"
    assert cli("export", PLANS / "serve.json", "--to", "all", "-o", out, "--force").code == 0
    assert (out / "vllm_serve.sh").read_text() == before
    assert sorted(p.name for p in out.iterdir()) == ["sglang_serve.sh", "vllm_serve.sh"]
    assert os.access(out / "vllm_serve.sh", os.X_OK)


def test_search_save_then_export_all(cli, tmp_path):
    plan = tmp_path / "p.json"
    # the search's defaults (its expert TP > 1 rules out Megatron-Core's fused grouped MLP: exported as
    # TEGroupedMLP with a note; the default gradient accumulation noted for DeepSpeed / torchtitan)
    assert cli("search", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "2", "--zero", "1",
               "--global-batch", "64", "--save", plan).code == 0
    r = cli("export", plan, "--to", "all", "-o", tmp_path / "o", "--json")
    assert r.code == 0 and "megatron_pretrain.sh" in " ".join(r.json()["files"])
    serve = tmp_path / "s.json"
    assert cli("search", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100",
               "--save", serve).code == 0
    assert cli("export", serve, "--to", "vllm", "-o", tmp_path / "v").code == 0


def test_uneven_layout_reaches_every_launcher(tmp_path):
    """The layout llmplan evaluated is the one each launcher gets: Megatron's first/last flags or its explicit
    layout string, and torchtitan's module list per stage (embedding first, norm and output last)."""
    import tomllib

    from llmplan.export import megatron, torchtitan

    pf = load_plan(PLANS / "uneven_train.json")
    flags = " ".join(megatron.parallel_flags(pf))
    assert "--decoder-first-pipeline-num-layers 7" in flags and "--decoder-last-pipeline-num-layers 7" in flags
    as_fsdp = edited(tmp_path, "uneven_train", plan__zero=2)
    cfg = tomllib.loads(torchtitan.toml_text(load_plan(as_fsdp)))
    parts = cfg["parallelism"]["module_fqns_per_model_part"]
    assert [sum(x.startswith("layers.") for x in part) for part in parts] == [7] + [8] * 14 + [7]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert [x for part in parts for x in part if x.startswith("layers.")] == [f"layers.{i}" for i in range(126)]
    layout = load_plan(PLANS / "layout_train.json")
    assert '--pipeline-model-parallel-layout "Et*10|t*11|t*11,L"' in megatron.parallel_flags(layout)


def test_interleaved_uneven_layout_string(tmp_path):
    # pp 2 x vpp 2 over 8 + 6 layers: virtual stages in model order are rank 0 chunk 0 (4), rank 1 chunk 0 (3),
    # rank 0 chunk 1 (4), rank 1 chunk 1 (3).
    from llmplan.export import megatron

    path = edited(tmp_path, "layout_train", plan__pp=2, plan__pp_layers=[8, 6], plan__vpp=2, plan__dp=3,
                  plan__tp=1, plan__sp=False)
    doc = json.loads(path.read_text())
    doc["model"]["num_hidden_layers"] = 14
    doc["model_ref"] = None
    path.write_text(json.dumps(doc))
    assert '--pipeline-model-parallel-layout "Et*4|t*3|t*4|t*3,L"' in megatron.parallel_flags(load_plan(path))


@pytest.mark.parametrize("zero,tp", [(0, 1), (1, 1), (2, 1), (3, 1), (1, 2), (2, 2)])
def test_deepspeed_config_accepted_by_deepspeed(zero, tp, monkeypatch):
    # Issue 16: the DeepSpeed export is checked by DeepSpeed's own config class (pydantic models that refuse
    # unknown keys, and the batch identity train_batch = micro_batch x accumulation x data-parallel size),
    # for every ZeRO stage and for AutoTP (tp 2, which DeepSpeed trains with ZeRO 0-2 only).
    ds_config = pytest.importorskip(
        "deepspeed.runtime.config",
        reason="DeepSpeed not installed: DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8")
    base = load_plan(PLANS / "fsdp_train.json")
    gpus = base.plan.num_gpus
    # gradients as DeepSpeed runs them (tests/test_export_deepspeed_grads.py): ZeRO-1's fp32 gradients are
    # all-reduced (BF16_Optimizer), and without ZeRO they are kept in the model's bf16
    # and BF16_Optimizer casts each micro-batch's gradient to fp32 and adds it (cast-add); the weights gathered
    # inside the optimizer step (overlapped_gather_refusal) and, at tp 2, DeepSpeed's unfused vocab-parallel loss
    # (priced as eager-vocab-parallel: export.common.UNFUSED_LOSS_RUNS)
    # and the untied embedding AutoTP keeps whole on each rank (split_embedding_refusal)
    grads = {0: {"grad_dtype": "bf16"}, 1: {"grad_reduce": "all-reduce", "grad_accumulation": "cast-add"}}.get(zero, {})
    pf = dataclasses.replace(base, plan=base.plan.model_copy(update={"zero": zero, "tp": tp, "dp": gpus // tp,
                                                                     "overlap_param_gather": False,
                                                                     "fused_loss": tp == 1,
                                                                     "tp_whole_embedding": tp > 1, **grads,
                                                                     **({"unfused_loss_impl": "eager-vocab-parallel"}
                                                                        if tp > 1 else {})}))
    cfg = json.loads(render_all(pf, "deepspeed")[0]["ds_config.json"])
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)  # as on rank 0 of a running job

    class Mpu:  # DeepSpeed reads the data-parallel size from the model-parallel unit
        def __init__(self, dp: int) -> None:
            self.dp = dp

        def get_data_parallel_world_size(self) -> int:
            return self.dp

    p = pf.plan
    c = ds_config.DeepSpeedConfig(cfg, mpu=Mpu(p.dp))
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu) == (p.global_batch, p.micro_batch)
    assert c.zero_optimization_stage == p.zero
    want = {"fp32": ds_config.torch.float32, "bf16": ds_config.torch.bfloat16}[grads.get("grad_dtype", "fp32")]
    assert (c.grad_accum_dtype, c.communication_data_type) == (cfg["data_types"]["grad_accum_dtype"], want)
    assert cfg.get("tensor_parallel", {}).get("autotp_size", 1) == tp
    assert c.tensor_parallel_config.vocab_parallel_lm_head is (True if tp > 1 else None)
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        ds_config.DeepSpeedConfig(cfg, mpu=Mpu(p.dp * 2))  # the wrong world is refused: the check bites


# torchtitan 0.3.0 (the `launchers` extra): its own ConfigManager parses the exported command line.
TORCHTITAN_MISSING = "torchtitan not installed: pip install '.[launchers]' (torchtitan==0.3.0)"


def torchtitan_argv(script: str) -> list[str]:
    block = re.search(r"^TORCHTITAN_ARGS=\((.*?)^\)$", script, re.S | re.M).group(1)
    return shlex.split(block, comments=True)


def saved_plan(cli, tmp_path: Path, *args: str) -> PlanFile:
    path = tmp_path / "plan.json"
    r = cli("estimate", *args, "--save", path)
    assert r.code in (0, 3), r.out + r.err
    return load_plan(path)


ADD = {"grad_accumulation": "add"}  # FSDP2 adds each micro-batch's reduce-scattered shard (DDP: autocast's cast first)
TITAN_CASES = [
    ("fsdp_train", {}), ("fsdp_train", {"zero": 0, "grad_accumulation": "cast-add"}),
    ("fsdp_train", {"zero": 2, "cp": 2, "dp": 8, "cp_impl": "torch-allgather"}),
    ("dense_train", {"zero": 2, "recompute": "none", "tp_impl": "dtensor", **ADD}),
    ("dense_train", {"zero": 3, "tp_comm_overlap": True, "recompute": "full", "tp_impl": "dtensor", **ADD}),
    ("uneven_train", {"zero": 2, "dtype": "fp8", "recipe": "rowwise", "tp_impl": "dtensor", **ADD}),
    ("layout_train", {"zero": 2, "sp": False, **ADD}),
    ("fsdp_train", {"fused_loss": False}), ("fsdp_train", {"recompute": "op"}),
]


def as_on_h100(monkeypatch) -> None:
    """torchtitan's float8 config functions check the GPU when they build the model spec; the parse runs as
    on an H100 (SM90). Needs torchao, which the `launchers` extra installs."""
    float8 = pytest.importorskip("torchtitan.components.quantization.float8", reason=TORCHTITAN_MISSING)
    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: (9, 0) >= (major, minor))


@pytest.mark.parametrize("case,changes", TITAN_CASES)
def test_torchtitan_args_parsed_by_torchtitan(case, changes, monkeypatch):
    manager = pytest.importorskip("torchtitan.config.manager", reason=TORCHTITAN_MISSING)
    as_on_h100(monkeypatch)
    from torchtitan.distributed.parallel_dims import ParallelDims

    from llmplan.export import torchtitan

    base = load_plan(PLANS / f"{case}.json")
    pf = dataclasses.replace(base, plan=base.plan.model_copy(update=changes))
    argv = torchtitan_argv(render_all(pf, "torchtitan")[0]["torchtitan_train.sh"])
    cfg = manager.ConfigManager().parse_args(argv)  # tyro parse + torchtitan's own validation
    par, p = cfg.parallelism, pf.plan
    got = (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree,
           par.expert_parallel_degree, par.data_parallel_replicate_degree * par.data_parallel_shard_degree)
    assert got == (p.tp, p.pp, p.cp, p.ep, p.dp)
    ParallelDims.from_config(par, p.num_gpus)  # degrees multiply to the world size
    with pytest.raises(AssertionError, match="Invalid parallel dims"):
        ParallelDims.from_config(par, 2 * p.num_gpus)
    assert (par.data_parallel_shard_degree > 1 or p.dp == 1) == (p.zero >= 2)
    assert par.fsdp_reshard_after_forward == ("never" if p.zero == 2 else "default")
    assert par.enable_sequence_parallel == (p.sp or p.tp == 1)
    assert (cfg.training.global_batch_size, cfg.training.seq_len) == (p.global_batch, p.seq_len)
    ac = type(cfg.activation_checkpoint).__qualname__ if cfg.activation_checkpoint else "None"
    assert ac == {"full": "FullAC.Config", "none": "None", "op": "SelectiveAC.Config"}[p.recompute]
    assert cfg.compile.enable_async_tensor_parallel == (p.tp_comm_overlap and p.tp > 1)
    # torch.compile covers what llmplan costed as fused: the blocks (fused_kernels) and the loss (fused_loss).
    assert cfg.compile.enable and cfg.compile.components == ["model", "loss"][: 2 if p.fused_loss else 1]
    if p.pp > 1:
        assert par.pipeline_parallel_microbatch_size == p.micro_batch
        assert par.module_fqns_per_model_part == torchtitan.stage_modules(pf)
        assert len(par.module_fqns_per_model_part) == p.pp * p.vpp
        assert par.pipeline_parallel_schedule == ("Interleaved1F1B" if p.vpp > 1 else "1F1B")


def test_torchtitan_moe_args_parsed_by_torchtitan(cli, tmp_path, monkeypatch):
    manager = pytest.importorskip("torchtitan.config.manager", reason=TORCHTITAN_MISSING)
    as_on_h100(monkeypatch)
    pf = saved_plan(cli, tmp_path, "--model", "deepseek-v3", "--hardware", "dgx-h800", "--nodes", "64", "--tp", "1",
                    "--pp", "8", "--pp-first-layers", "7", "--pp-last-layers", "6", "--ep", "64", "--etp", "1", "--zero", "2", "--recompute", "full",
                    "--global-batch", "512", "--seq-len", "4096", "--precision", "fp8-rowwise",
                    "--grad-accumulation", "add", "--mtp-layers", "0")  # torchtitan.mtp_refusal
    argv = torchtitan_argv(render_all(pf, "torchtitan")[0]["torchtitan_train.sh"])
    assert argv[:4] == ["--module", "deepseek_v3", "--config", "deepseek_v3_671b_float8"]
    cfg = manager.ConfigManager().parse_args(argv)
    assert (cfg.parallelism.expert_parallel_degree, cfg.parallelism.pipeline_parallel_degree) == (64, 8)
    parts = cfg.parallelism.module_fqns_per_model_part
    assert [x for part in parts for x in part if x.startswith("layers.")] == [f"layers.{i}" for i in range(61)]


def test_torchtitan_refuses_selective_recompute(cli, tmp_path):
    # llmplan's selective recompute is Megatron's (the attention core); torchtitan's selective checkpointing
    # recomputes every other matmul (its op policy): exporting one as the other would run another plan.
    for target in ("torchtitan", "torchtitan-0.2"):
        r = cli("export", edited(tmp_path, "dense_train", plan__zero=2), "--to", target, "-o", tmp_path / target)
        assert r.code == 2 and "selective recompute as llmplan costs it" in r.err
        assert "--recompute none" in r.err and not (tmp_path / target).exists()


def test_op_checkpointing_exports_to_torchtitan_only(cli, tmp_path):
    # recompute op is torchtitan's per-op policy: its 0.3.0 "selective" subcommand, v0.2.2's mode "selective"
    # with selective_ac_option "op"; Megatron-LM and DeepSpeed have no such policy and refuse it.
    import tomllib

    pf = edited(tmp_path, "fsdp_train", plan__recompute="op")
    files, _ = render_all(load_plan(pf), "torchtitan")
    assert "activation-checkpoint:selective" in files["torchtitan_train.sh"]
    toml = tomllib.loads(render_all(load_plan(pf), "torchtitan-0.2")[0]["torchtitan-v0.2.2.toml"])
    assert toml["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    zero1 = edited(tmp_path, "fsdp_train", plan__recompute="op", plan__zero=1)  # Megatron's optimizer sharding
    for target in ("megatron", "deepspeed"):
        r = cli("export", zero1, "--to", target, "-o", tmp_path / target)
        assert r.code == 2 and "op-level selective checkpointing" in r.err and "export to torchtitan" in r.err, r.err
        assert not (tmp_path / target).exists()


def test_torchtitan_refuses_tp_costed_as_megatron(cli, tmp_path):
    # torchtitan's sequence-parallel TP is DTensor's, which keeps the gathered linear inputs (more memory than
    # the Megatron shards llmplan costs by default): the export asks for the plan costed that way.
    for target in ("torchtitan", "torchtitan-0.2"):
        r = cli("export", edited(tmp_path, "dense_train", plan__zero=2, plan__recompute="none"), "--to", target,
                "-o", tmp_path / target)
        assert r.code == 2 and "TP costed as Megatron-LM's" in r.err and "--tp-impl dtensor" in r.err
        assert not (tmp_path / target).exists()
        ok = edited(tmp_path, "dense_train", plan__zero=2, plan__recompute="none", plan__tp_impl="dtensor",
                    plan__grad_accumulation="add")
        assert cli("export", ok, "--to", target, "-o", tmp_path / f"{target}-ok").code == 0


def test_torchtitan_refusals(cli, tmp_path):
    # 0.3.0 has no expert TP and no float8 switch outside a config function; v0.2.2 needs SP with TP.
    r = cli("export", edited(tmp_path, "layout_train", plan__zero=2, plan__sp=False), "--to", "torchtitan-0.2",
            "-o", tmp_path / "a")
    assert r.code == 2 and "TP without sequence parallelism" in r.err and not (tmp_path / "a").exists()
    assert cli("export", edited(tmp_path, "layout_train", plan__zero=2, plan__sp=False, plan__grad_accumulation="add"),
               "--to", "torchtitan", "-o", tmp_path / "b").code == 0
    r = cli("export", edited(tmp_path, "fsdp_train", plan__dtype="fp8", plan__recipe="rowwise"), "--to", "torchtitan",
            "-o", tmp_path / "c")
    assert r.code == 2 and "fp8 training of llama-3.1-8b" in r.err and "torchtitan-0.2" in r.err
    r = cli("export", edited(tmp_path, "fsdp_train", plan__dtype="fp8", plan__fp8_scaling="current"), "--to", "torchtitan", "-o", tmp_path / "f")
    assert r.code == 2 and "fp8 tensorwise scaling" in r.err and "--precision fp8-rowwise" in r.err
    r = cli("export", edited(tmp_path, "fsdp_train", plan__dtype="fp8", plan__recipe="blockwise"), "--to",
            "torchtitan-0.2", "-o", tmp_path / "g")
    assert r.code == 2 and "blockwise recipe" in r.err and "export to megatron" in r.err
    assert "torchtitan has no converter" in r.err and "MXFP8 and NVFP4" not in r.err
    r = cli("export", edited(tmp_path, "uneven_train", plan__zero=2), "--to", "torchtitan", "-o", tmp_path / "e")
    assert r.code == 2 and "bf16 training of llama-3.1-405b" in r.err and "--dtype fp8" in r.err
    r = cli("export", edited(tmp_path, "fsdp_train", plan__grad_dtype="bf16"), "--to", "torchtitan", "-o",
            tmp_path / "d")
    assert r.code == 2 and "mixed_precision_reduce takes float32 only" in r.err
    pf = saved_plan(cli, tmp_path, "--model", "deepseek-v3", "--hardware", "dgx-h800", "--nodes", "64", "--tp", "2",
                    "--pp", "8", "--pp-first-layers", "7", "--pp-last-layers", "6", "--ep", "32", "--etp", "2", "--zero", "2", "--recompute", "full", "--global-batch", "512",
                    "--mtp-layers", "0")  # else torchtitan.mtp_refusal comes first
    with pytest.raises(CannotExpress, match="has no expert TP"):
        render_all(pf, "torchtitan")


def _toml_type_ok(value, declared: str) -> bool:
    """Whether a TOML value fits a JobConfig field type as torchtitan v0.2.2 declares it."""
    if declared.startswith("Optional["):  # a table key may be absent; a written value is the inner type
        declared = declared[len("Optional["):-1]
    if declared.startswith("Literal["):
        return repr(value) in declared[len("Literal["):-1].split(", ")
    kinds = {"int": int, "str": str, "bool": bool, "float": (int, float), "None": type(None)}
    options = [t.strip() for t in declared.split("|")]
    for t in options:
        if t.startswith("list[list[str]]"):
            if isinstance(value, list) and all(isinstance(x, list) and all(isinstance(y, str) for y in x) for x in value):
                return True
        elif t.startswith("list[str]"):
            if isinstance(value, list) and all(isinstance(y, str) for y in value):
                return True
        elif t in kinds and isinstance(value, kinds[t]) and not (t == "int" and isinstance(value, bool)):
            return True
    return False


@pytest.mark.parametrize("case,changes", [("fsdp_train", {}),
                                          ("dense_train", {"zero": 2, "recompute": "full", "tp_impl": "dtensor",
                                                           **ADD}),
                                          ("uneven_train", {"zero": 3, "tp_impl": "dtensor", **ADD}),
                                          ("fsdp_train", {"dtype": "fp8", "fp8_scaling": "current"}), ("fsdp_train", {"recompute": "op"}),
                                          ("fsdp_train", {"dtype": "fp8", "fp8_scaling": "current", "fp8_params": True,
                                                          "tp_impl": "dtensor"}),
                                          ("fsdp_train", {"dtype": "fp8", "recipe": "rowwise"})])
def test_torchtitan_toml_matches_v022_job_config(case, changes):
    # torchtitan v0.2.2's JobConfig, recorded from torchtitan/config/job_config.py at tag v0.2.2 by
    # tools/launcher_flags.py: every section and field the TOML writes exists there, with a value of its type.
    import tomllib

    rec = json.loads((HERE / "data" / "launchers" / "torchtitan-v0.2.2.json").read_text())
    base = load_plan(PLANS / f"{case}.json")
    pf = dataclasses.replace(base, plan=base.plan.model_copy(update=changes))
    cfg = tomllib.loads(render_all(pf, "torchtitan-0.2")[0]["torchtitan-v0.2.2.toml"])
    tables = list(cfg.items())
    while tables:  # a nested table ([quantize.linear.float8]) is a section of its own in the record
        section, values = tables.pop()
        assert section in rec["sections"], f"torchtitan v0.2.2 has no [{section}]"
        for key, value in values.items():
            declared = rec["sections"][section].get(key)
            assert declared is not None, f"torchtitan v0.2.2 has no {section}.{key}"
            if isinstance(value, dict):
                tables.append((f"{section}.{key}", value))
                continue
            assert _toml_type_ok(value, declared), f"{section}.{key} = {value!r} is not {declared}"
    assert not _toml_type_ok("bfloat16", rec["sections"]["training"]["mixed_precision_reduce"])  # the check bites


@pytest.mark.parametrize("dtype,recipe,flags", [
    ("fp8", "blockwise", {"fp8_format": "e4m3", "fp8_recipe": "blockwise"}),
    ("fp8", "mxfp8", {"fp8_format": "e4m3", "fp8_recipe": "mxfp8"}),
    ("fp4", "nvfp4", {"fp4_format": "e2m1", "fp4_recipe": "nvfp4"}),
])
def test_megatron_precision_recipes_and_expert_capacity(dtype, recipe, flags):
    # Megatron-LM's own flags (recorded parser): --fp8-recipe blockwise | mxfp8, --fp4-format e2m1
    # --fp4-recipe nvfp4, and an expert capacity factor with padding to capacity.
    base = load_plan(PLANS / "moe_train.json")
    pf = dataclasses.replace(base, plan=base.plan.model_copy(update={"dtype": dtype, "recipe": recipe,
                                                                      "moe_capacity_factor": 1.25}))
    ns, _ = parse_megatron(render_all(pf, "megatron")[0]["megatron_pretrain.sh"])
    for key, value in flags.items():
        assert getattr(ns, key) == value
    assert ns.bf16 and float(ns.moe_expert_capacity_factor) == 1.25 and ns.moe_pad_expert_input_to_capacity


def test_megatron_refuses_rowwise_fp8():
    base = load_plan(PLANS / "dense_train.json")
    pf = dataclasses.replace(base, plan=base.plan.model_copy(update={"dtype": "fp8", "recipe": "rowwise"}))
    with pytest.raises(CannotExpress, match="rowwise"):
        render_all(pf, "megatron")


@pytest.mark.parametrize("update,backend", [
    ({}, None),  # the native kernel is Megatron-Core's default backend choice: no flag
    ({"attention_kernel": "flash2"}, "AttnBackend.flash"),
    # priced as Transformer Engine's unfused softmax, the one this backend runs (a softmax_kernel fused plan is
    # refused: export.common.softmax_kernel_refusals)
    ({"flash_attention": False, "softmax_kernel": "te"}, "AttnBackend.unfused"),
])
def test_megatron_attention_backend(update, backend):
    # The plan's attention kernel reaches Megatron-LM as --attention-backend, parsed by its recorded parser
    # (an AttnBackend name outside its choices fails the parse).
    base = load_plan(PLANS / "dense_train.json")
    pf = dataclasses.replace(base, plan=base.plan.model_copy(update=update))
    ns, _ = parse_megatron(render_all(pf, "megatron")[0]["megatron_pretrain.sh"])
    assert ns.attention_backend == backend


def test_megatron_block_recompute_and_the_targets_that_refuse_it():
    # Full recompute of the first N layers of each chunk is Megatron's block method; torchtitan and DeepSpeed
    # set activation checkpointing per layer or in model code and refuse it with the reason.
    base = load_plan(PLANS / "dense_train.json")
    pf = dataclasses.replace(base, plan=base.plan.model_copy(update={"recompute": "full", "recompute_layers": 2}))
    ns, _ = parse_megatron(render_all(pf, "megatron")[0]["megatron_pretrain.sh"])
    assert (ns.recompute_granularity, ns.recompute_method, ns.recompute_num_layers) == ("full", "block", 2)
    flat = {"tp": 1, "pp": 1, "dp": 64, "vpp": 1, "sp": False, "recompute": "full", "recompute_layers": 2}
    for target, zero in (("torchtitan", 2), ("deepspeed", 1)):  # plans each target could otherwise express
        other = dataclasses.replace(base, plan=base.plan.model_copy(update={**flat, "zero": zero}))
        with pytest.raises(CannotExpress, match="first 2 layers"):
            render_all(other, target)


def test_megatron_notes_the_sm_margins_the_plan_was_priced_with():
    # docs/formulas.md#step.ub_margin: a plan priced at the published userbuffer configs' margins says that
    # --tp-comm-overlap without a config runs Transformer Engine 2.x's defaults (bulk overlaps margined too)
    base = load_plan(PLANS / "dense_train.json")
    over = dataclasses.replace(base, plan=base.plan.model_copy(update={"tp": 8, "sp": True, "tp_comm_overlap": True,
                                                                      "tp_impl": "megatron"}))
    assert over.plan.tp > 1
    script = render_all(over, "megatron")[0]["megatron_pretrain.sh"]
    assert "--tp-comm-overlap" in script and "set_sm_margin" in script and "tp_overlap_margin_sms" in script
    priced = dataclasses.replace(over, plan=over.plan.model_copy(update={"tp_overlap_margin_sms": (0, 16, 16, 16)}))
    assert "set_sm_margin" not in render_all(priced, "megatron")[0]["megatron_pretrain.sh"]


def test_exported_comments_fit_80_columns():
    """Every whole-line comment of every golden export file fits 80 columns. Exempt, by decision: lines that are
    not whole-line comments (shell command lines and TOML settings are wrapped by export.shell_lines and
    export.toml_lines and checked in tests/test_export_width.py), every line of a JSON file (checked there too),
    and a comment line that is one word longer than a line."""
    too_long = []
    for f in sorted(GOLDEN.rglob("*")):
        if not f.is_file() or f.suffix == ".json":
            continue
        text = f.read_text().replace("llmplan VERSION", f"llmplan {__version__}")  # as exported, not normalised
        for n, line in enumerate(text.splitlines(), 1):
            comment = line.startswith("#") and not line.startswith("#!")
            one_word = len(line.lstrip("# ").split()) <= 1
            if comment and len(line) > 80 and not one_word:
                too_long.append(f"{f.relative_to(GOLDEN)}:{n}: {len(line)} columns")
    assert not too_long, too_long


def test_comment_wrapping_keeps_the_words():
    from llmplan.export.common import comment_lines, fit_comments

    text = "note: " + " ".join(f"word{i}" for i in range(60)) + " --a-flag/--another-one:x " + "y" * 90
    rows = comment_lines(text)
    assert all(len(r) <= 80 for r in rows if len(r.split()) > 2)
    assert rows[0].startswith("# note:") and all(r.startswith("#   ") for r in rows[1:])
    assert " ".join(r[2:].strip() for r in rows) == text
    script = f"#!/usr/bin/env bash\n# {text}\necho {'z' * 100}\n"
    assert fit_comments("x.sh", script).endswith(f"echo {'z' * 100}\n")
    assert fit_comments("x.json", script) == script
