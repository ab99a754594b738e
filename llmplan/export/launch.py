"""torchrun and SLURM: launch any training target (Megatron-LM, torchtitan, a DeepSpeed script,
Megatron-Bridge) on the plan's nodes (torchrun flags and the one-task-per-node SLURM pattern: torch.distributed.run
(torchrun) documentation)."""

from __future__ import annotations

from llmplan.export import bridge, deepspeed, megatron, torchtitan
from llmplan.export.common import (launch_env_lines, megatron_expert_notes, need_mode, op_fuser_env_lines, refuse,
                                   sh_header)
from llmplan.planfile import PlanFile

WRAP_CHECKS = {"megatron": megatron.check, "torchtitan": torchtitan.check, "deepspeed": deepspeed.check,
               "megatron-bridge": bridge.check}
"""The refusal checks of each wrappable target (the ones its own render runs first), in the order a launch
without --wrap tries them."""
WRAPPABLE = tuple(WRAP_CHECKS)


def check(pf: PlanFile, target: str, wrap: str) -> None:
    """Refuse, with the reason, a torchrun / slurm (`target`) launch of `wrap` that cannot run the plan: a serving
    plan, an unknown wrap, or a plan the wrapped target refuses (render_torchrun and render_slurm run this
    first)."""
    need_mode(pf, "train", target)
    if wrap not in WRAP_CHECKS:
        raise refuse("torchrun", f"--wrap {wrap} is not a training target", f"use one of {', '.join(WRAPPABLE)}")
    WRAP_CHECKS[wrap](pf)


def _entry(pf: PlanFile, wrap: str) -> tuple[str, dict[str, str], str]:
    """(command after torchrun's flags, extra files, shell lines that define the arguments and, but for megatron
    whose script body has them, the plan's environment); the plan checked first (check)."""
    if wrap == "megatron":  # its body exports the plan's environment (common.rendezvous_lines)
        body = megatron.script_body(pf, "").rstrip("\n")
        body = "\n".join(line for line in body.splitlines() if not line.startswith(("GPUS_PER_NODE", "NNODES",
                                                                                   "NODE_RANK", "MASTER_")))
        return megatron.entry_command(pf), megatron.companion_files(pf), body.replace("set -euo pipefail\n", "")
    env = "".join(f"{line}\n" for line in launch_env_lines(pf))
    if wrap == "torchtitan":
        return torchtitan.TORCHTITAN_ENTRY, {}, env + torchtitan.args_array(pf)
    if wrap == "deepspeed":
        files = deepspeed.render(pf)
        files.pop("deepspeed_launch.sh")
        files.pop(".deepspeed_env", None)  # torchrun starts the workers: they inherit the exported variables
        return '"${TRAIN_SCRIPT:-train.py}" --deepspeed --deepspeed_config ds_config.json', files, env.rstrip("\n")
    if wrap == "megatron-bridge":
        env += "".join(f"{line}\n" for line in op_fuser_env_lines(pf))
        return bridge.BRIDGE_ENTRY, {}, env + bridge.arrays(pf)
    raise AssertionError(wrap)  # check refused it


def _notes(pf: PlanFile, wrap: str) -> tuple[str, ...]:
    """The wrapped launcher's header notes (where it runs something the plan priced otherwise)."""
    if wrap == "megatron":
        return megatron_expert_notes(pf) + megatron.balance_notes(pf)
    if wrap == "megatron-bridge":
        return megatron_expert_notes(pf)
    if wrap == "deepspeed":
        return deepspeed.notes(pf)
    return torchtitan.notes(pf) if wrap == "torchtitan" else ()


def render_torchrun(pf: PlanFile, wrap: str = "megatron") -> dict[str, str]:
    check(pf, "torchrun", wrap)
    entry, files, defs = _entry(pf, wrap)
    c = pf.cluster
    script = (sh_header(pf, f"torchrun (wrapping {wrap})", _notes(pf, wrap)) + "set -euo pipefail\n"
              "# run this on every node (same MASTER_ADDR / MASTER_PORT / JOB_ID everywhere)\n"
              f"NNODES=${{NNODES:-{c.num_nodes}}}\nGPUS_PER_NODE=${{GPUS_PER_NODE:-{c.gpus_per_node_used}}}\n"
              "MASTER_ADDR=${MASTER_ADDR:-localhost}\nMASTER_PORT=${MASTER_PORT:-29500}\nJOB_ID=${JOB_ID:-llmplan}\n"
              + (defs + "\n" if defs else "")
              + 'torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --rdzv-backend c10d '
              '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$JOB_ID" \\\n    ' + entry + "\n")
    return {**files, "torchrun.sh": script}


def render_slurm(pf: PlanFile, wrap: str = "megatron") -> dict[str, str]:
    check(pf, "slurm", wrap)
    entry, files, defs = _entry(pf, wrap)
    defs = defs.replace(megatron.SCRIPT_DIR, "${SLURM_SUBMIT_DIR:-.}")  # sbatch runs a spool copy of the script
    c = pf.cluster
    header = sh_header(pf, f"SLURM sbatch (one srun task per node running torchrun, wrapping {wrap})",
                       _notes(pf, wrap))
    script = (
        header.replace("#!/usr/bin/env bash\n", "#!/bin/bash\n", 1)
        + f"#SBATCH --job-name=llmplan-{pf.model.name}\n#SBATCH --nodes={c.num_nodes}\n"
        f"#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node={c.gpus_per_node_used}\n"
        "#SBATCH --exclusive\n"
        "set -euo pipefail\n"
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        'head_node_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | cut -d" " -f1)\n'
        + (defs + "\n" if defs else "")
        + f'srun torchrun --nnodes {c.num_nodes} --nproc-per-node {c.gpus_per_node_used} --rdzv-id "$SLURM_JOB_ID" '
        '--rdzv-backend c10d --rdzv-endpoint "$head_node_ip:29500" \\\n    ' + entry + "\n"
    )
    return {**files, "job.sbatch": script}
