"""Exporting a plan over several pools (specs.pools; `search --hardware cluster.yaml --save`).

Megatron-LM runs a pipeline whose stages hold different layer counts (--pipeline-model-parallel-layout) and
numbers its ranks with the pipeline stage outermost (parallel_state.py: tp-cp-ep-dp-pp), so a pool that holds
stages a..b holds global ranks a·w .. (b+1)·w - 1 (w = tp·cp·dp), that is whole nodes in order: the rank-to-pool
mapping is a NODE_RANK range per pool. torchrun with a static rendezvous (--node-rank) gives node k the ranks
k·nproc .. (k+1)·nproc - 1 (torch.distributed.run docs); a SLURM heterogeneous job lists one component per pool
(`#SBATCH hetjob` between them) and `srun --het-group=0,1,...` starts one step over all of them whose task
ranks (SLURM_PROCID) run through the components in order (SchedMD, Slurm heterogeneous_jobs.html, "Launching
Applications" and the SLURM_PROCID note; SLURM_JOB_NODELIST_HET_GROUP_<n> per component).

What cannot run mixed pools: DeepSpeed, torchtitan and Megatron-Bridge start every rank with one
configuration and split the layers evenly or by their own rule (no per-stage layout of llmplan's); vLLM and
SGLang serve; and no launcher gives data-parallel ranks different shares of the batch (Megatron-LM's
micro-batch calculator gives every DP rank global_batch / dp), so plans with replicas on several pools are
refused everywhere.
"""

from __future__ import annotations

from llmplan.cost.params import stage_layer_list
from llmplan.export import megatron
from llmplan.export.common import CannotExpress, refuse, sh_header
from llmplan.planfile import PlanFile, saved_pools
from llmplan.specs.pools import HeteroPlan, PoolCluster

MIXED_TARGETS = ("megatron", "torchrun", "slurm")
"""Targets that can run a pipeline over pools: Megatron-LM itself, and torchrun / SLURM wrapping it."""


def pool_plan(pf: PlanFile) -> tuple[PoolCluster, HeteroPlan] | None:
    """The pools and the plan's assignment saved with the plan (planfile.saved_pools), when it spans two or
    more pools; None for a plan on one system."""
    saved = saved_pools(pf)
    return saved if saved is not None and len(saved[1].pools_used()) > 1 else None


def check(pf: PlanFile, target: str, wrap: str, pools: tuple[PoolCluster, HeteroPlan]) -> None:
    """Refuse, with the reason, a target or a plan that cannot run on mixed pools."""
    pc, hp = pools
    names = ", ".join(f"{pc.pools[g].name} ({pc.pools[g].system.gpu.name})" for g in hp.pools_used())
    if hp.assignment == "replicas":
        raise refuse(target, f"its data-parallel replicas on {names} take different shares of the global batch "
                     f"({', '.join(str(b) for b in hp.replica_batches or ())}), and no launcher gives DP ranks "
                     "unequal batches (Megatron-LM gives each global_batch / dp)",
                     "re-plan with the pools' stages split instead, or run the pools as separate jobs")
    if target not in MIXED_TARGETS or (target != "megatron" and wrap != "megatron"):
        raise refuse(target, f"the pipeline runs on pools of different GPUs ({names}) with a per-stage layer "
                     f"layout, which only Megatron-LM's --pipeline-model-parallel-layout takes here",
                     "export to megatron, or to torchrun / slurm with --wrap megatron")
    if pf.axis_order[-1] != "pp":
        raise refuse(target, f"rank order {'-'.join(pf.axis_order)} does not put the pipeline stages outermost, "
                     "so a pool's ranks are not one block of nodes", "re-plan with the default --axis-order")
    per_node = {pc.pools[g].system.gpus_per_node for g in hp.pools_used()}
    if len(per_node) > 1:
        raise refuse(target, f"the pools' nodes hold {sorted(per_node)} GPUs, and torchrun starts the same "
                     "--nproc-per-node on every node", "use pools whose nodes have as many GPUs")


