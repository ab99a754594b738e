"""Switches refused with the fix that mends them, through the real command. A plan file an older llmplan saved
with a switch its plan cannot use (its search held the switch for every plan it saved): reading it back is
refused in one line, exit code 2, and the line says how to mend the file (the flags the rule names are plan
keys; dropping the switch is its default, which prices the plan the same), not only which flag to drop. A
search whose switches break a rule on every plan: the rule's fix, not a change of pins that cannot mend it."""

from __future__ import annotations

import json

import pytest

# saved: a shipped plan file (llmplan 0.1.0's) with some plan keys changed, as an older llmplan could have saved them
from test_switch_cli import edited as saved
from test_unused_switches import DENSE
from test_unused_switches import MOE as MOE_EP1


# fsdp_train: tp 1, pp 1, zero 3; dense_train: tp 8, pp 4, sp, zero 1
@pytest.mark.parametrize("case, plan, needles", [
    ("fsdp_train", {"tp_comm_overlap": True},
     ("tp_comm_overlap with tp 1 and sp off", "drop --tp-comm-overlap",
      "(--tp-comm-overlap is plan.tp_comm_overlap)", "tp_comm_overlap: false here, which prices the plan the same")),
    ("dense_train", {"zero3_unit": "tensor"},
     ("zero3_unit tensor with zero 1", "plan.zero3_unit", 'zero3_unit: "layer" here')),
    ("fsdp_train", {"pp_schedule": "zero-bubble"}, ("pp_schedule zero-bubble with pp 1", 'pp_schedule: "1f1b" here')),
])
@pytest.mark.parametrize("command", [("export", "--to", "megatron"), ("report",)])
def test_saved_switch_without_its_axis_says_how_to_mend_the_file(cli, tmp_path, case, plan, needles, command):
    path = saved(tmp_path, case, **plan)
    r = cli(command[0], path, *command[1:], "-o", tmp_path / "out")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert f"{path}: the plan no longer passes its rules:" in lines[0]
    assert f"To mend {path}: a flag is the plan key of its name" in lines[0]
    assert "or re-create the plan with `llmplan search --save`" in lines[0]
    for needle in needles:
        assert needle in lines[0], r.err
    assert not (tmp_path / "out").exists()


def test_the_mend_the_message_names_is_accepted(cli, tmp_path):
    """Setting the key the message names to the default it names makes the file load again."""
    path = saved(tmp_path, "fsdp_train", tp_comm_overlap=True)
    assert cli("export", path, "--to", "megatron", "-o", tmp_path / "a").code == 2
    doc = json.loads(path.read_text())
    doc["plan"]["tp_comm_overlap"] = False
    path.write_text(json.dumps(doc))
    r = cli("export", path, "--to", "torchtitan", "-o", tmp_path / "b")
    assert r.code == 0, r.err


def test_several_broken_rules_end_with_the_mend_on_its_own_line(cli, tmp_path):
    path = saved(tmp_path, "fsdp_train", tp_comm_overlap=True, fp8_params=True)
    r = cli("export", path, "--to", "megatron", "-o", tmp_path / "out")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert lines[0].endswith("the plan no longer passes its rules:"), r.err
    assert [x for x in lines if x.startswith("  - ")] == lines[1:3], r.err
    assert "fp8_params with dtype bf16" in r.err and "tp_comm_overlap with tp 1" in r.err
    assert lines[3].startswith(f"To mend {path}:") and "tp_comm_overlap: false here" in lines[3], r.err


@pytest.mark.parametrize("args, needles", [
    (("--fp8-params",), ("(fp8_params_dtype): fp8_params with dtype bf16", "or drop --fp8-params")),
    (("--dtype", "fp32", "--grad-dtype", "bf16"), ("(grad_dtype_fp32): grad_dtype bf16 with dtype fp32",)),
    (("--no-flash-attention", "--attention-kernel", "flash2"),
     ("(attention_kernel_fused): attention_kernel flash2 with unfused attention", "use --flash-attention")),
    (("--expert-gemm", "per-expert"), ("(moe_switches_dense): expert_gemm per-expert", "drop --expert-gemm")),
    (("--moe-dispatcher", "deepep", "--ep-comm-overlap"),
     ("(moe_switches_dense): moe_dispatcher deepep, ep_comm_overlap", "drop --moe-dispatcher, --ep-comm-overlap")),
])
def test_search_refuses_switches_that_break_a_rule_on_every_plan_with_the_rules_fix(cli, args, needles):
    """A workload's switches that break a rule whatever the axes: the rule's own fix, not the advice to change
    the pinned options, the batch or the nodes (which cannot mend it)."""
    r = cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--pp", "1", "--cp", "1", *args)
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "the search's switches break a rule (" in lines[0] and "Change the pinned options" not in lines[0]
    for needle in needles:
        assert needle in lines[0], r.err


MOE = (*MOE_EP1, "--ep", "8")  # test_unused_switches' mixtral-8x7b on 2 DGX H100 at TP 2, with EP 8


@pytest.mark.parametrize("args, needles", [
    (("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--moe-flex-backend", "hybridep"),
     ("the plan breaks a rule: moe_flex_backend hybridep: it acts on mixture-of-experts layers",
      "drop --moe-flex-backend")),
    # named at its default: still asks for a dispatcher backend a dense model has no use for
    (("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--moe-flex-backend", "deepep"),
     ("moe_flex_backend deepep: it acts on mixture-of-experts layers",)),
    ((*MOE, "--moe-flex-backend", "hybridep"),
     ("the plan breaks a rule: moe_flex_backend hybridep with moe_dispatcher alltoall",
      "add --moe-dispatcher deepep or drop --moe-flex-backend")),
    # a search given the backend alone searches the flex dispatcher instead (tests/test_flex_backend_json.py)
])
def test_a_flex_backend_without_the_flex_dispatcher_exits_2(cli, args, needles):
    """--moe-flex-backend picks the kernels of the deepep dispatcher: with alltoall or on a dense model it would
    silently do nothing."""
    r = cli(*args)
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    for needle in needles:
        assert needle in lines[0], r.err
    assert cli(*MOE, "--moe-flex-backend", "hybridep", "--moe-dispatcher", "deepep").code == 0


