"""ZeRO-2 exported to Megatron-LM as Megatron-FSDP's optim_grads (export.megatron.fsdp_pairs), the ZeRO-2 plans it
refuses in one line (fsdp_zero2_refusals), and an untargeted search saying which targets write its #1.

The flags are checked against NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (the parser recorded in
tests/data/launchers/megatron-lm.json): megatron/training/arguments.py --use-megatron-fsdp,
--data-parallel-sharding-strategy {no_shard, optim, optim_grads, optim_grads_params}, and validate_args under
--use-megatron-fsdp: `assert args.ckpt_format == "fsdp_dtensor"`, `assert os.environ.get(
'CUDA_DEVICE_MAX_CONNECTIONS') != "1"`, `assert args.optimizer in ('sgd', 'adam')`, the distributed optimizer set
for its v1; megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py
_init_each_parameter_group_buffers: optim_grads shards the main weights and the gradients, not the model weights."""

from __future__ import annotations

import json
import re

import pytest
from conftest import one_run_search

from tests.test_export import parse_megatron

BASE = ["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--micro-batch", "1",
        "--global-batch", "64", "--seq-len", "4096", "--zero", "2"]


def exported(cli, tmp_path, *extra: str) -> str:
    plan = tmp_path / "plan.json"
    assert cli("estimate", *BASE, *extra, "--megatron-fsdp", "--save", plan).code in (0, 3)
    r = cli("export", plan, "--to", "megatron", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    return (tmp_path / "out" / "megatron_pretrain.sh").read_text()


def test_zero2_is_megatron_fsdp_optim_grads(cli, tmp_path):
    script = exported(cli, tmp_path, "--tp", "1", "--pp", "1")
    ns, _ = parse_megatron(script)  # every flag parses with Megatron-LM d98e8a6's own arguments
    assert ns.use_megatron_fsdp and ns.data_parallel_sharding_strategy == "optim_grads"
    assert ns.ckpt_format == "fsdp_dtensor"  # validate_args asserts it beside --use-megatron-fsdp
    assert ns.use_distributed_optimizer  # Megatron-FSDP v1's (validate_args sets it; written, not warned about)
    assert ns.overlap_grad_reduce  # optim_grads reduce-scatters overlapped (megatron_fsdp.py asserts it)
    # the plan's fp32 gradients and master: Megatron-FSDP's 'auto' would keep the gradients in the weights' bf16
    assert (ns.megatron_fsdp_main_grads_dtype, ns.megatron_fsdp_grad_comm_dtype) == ("fp32", "fp32")
    assert ns.megatron_fsdp_main_params_dtype == "fp32"
    assert not re.search(r"^export CUDA_DEVICE_MAX_CONNECTIONS=1\b", script, re.M)
    assert re.search(r"^unset CUDA_DEVICE_MAX_CONNECTIONS\b", script, re.M)


def test_zero2_bf16_gradients_and_tp_without_one_queue(cli, tmp_path):
    # TP 2 on H100 (before Blackwell): Megatron-LM only warns beside Megatron-FSDP, which asserts the queue count
    # is not 1, so the script does not set the 1 it writes for TP otherwise
    script = exported(cli, tmp_path, "--tp", "2", "--pp", "1", "--no-tp-comm-overlap", "--grad-dtype", "bf16")
    ns, _ = parse_megatron(script)
    assert ns.tensor_model_parallel_size == 2 and ns.use_megatron_fsdp
    assert (ns.megatron_fsdp_main_grads_dtype, ns.megatron_fsdp_grad_comm_dtype) == ("bf16", "bf16")
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" not in script


def test_zero1_writes_no_fsdp_flag(cli, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli("estimate", *BASE[:-1], "1", "--tp", "1", "--pp", "1", "--save", plan).code in (0, 3)
    assert cli("export", plan, "--to", "megatron", "-o", tmp_path / "out").code == 0
    ns, _ = parse_megatron((tmp_path / "out" / "megatron_pretrain.sh").read_text())
    assert not ns.use_megatron_fsdp and ns.ckpt_format != "fsdp_dtensor" and ns.use_distributed_optimizer


@pytest.mark.parametrize("extra, rule, fix", [
    (["--pp", "2", "--tp", "1"], "under a pipeline (PP 2)", "re-plan with --zero 1, or with --pp 1"),
    (["--no-overlap-grad-reduce", "--tp", "1"], "without the overlapped gradient reduction",
     "--overlap-grad-reduce"),
    (["--grad-accumulation", "add", "--tp", "1"], "grad_accumulation add", "--grad-accumulation fused or copy"),
    (["--cuda-max-connections", "1", "--tp", "1"], "CUDA_DEVICE_MAX_CONNECTIONS 1", "without --cuda-max-connections"),
    # before Hopper (A100, compute capability 8.0): TE orders its TP overlap only at one queue, which Megatron-FSDP
    # refuses (TransformerEngine PR #1308, 64126aa8c: the launch-order event on compute capability 9 only)
    (["--tp", "2", "--tp-comm-overlap", "--hardware", "dgx-a100"], "userbuffer overlap on a100-80gb",
     "re-plan with --no-tp-comm-overlap, or with --zero 1"),
])
def test_zero2_refusals_are_one_line_exit_2(cli, tmp_path, extra, rule, fix):
    plan = tmp_path / "plan.json"
    pp = [] if "--pp" in extra else ["--pp", "1", "--megatron-fsdp"]  # check_plan refuses it under a pipeline
    assert cli("estimate", *BASE, *pp, *extra, "--save", plan).code in (0, 3)
    line = cli("export", plan, "--to", "megatron", "-o", tmp_path / "out").refusal()
    assert "ZeRO-2 (Megatron-FSDP optim_grads)" in line and rule in line and fix in line, line
    assert not (tmp_path / "out").exists()


def test_zero2_beside_tp_overlap_on_hopper_runs_without_one_queue(cli, tmp_path):
    """On H100 (compute capability 9.0) Megatron-LM d98e8a6 only warns about TP beside Megatron-FSDP and asserts
    CUDA_DEVICE_MAX_CONNECTIONS is not 1; Transformer Engine launches the userbuffer communication ahead of its GEMM
    by an event at more than one queue on Hopper (PR #1308): the script writes --tp-comm-overlap, leaves the
    variable unset, and never sets it to 1."""
    script = exported(cli, tmp_path, "--tp", "2", "--pp", "1", "--tp-comm-overlap")
    ns, _ = parse_megatron(script)
    assert ns.tp_comm_overlap and ns.use_megatron_fsdp and ns.data_parallel_sharding_strategy == "optim_grads"
    assert re.search(r"^unset CUDA_DEVICE_MAX_CONNECTIONS\b", script, re.M)
    assert not re.search(r"^export CUDA_DEVICE_MAX_CONNECTIONS=1\b", script, re.M)


def test_zero3_is_megatron_fsdp_optim_grads_params(cli, tmp_path):
    """ZeRO-3 priced with megatron_fsdp is written as Megatron-FSDP's optim_grads_params (Megatron-LM d98e8a6
    arguments.py --data-parallel-sharding-strategy choices; megatron_fsdp.py turns overlap_param_gather on for it,
    and the script writes the flag it priced), with the checkpoint format, distributed optimizer and dtypes of
    ZeRO-2, and CUDA_DEVICE_MAX_CONNECTIONS unset."""
    plan = tmp_path / "plan.json"
    assert cli("estimate", *BASE[:-1], "3", "--tp", "1", "--pp", "1", "--megatron-fsdp", "--save",
               plan).code in (0, 3)
    assert cli("export", plan, "--to", "megatron", "-o", tmp_path / "out").code == 0
    script = (tmp_path / "out" / "megatron_pretrain.sh").read_text()
    ns, _ = parse_megatron(script)
    assert ns.use_megatron_fsdp and ns.data_parallel_sharding_strategy == "optim_grads_params"
    assert ns.ckpt_format == "fsdp_dtensor" and ns.use_distributed_optimizer
    assert ns.overlap_grad_reduce and ns.overlap_param_gather
    assert (ns.megatron_fsdp_main_grads_dtype, ns.megatron_fsdp_main_params_dtype) == ("fp32", "fp32")
    assert "--data-parallel-sharding-strategy optim_grads_params" in script
    assert re.search(r"^unset CUDA_DEVICE_MAX_CONNECTIONS\b", script, re.M)


@pytest.mark.parametrize("extra, rule, fix", [
    ([], "ZeRO-3 (Megatron-FSDP optim_grads_params) priced without megatron_fsdp (zero 3, megatron_fsdp False",
     "with --megatron-fsdp"),
    (["--megatron-fsdp", "--no-overlap-param-gather"], "without the overlapped weight gather",
     "re-plan with --overlap-param-gather, or --zero 2 or 1"),
    (["--megatron-fsdp", "--grad-accumulation", "add"], "ZeRO-3 (Megatron-FSDP optim_grads_params) with "
     "grad_accumulation add", "--grad-accumulation fused or copy, or --zero 2 or 1"),
])
def test_zero3_refusals_are_one_line_exit_2(cli, tmp_path, extra, rule, fix):
    plan = tmp_path / "plan.json"
    assert cli("estimate", *BASE[:-1], "3", "--tp", "1", "--pp", "1", *extra, "--save", plan).code in (0, 3)
    line = cli("export", plan, "--to", "megatron", "-o", tmp_path / "out").refusal()
    assert "megatron cannot express this plan" in line and rule in line and fix in line, line
    assert not (tmp_path / "out").exists()


def test_zero3_under_a_pipeline_is_refused(cli, tmp_path):
    """megatron_fsdp prices nothing under a pipeline (SwitchUse megatron_fsdp_zero), so a ZeRO-3 plan with PP 2 is
    priced as DeepSpeed's / FSDP's ZeRO-3 and megatron refuses it."""
    plan = tmp_path / "plan.json"
    assert cli("estimate", *BASE[:-1], "3", "--tp", "1", "--pp", "2", "--save", plan).code in (0, 3)
    line = cli("export", plan, "--to", "megatron", "-o", tmp_path / "out").refusal()
    assert "ZeRO-3 (Megatron-FSDP optim_grads_params) under a pipeline (PP 2)" in line, line
    assert "re-plan with --zero 1, or with --pp 1" in line, line


def test_targeted_search_keeps_only_zero2_plans_megatron_runs(cli, tmp_path):
    """--target megatron passes over exactly the ZeRO-2 plans fsdp_zero2_refusals refuses (the export's check is
    the one place): pinned to ZeRO-2 and PP 2, none is kept, and the one line names the rule."""
    line = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--zero", "2",
               "--pp", "2", "--target", "megatron").refusal()
    assert "ZeRO-2 (Megatron-FSDP optim_grads) under a pipeline" in line, line


# Pinned to tp 1, pp 1: the labelling checked below is the same on any search space. The unpinned search's #1
# (the --megatron-fsdp ZeRO-2 plan) is a tp 1 pp 1 plan, so the pinned search ranks the very same entry first
# (compared whole, plan and predictions, 2026-12-07) at about a seventh of the CPU (1.9 against 13.8 s).
NEMOTRON = ["search", "--model", "nemotron-3-super", "--hardware", "gb200-nvl72", "--nodes", "8", "--top", "2",
            "--tp", "1", "--pp", "1"]


def test_untargeted_search_says_which_targets_write_its_first(cli, tmp_path):
    """Without --target, #1 is labelled: best_exports_to holds the targets whose export writes it (added keys), and
    each of them does write the saved #1 (here a ZeRO-2 plan of a hybrid model that only megatron runs, priced
    with --megatron-fsdp: without it megatron refuses it, test_untargeted_zero2_first_without_the_switch)."""
    saved = tmp_path / "plan.json"
    with one_run_search():  # the text run below renders the same searches (conftest.one_run_search)
        r = cli(*NEMOTRON, "--megatron-fsdp", "--save", saved, "--json")
        text = cli(*NEMOTRON, "--megatron-fsdp").out
    assert r.code == 0, r.err
    doc = r.json()
    ok, refused = doc["best_exports_to"], doc["best_refusals"]
    assert set(ok) | set(refused) == {"megatron", "megatron-bridge", "deepspeed", "torchtitan", "torchtitan-0.2",
                                      "torchrun", "slurm"} and not set(ok) & set(refused)
    assert "megatron" in ok  # the #1 of this search, ZeRO-2 or not, is one Megatron-LM runs
    for target in ok:
        assert cli("export", saved, "--to", target, "-o", tmp_path / target).code == 0, target
    for target in refused:
        assert cli("export", saved, "--to", target, "-o", tmp_path / target).code == 2, target
    assert doc["plans"][0]["plan"]["zero"] == 2 and doc["plans"][0]["plan"]["megatron_fsdp"]
    assert "#1 exports to megatron" in text


def test_untargeted_first_that_no_target_writes_is_labelled(cli):
    """Pinned to ZeRO-3 with the switch named off, a hybrid model's #1 is written by no target (Megatron-LM refuses
    ZeRO-3 priced without megatron_fsdp, the others the hybrid stack): the JSON's best_exports_to is empty and the
    table says so, with each refusal."""
    with one_run_search():  # the text run renders the JSON run's searches (conftest.one_run_search)
        doc = cli(*NEMOTRON, "--zero", "3", "--no-megatron-fsdp", "--json").json()
        text = " ".join(cli(*NEMOTRON, "--zero", "3", "--no-megatron-fsdp").out.split())
    assert doc["best_exports_to"] == [] and doc["plans"][0]["plan"]["zero"] == 3
    assert "#1 exports to no target" in text and "priced without megatron_fsdp" in text
    assert "search --target NAME" in text


def test_untargeted_zero3_of_a_megatron_only_model_exports_to_megatron(cli, tmp_path):
    """Pinned to ZeRO-3, a hybrid model (which only Megatron-LM runs: export.megatron_only) is priced as
    Megatron-FSDP's optim_grads_params (cli.search as_run), and its #1 exports to megatron with that strategy
    (docs/validation.md#mfsdp-plan; before, '#1 exports to no target')."""
    saved = tmp_path / "plan.json"
    r = cli(*NEMOTRON, "--zero", "3", "--save", saved, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    p = doc["plans"][0]["plan"]
    assert p["zero"] == 3 and p["megatron_fsdp"] is True, p
    assert "megatron" in doc["best_exports_to"] and "megatron-bridge" in doc["best_refusals"]
    assert cli("export", saved, "--to", "megatron", "-o", tmp_path / "out").code == 0
    script = (tmp_path / "out" / "megatron_pretrain.sh").read_text()
    assert "--data-parallel-sharding-strategy optim_grads_params" in script


# Price and export agree (docs/validation.md#mfsdp-follow): Megatron-LM and Megatron-Bridge run ZeRO-2 as
# Megatron-FSDP's optim_grads, whose queue of unsharded gradient buckets llmplan prices only under megatron_fsdp
# (docs/formulas.md#mem.megatron_fsdp), so both refuse a ZeRO-2 plan priced without it, and a search targeting them
# prices its ZeRO-2/3 plans with it.

LLAMA = ["--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "1", "--global-batch", "64",
         "--seq-len", "4096"]


@pytest.mark.parametrize("target", ["megatron", "megatron-bridge"])
def test_zero2_priced_without_the_switch_is_refused_in_one_line(cli, tmp_path, target):
    plan = tmp_path / "plan.json"
    assert cli("estimate", *BASE, "--tp", "1", "--pp", "1", "--save", plan).code in (0, 3)
    r = cli("export", plan, "--to", target, "-o", tmp_path / "out")
    line = r.refusal()  # exit 2, one line
    assert r.code == 2 and f"{target} cannot express this plan" in line, line
    assert "priced without megatron_fsdp (zero 2, megatron_fsdp False" in line and "mem.megatron_fsdp" in line
    assert '"megatron_fsdp": true' in line and "with --megatron-fsdp" in line and "--target megatron" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target", ["megatron", "megatron-bridge"])
def test_unpriced_zero2_fixes_are_usable(cli, tmp_path, target):
    """The unpriced refusal's fixes, followed (docs/validation.md#late-mend): `estimate --plan FILE --megatron-fsdp`
    is itself refused (--plan prices the saved plan as saved), so the line names the plan file's key and the
    original command with the flag; each makes a plan the export writes."""
    plan = tmp_path / "plan.json"
    assert cli("estimate", *BASE, "--tp", "1", "--pp", "1", "--save", plan).code in (0, 3)
    assert cli("estimate", "--plan", plan, "--megatron-fsdp").code == 2  # the fix the line no longer gives
    doc = json.loads(plan.read_text())
    doc["plan"]["megatron_fsdp"] = True  # the first fix: the plan file's key
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    assert cli("estimate", "--plan", edited).code in (0, 3)
    r = cli("export", edited, "--to", target, "-o", tmp_path / "edited")
    assert r.code == 0, r.err
    again = tmp_path / "again.json"  # the second: the estimate that saved it, with the flag
    assert cli("estimate", *BASE, "--tp", "1", "--pp", "1", "--megatron-fsdp", "--save", again).code in (0, 3)
    r = cli("export", again, "--to", target, "-o", tmp_path / "again")
    assert r.code == 0, r.err


def test_targeted_search_prices_zero2_with_the_switch_and_exports_it(cli, tmp_path):
    """--target megatron searches ZeRO-2 with megatron_fsdp on (not named): the saved #1 carries it, its memory is
    the estimate's with --megatron-fsdp (above the plan priced without it), and both Megatron exports take it."""
    saved = tmp_path / "plan.json"
    r = cli("search", *LLAMA, "--zero", "2", "--pp", "1", "--grad-dtype", "fp32", "--target", "megatron", "--top",
            "1", "--save", saved, "--json")
    assert r.code == 0, r.err
    first = r.json()["plans"][0]
    p = first["plan"]
    assert p["zero"] == 2 and p["megatron_fsdp"] is True
    axes = ["--tp", str(p["tp"]), "--pp", "1", "--zero", "2", "--micro-batch", str(p["micro_batch"]),
            "--recompute", p["recompute"], "--grad-dtype", "fp32"]
    on = cli("estimate", *LLAMA, *axes, "--megatron-fsdp", "--json").json()["memory"]["total"]
    off = cli("estimate", *LLAMA, *axes, "--json").json()["memory"]["total"]
    assert first["memory"]["total"] == pytest.approx(on, rel=1e-9) and on > off
    for target in ("megatron", "megatron-bridge"):
        assert cli("export", saved, "--to", target, "-o", tmp_path / target).code == 0, target


@pytest.mark.parametrize("target", ["torchrun", "slurm"])
def test_wrapping_targets_keep_zero3_plans(cli, cli_once, target):
    """torchrun / slurm wrap the first target that accepts the plan (export.default_wrap), and the search does not
    know which: it leaves megatron_fsdp off (export.MEGATRON_FSDP_TARGETS), so ZeRO-3 plans, which Megatron-LM
    refuses and the DeepSpeed / torchtitan wraps take only without the switch, stay (docs/validation.md#late-mend:
    before, --target torchrun --zero 3 on 2 nodes ranked tp1 pp2 first and lost the untargeted #1 tp1 pp1 dp16)."""
    args = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--nodes", "2", "--zero", "3", "--top", "1",
            "--json")
    free = cli_once("search", *args).json()["plans"][0]  # the untargeted search: one for both targets
    kept = cli("search", *args, "--target", target).json()["plans"][0]
    assert kept["plan"]["megatron_fsdp"] is False, kept["plan"]
    assert (kept["plan"]["pp"], kept["plan"]["dp"]) == (free["plan"]["pp"], free["plan"]["dp"]), (kept, free)
    assert kept["throughput"]["tokens_per_s"] == pytest.approx(free["throughput"]["tokens_per_s"], rel=1e-9)


def test_wrapping_target_takes_the_per_tensor_unit(cli, tmp_path):
    """--zero3-unit tensor with --target torchrun: not refused up front (its DeepSpeed wrap runs the per-tensor
    unit); the saved #1 exports to torchrun. The Megatron targets still refuse it in one line
    (tests/test_megatron_fsdp_memory.py)."""
    saved = tmp_path / "plan.json"
    r = cli("search", *LLAMA, "--zero", "3", "--pp", "1", "--zero3-unit", "tensor", "--target", "torchrun",
            "--top", "1", "--save", saved, "--json")
    assert r.code == 0, r.err
    p = r.json()["plans"][0]["plan"]
    assert p["zero3_unit"] == "tensor" and p["megatron_fsdp"] is False, p
    r = cli("export", saved, "--to", "torchrun", "-o", tmp_path / "out")
    assert r.code == 0, r.err


def test_targeted_search_with_the_switch_named_off_refuses_every_zero2(cli):
    """--no-megatron-fsdp named: the search keeps it off, and every ZeRO-2 plan is refused by the export's rule."""
    line = cli("search", *LLAMA, "--zero", "2", "--pp", "1", "--no-megatron-fsdp", "--target",
               "megatron").refusal()
    assert "priced without megatron_fsdp" in line, line


# the untargeted ZeRO-2 search with the switch named off: the next two tests read it (conftest.cli_once)
ZERO2_OFF = ("search", *LLAMA, "--zero", "2", "--pp", "1", "--top", "1", "--no-megatron-fsdp", "--json")


def test_untargeted_zero2_first_without_the_switch(cli_once):
    """Without --target a ZeRO-2 #1 priced without megatron_fsdp (--no-megatron-fsdp named) is not said to export
    to megatron: best_refusals carries the rule's line; DeepSpeed's refusal of the same plan, if any, is for its own
    gather (#ds-gather: the search's default overlapped weight gather, which DeepSpeed's step does not run), never
    for megatron_fsdp."""
    doc = cli_once(*ZERO2_OFF).json()
    assert doc["plans"][0]["plan"]["megatron_fsdp"] is False
    assert "megatron" not in doc["best_exports_to"] and "megatron-bridge" not in doc["best_exports_to"]
    for target in ("megatron", "megatron-bridge"):
        assert "priced without megatron_fsdp" in doc["best_refusals"][target], target
    ds = doc["best_refusals"].get("deepspeed", "")
    assert "deepspeed" in doc["best_exports_to"] or "overlap" in ds, ds
    assert "megatron_fsdp" not in ds, ds


def test_untargeted_zero2_first_only_megatron_runs_is_priced_with_the_switch(cli, cli_once, tmp_path):
    """The switch left unnamed: the winning setting's ZeRO-2 #1 priced without megatron_fsdp is written by no target
    (DeepSpeed refuses its overlapped gather, torchtitan its bf16 gradient reduction: reasons of the plan, not of
    the setting, so as_run left the switch off; the previous test's refusals), and with the switch Megatron-LM
    writes it: the setting is searched again with megatron_fsdp (cli.search megatron_for_the_first), its #1 carries
    it, the switches line says so, and megatron writes the saved plan (docs/validation.md#mfsdp-plan)."""
    saved = tmp_path / "plan.json"
    r = cli("search", *LLAMA, "--zero", "2", "--pp", "1", "--top", "1", "--save", saved, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    p = doc["plans"][0]["plan"]
    assert p["zero"] == 2 and p["megatron_fsdp"] is True, p
    assert doc["switches"]["megatron_fsdp"] is True
    assert "megatron" in doc["best_exports_to"]
    assert cli("export", saved, "--to", "megatron", "-o", tmp_path / "out").code == 0
    off = cli_once(*ZERO2_OFF).json()  # the previous test's search (read-only: cli_once runs it once)
    assert off["best_exports_to"] == [], off["best_exports_to"]  # what the switch's absence left: no target


# An untargeted search prices the ZeRO-2 of the settings only Megatron runs (export.megatron_only: DeepSpeed refuses
# EP, torchtitan the EP all-to-all overlap and the flex dispatcher) with megatron_fsdp on (cli.search as_run), so its
# #1 names a target that runs it as priced (docs/validation.md#search-mfsdp).

MOE = ["search", "--model", "qwen3-30b-a3b", "--hardware", "dgx-b200", "--nodes", "1", "--global-batch", "32",
       "--seq-len", "4096", "--zero", "2", "--pp", "1", "--tp", "1", "--ep", "2", "--micro-batch", "1",
       "--recompute", "none", "--top", "1"]


def test_plain_moe_search_first_exports_to_megatron(cli, tmp_path):
    """The plain search's #1 (an EP ZeRO-2 plan under the EP overlap, which only Megatron runs) is priced with
    megatron_fsdp, the switches line says so, megatron writes the saved plan, and the search's row is the scalar
    estimate of that plan (estimate --plan)."""
    saved = tmp_path / "plan.json"
    r = cli(*MOE, "--save", saved, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    first = doc["plans"][0]
    p = first["plan"]
    assert p["zero"] == 2 and p["ep"] == 2 and p["megatron_fsdp"] is True
    assert "megatron" in doc["best_exports_to"] and doc["switches"]["megatron_fsdp"] is True
    assert cli("export", saved, "--to", "megatron", "-o", tmp_path / "out").code == 0
    again = cli("estimate", "--plan", saved, "--json").json()
    assert again["memory"]["total"] == pytest.approx(first["memory"]["total"], rel=1e-9)
    assert again["time"]["step_s"] == pytest.approx(first["time"]["step_s"], rel=1e-9)


def test_switches_line_names_the_choice():
    """The switches line says which way the search priced ZeRO-2, and that --megatron-fsdp pins it."""
    from llmplan.report.search import switches_line
    from llmplan.search.run import SwitchChoice
    chosen = {"grad_dtype": "bf16", "fp8_params": False, "megatron_fsdp": True}
    line = switches_line(SwitchChoice(chosen, ((chosen, 1.0), ({**chosen, "megatron_fsdp": False}, 0.5))))
    assert "ZeRO-2/3 as Megatron-FSDP on" in line and "--megatron-fsdp pin" in line


def test_pinned_off_still_prices_without_it(cli):
    """--no-megatron-fsdp pins it: the search's #1 is priced without it (and megatron refuses it, as before)."""
    doc = cli(*MOE, "--no-megatron-fsdp", "--json").json()
    assert doc["plans"][0]["plan"]["megatron_fsdp"] is False and "megatron" not in doc["best_exports_to"]
    assert "megatron_fsdp" not in doc.get("switches", {})



def test_one_setting_prices_it_too(cli):
    """With every other switch pinned (one setting: bf16 gradient reduction, which torchtitan refuses, beside EP,
    which DeepSpeed refuses) the search prices ZeRO-2 as Megatron-FSDP all the same (no switches line: one setting,
    as test_memory_switches.test_pinned_switches_are_not_tried holds), and megatron writes its #1."""
    doc = cli(*MOE, "--grad-dtype", "bf16", "--moe-dispatcher", "alltoall", "--no-ep-comm-overlap", "--json").json()
    assert doc["plans"][0]["plan"]["megatron_fsdp"] is True and "megatron" in doc["best_exports_to"]
