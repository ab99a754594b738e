"""BLOOM's 206B out-of-memory attempt of 2022-02-28 (chronicles-prequel.md 'Rebalancing layers': L82 h14336 a128,
DP8 TP4 PP12 micro-batch 2, OOM) beside the 02-28 rows of the same layout that ran (issue 32;
docs/validation.md#bloom-206b). Analysis only: nothing in llmplan reads this file.

For each row: the logged Mem (nvidia-smi on jean-zay-iam01, the first node: DeepSpeed's
PipeModelDataParallelTopology orders ranks pipe-major, so its 8 GPUs are pipeline stage 0), the layers a stage
holds, the softmax path the day's Megatron-DeepSpeed took (accuracy.bigscience_softmax_kernel), and llmplan's
allocated peak of stages 0, 1, 5, 10 and 11 with the nvidia-smi view of stage 0. Then the step the logged rows
measure for one more layer a stage.

    PYTHONPATH=$PWD python benchmarks/bloom_206b.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy as A  # noqa: E402

from llmplan.cost.memory import stage_memory  # noqa: E402
from llmplan.estimate import estimate_training  # noqa: E402
from llmplan.specs.allowance import MemoryAllowance  # noqa: E402

GIB = 2**30
PREFIX = "bloom-prequel-rebalancing-layers-"
ROWS = ("L70h14336a128", "L82h13312a128", "L94h13312a128", "L106h12288a128", "L82h14336a128")
STAGES = (0, 1, 5, 10, 11)


def main() -> None:
    recs = {r["id"]: r for r in yaml.safe_load(Path(A.DEFAULT_RUNS).read_text())}
    smi: dict[str, float] = {}
    print("row (dp8tp4pp12mbs2): logged Mem, slots a stage, softmax, stage-0 params;")
    print("  allocated GiB at stages " + " / ".join(str(s) for s in STAGES) + "; nvidia-smi view of stage 0")
    for short in ROWS:
        rec = recs[f"{PREFIX}{short}-dp8tp4pp12mbs2gbs2048z1"]
        setup = A.record_setup(rec, "bloom", None)
        if setup is None:
            raise SystemExit(f"{short}: accuracy.record_setup does not score this record")
        m, c, p = setup
        meas = rec["measured"]
        logged = meas.get("memory_gb_max", meas.get("outcome", "?"))
        e = estimate_training(m, c, p)
        cap = float(e.memory.capacity)
        mems = [stage_memory(m, p, s, MemoryAllowance(), cap) for s in STAGES]
        smi[short] = A.nvidia_smi_bytes(mems[0]) / GIB
        kernel = A.bigscience_softmax_kernel(rec, "bloom", m.num_attention_heads, p.tp, p.micro_batch)
        slots = (m.num_hidden_layers + 2) // p.pp
        print(f"{short:<15} {str(logged):>4} {slots:>2} {kernel:>10} {float(mems[0].params_on_rank) / 1e9:.3f} G")
        print(f"  {' / '.join(f'{float(x.total) / GIB:.1f}' for x in mems)}; {smi[short]:.2f}")
    print("\none more layer a stage (logged GB; llmplan's nvidia-smi view of stage 0, GiB):")
    print(f"  L82h13312 -> L94h13312: logged 60 -> 67 (+7);\n    llmplan {smi['L82h13312a128']:.2f} -> "
          f"{smi['L94h13312a128']:.2f} ({smi['L94h13312a128'] - smi['L82h13312a128']:+.2f})")
    step = smi["L82h14336a128"] - smi["L70h14336a128"]
    print(f"  L70h14336 -> L82h14336: logged 60 -> OOM;\n    llmplan {smi['L70h14336a128']:.2f} -> "
          f"{smi['L82h14336a128']:.2f} ({step:+.2f}): logged 60 + step = {60 + step:.1f}")


if __name__ == "__main__":
    main()