def test_estimate_names_every_moe_switch_given_to_a_dense_model(cli):
    """--ep-comm-overlap (away from its default, which check_plan sees) with --expert-gemm grouped (its default,
    which only the named-switch check sees): one refusal that names both, so one edit mends it."""
    r = cli(*DENSE, "--ep-comm-overlap", "--expert-gemm", "grouped")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1, r.err
    assert "expert_gemm grouped, ep_comm_overlap: these switches act on mixture-of-experts layers" in lines[0]
    assert "drop --expert-gemm, --ep-comm-overlap" in lines[0], r.err


def test_an_unknown_flex_backend_exits_2_with_the_choices(cli):
    r = cli(*MOE, "--moe-dispatcher", "deepep", "--moe-flex-backend", "nvshmem")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1, r.err
    assert "--moe-flex-backend nvshmem is not a flex dispatcher backend: it must be one of deepep, hybridep" in lines[0]


def test_a_plan_file_with_the_nan_check_in_a_full_iteration_graph_exits_2(cli, tmp_path):
    """Megatron-LM asserts the gradient NaN check off under --cuda-graph-impl full_iteration (ParallelPlan's
    validator): a plan file asking for both is one line naming the keys to change."""
    path = saved(tmp_path, "dense_train", grad_nan_check=True, cuda_graphs="full-iteration")
    r = cli("export", path, "--to", "megatron", "-o", tmp_path / "out")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "grad_nan_check with cuda_graphs full-iteration" in lines[0]
    assert "set grad_nan_check false or cuda_graphs none or layers" in lines[0], r.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target", ["deepspeed", "torchtitan"])
@pytest.mark.parametrize("plan", [{"grad_nan_check": True}, {"grad_prescale": True}])
def test_launchers_without_megatrons_bucket_passes_refuse_them_in_one_line(cli, tmp_path, target, plan):
    """DeepSpeed and FSDP2 run neither Megatron-LM's NaN-check norm nor its 1/dp pre-scaling of the buckets
    (step.grad_buffer): a plan priced with them is refused with the keys to change, not exported unpriced."""
    assert cli("export", saved(tmp_path, "fsdp_train"), "--to", target, "-o", tmp_path / "plain").code == 0
    path = saved(tmp_path, "fsdp_train", **plan)
    r = cli("export", path, "--to", target, "-o", tmp_path / "out")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "gradient NaN check or 1/dp pre-scaling" in lines[0]
    assert "set grad_nan_check and grad_prescale false, or export to megatron" in lines[0], r.err
    assert not (tmp_path / "out").exists()


def test_a_switch_with_no_flag_is_mended_by_editing_the_file(cli, tmp_path):
    """tp_overlap_sms / tp_overlap_margin_sms are plan-file fields with no command-line flag: the mend names the
    file's fields to edit, never a --tp-overlap-sms that `llmplan estimate` would reject."""
    path = saved(tmp_path, "fsdp_train", tp_overlap_sms=[1, 16, 16, 16])
    r = cli("export", path, "--to", "megatron", "-o", tmp_path / "out")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert "--tp-overlap-sms" not in r.err and "--tp-overlap-margin-sms" not in r.err, r.err
    assert ("tp_overlap_sms, tp_overlap_margin_sms have no flag: edit the plan file's fields (tp_overlap_sms: null, "
            "tp_overlap_margin_sms: null here" in lines[0]), r.err
    doc = json.loads(path.read_text())
    doc["plan"]["tp_overlap_sms"] = None
    path.write_text(json.dumps(doc))
    assert cli("export", path, "--to", "torchtitan", "-o", tmp_path / "b").code == 0


def test_every_switch_a_rule_resets_has_a_flag_or_is_plan_file_only():
    """The mend names --<key> for a switch: that flag must exist (estimate's options), or the key is in
    PLAN_FILE_ONLY and the mend says to edit the file."""
    from llmplan.cli.options import SWITCHES
    from llmplan.specs.check_switches import SWITCH_USES
    from llmplan.specs.plan import PLAN_FILE_ONLY
    flags = {o.param_decls[0].split("/")[0] for o in SWITCHES.options.values()}
    for u in SWITCH_USES:
        for f in u.fields:
            assert f in PLAN_FILE_ONLY or f"--{f.replace('_', '-')}" in flags, f
    for f in PLAN_FILE_ONLY:
        assert f"--{f.replace('_', '-')}" not in flags, f


@pytest.mark.parametrize("field, value", [
    ("tp_overlap_sms", [1, 16, 16]), ("tp_overlap_sms", [1, 16, 16, 16, 16]), ("tp_overlap_margin_sms", [0]),
])
def test_a_per_role_tuple_of_the_wrong_length_says_it_takes_four(cli, tmp_path, field, value):
    """pydantic reports a short fixed-length tuple as "field 'tp_overlap_sms.3': Field required": the line says
    the field takes four numbers, one per role, and what it got."""
    path = saved(tmp_path, "dense_train", tp_comm_overlap=True, **{field: value})
    r = cli("export", path, "--to", "megatron", "-o", tmp_path / "out")
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert f"(plan): field '{field}' takes 4 numbers, one per TP-overlap role" in lines[0], r.err
    assert f"(got {json.dumps(value)})" in lines[0] and "Field required" not in r.err, r.err
    assert not (tmp_path / "out").exists()
