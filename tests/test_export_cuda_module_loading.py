"""ParallelPlan.cuda_lazy_loading off reaches every training export: the scripts export CUDA_MODULE_LOADING=EAGER
(PyTorch sets LAZY only where the variable is unset: pytorch/pytorch PR #86509; the CUDA Programming Guide's Lazy
Loading section names the variable), DeepSpeed's multi-node runner gets it through .deepspeed_env, and the
TOML-only torchtitan 0.2 export refuses it with one line and exit code 2."""

from __future__ import annotations

import pytest
from test_switch_cli import edited  # a shipped plan file with some plan fields changed


@pytest.mark.parametrize("target,script", [
    ("megatron", "megatron_pretrain.sh"), ("megatron-bridge", "megatron_bridge_pretrain.sh"),
    ("torchtitan", "torchtitan_train.sh"), ("deepspeed", "deepspeed_launch.sh"), ("torchrun", "torchrun.sh"),
    ("slurm", "job.sbatch"),
])
def test_eager_module_loading_is_exported(cli, tmp_path, target, script):
    case = "dense_train" if target in ("megatron", "megatron-bridge", "torchrun", "slurm") else "fsdp_train"
    extra = {"zero": 1, "grad_reduce": "all-reduce", "grad_accumulation": "cast-add",  # gathered in the step
             "overlap_param_gather": False, "overlap_grad_reduce": False} if target == "deepspeed" else {}
    for lazy in (True, False):
        out = tmp_path / f"out-{lazy}"
        r = cli("export", edited(tmp_path, case, cuda_lazy_loading=lazy, **extra), "--to", target, "-o", out)
        assert r.code == 0, r.err
        files = {p.name: p.read_text() for p in out.iterdir() if p.is_file()}
        text = files[script]
        exports = [x for x in text.splitlines() if x.startswith("export CUDA_MODULE_LOADING=EAGER")]
        assert len(exports) == (0 if lazy else 1), text
        if not lazy:  # after the #SBATCH lines, which sbatch reads only before the first command
            assert text.index("export CUDA_MODULE_LOADING") > text.index("set -euo pipefail")
        if target == "deepspeed" and not lazy:  # 2 nodes: the runner forwards only .deepspeed_env's variables
            assert files[".deepspeed_env"] == "CUDA_MODULE_LOADING=EAGER\n"


def test_deepspeed_env_holds_every_exported_variable(cli, tmp_path):
    plan = edited(tmp_path, "fsdp_train", cuda_lazy_loading=False, launch_blocking=True, zero=1,
                  grad_reduce="all-reduce", grad_accumulation="cast-add", overlap_param_gather=False,
                  overlap_grad_reduce=False)  # BF16_Optimizer reduces after the backward
    r = cli("export", plan, "--to", "deepspeed", "-o", tmp_path / "out")
    assert r.code == 0, r.err
    assert (tmp_path / "out" / ".deepspeed_env").read_text() == "CUDA_LAUNCH_BLOCKING=1\nCUDA_MODULE_LOADING=EAGER\n"


def test_torchtitan_toml_refuses_eager_module_loading(cli, tmp_path):
    r = cli("export", edited(tmp_path, "fsdp_train", cuda_lazy_loading=False), "--to", "torchtitan-0.2",
            "-o", tmp_path / "out")
    assert r.code == 2, r.out + r.err
    assert "Traceback" not in r.err + r.out
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1 and "CUDA_MODULE_LOADING=EAGER" in lines[0] and "cuda_lazy_loading" in lines[0], r.err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