def node_ranges(pf: PlanFile, pools: tuple[PoolCluster, HeteroPlan]) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """(pool, first node rank, nodes, stages) of every pool in rank order."""
    pc, hp = pools
    p = pf.plan
    width = p.tp * p.cp * p.dp
    per = pc.pools[hp.pools_used()[0]].system.gpus_per_node
    out = []
    for g in dict.fromkeys(hp.stage_pools or ()):
        stages = tuple(i for i, x in enumerate(hp.stage_pools or ()) if x == g)
        out.append((g, stages[0] * width // per, len(stages) * width // per, stages))
    return out


def mapping_text(pf: PlanFile, pools: tuple[PoolCluster, HeteroPlan]) -> str:
    """pool_ranks.csv: which nodes, ranks, stages and layers each pool holds."""
    pc, _ = pools
    p = pf.plan
    width = p.tp * p.cp * p.dp
    layers = stage_layer_list(pf.model, p)  # the plan's own layout, not the predictions saved beside it
    lines = ["pool,system,gpu,first_node_rank,nodes,first_rank,last_rank,stages,layers"]
    for g, first, nodes, stages in node_ranges(pf, pools):
        pool = pc.pools[g]
        lay = "+".join(str(layers[i]) for i in stages) if len(layers) == p.pp else ""
        lines.append(f"{pool.name},{pool.system.name},{pool.system.gpu.name},{first},{nodes},{stages[0] * width},"
                     f"{(stages[-1] + 1) * width - 1},{stages[0]}-{stages[-1]},{lay}")
    return "\n".join(lines) + "\n"


def render(pf: PlanFile, target: str, wrap: str, pools: tuple[PoolCluster, HeteroPlan]) -> dict[str, str]:
    """The target's files, each header naming the pools (not the one system the plan file snapshots)."""
    files = _render(pf, target, wrap, pools)
    c, (pc, _) = pf.cluster, pools
    one = f"# hardware: {c.num_nodes} x {c.system.name} = {c.num_gpus} x {c.system.gpu.name}\n"
    mixed = "# hardware: " + " + ".join(f"{n} x {pc.pools[g].system.name} ({pc.pools[g].name})"
                                        for g, _, n, _ in node_ranges(pf, pools)) + " (pool_ranks.csv)\n"
    return {name: text.replace(one, mixed, 1) for name, text in files.items()}


def check_all(pf: PlanFile, target: str, wrap: str, pools: tuple[PoolCluster, HeteroPlan]) -> None:
    """Every refusal _render can meet, in its order: the pools' own (check), then Megatron-LM's, whose script
    every mixed target writes."""
    check(pf, target, wrap, pools)
    megatron.check(pf)


def _render(pf: PlanFile, target: str, wrap: str, pools: tuple[PoolCluster, HeteroPlan]) -> dict[str, str]:
    check_all(pf, target, wrap, pools)
    files = {**megatron.render(pf), "pool_ranks.csv": mapping_text(pf, pools)}
    if target == "megatron":
        return files
    pc, _ = pools
    ranges = node_ranges(pf, pools)
    per = pf.cluster.gpus_per_node_used
    nodes = sum(n for _, _, n, _ in ranges)
    if target == "torchrun":
        cases = "".join(f"    {pc.pools[g].name}) FIRST={first}; COUNT={n} ;;   # stages {s[0]}-{s[-1]}\n"
                        for g, first, n, s in ranges)
        script = (sh_header(pf, "torchrun over pools (static ranks: a pool's nodes take its NODE_RANK range)")
                  + "set -euo pipefail\n"
                  "# on every node: POOL=<pool> POOL_NODE=<0..its nodes - 1> MASTER_ADDR=<node rank 0's host>\n"
                  'case "${POOL:?set POOL to the pool this node belongs to}" in\n' + cases
                  + '    *) echo "unknown POOL $POOL (see pool_ranks.csv)" >&2; exit 2 ;;\nesac\n'
                  'POOL_NODE=${POOL_NODE:?set POOL_NODE to the index of this node within its pool}\n'
                  'if [ "$POOL_NODE" -ge "$COUNT" ]; then echo "POOL_NODE $POOL_NODE: the pool has $COUNT '
                  'nodes" >&2; exit 2; fi\n'
                  f"export NNODES={nodes} GPUS_PER_NODE={per} NODE_RANK=$((FIRST + POOL_NODE))\n"
                  'exec "$(dirname "$0")/megatron_pretrain.sh"\n')
        return {**files, "torchrun_pools.sh": script}
    comps = []
    for i, (g, first, n, s) in enumerate(ranges):
        pool = pc.pools[g]
        comps.append(("#SBATCH hetjob\n" if i else "")
                     + f"#SBATCH --nodes={n} --ntasks-per-node=1 --gpus-per-node={per} --exclusive\n"
                     f"# component {i}: pool {pool.name} ({pool.system.name}), stages {s[0]}-{s[-1]}, node ranks "
                     f"{first}-{first + n - 1}; add its --partition / --constraint\n")
    header = sh_header(pf, "SLURM heterogeneous job, one component per pool (wrapping megatron)")
    script = (header.replace("#!/usr/bin/env bash\n", "#!/bin/bash\n", 1)
              + f"#SBATCH --job-name=llmplan-{pf.model.name}\n" + "".join(comps)
              + "set -euo pipefail\n"
              'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | head -n 1)\n'
              f"export MASTER_ADDR=$head_node MASTER_PORT=${{MASTER_PORT:-6000}} NNODES={nodes} GPUS_PER_NODE={per}\n"
              "# one task per node; SLURM_PROCID runs through the components in order: the node rank\n"
              f"srun --het-group={','.join(str(i) for i in range(len(ranges)))} "
              "bash -c 'NODE_RANK=$SLURM_PROCID exec ./megatron_pretrain.sh'\n")
    return {**files, "job.sbatch": script}


def render_all(pf: PlanFile, target: str, wrap: str, pools: tuple[PoolCluster, HeteroPlan],
               targets: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str]]:
    """As export.render_all for a plan over pools: the mixed targets render, the others say why not."""
    if target != "all":
        return render(pf, target, wrap, pools), {}
    files: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for t in targets:
        try:
            files.update(render(pf, t, wrap, pools))
        except CannotExpress as e:
            skipped[t] = str(e)
    if not files:
        raise CannotExpress("no target can express this plan: " + "; ".join(dict.fromkeys(skipped.values())))
    return files, skipped
