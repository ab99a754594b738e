"""`llmplan collective`: one collective's predicted time and bus bandwidth."""

from __future__ import annotations

from typing import Optional

import typer

from llmplan import report
from llmplan.cli import options as opt
from llmplan.cli.app import app, emit, out
from llmplan.errors import LlmplanError, not_one_of
from llmplan.specs.cluster import ClusterSpec
from llmplan.topology.collectives import OPS
from llmplan.units import parse_size


@app.command()
def collective(
    op: str = typer.Option("all-reduce", "--op", help=f"One of: {', '.join(OPS)}."),
    size: str = typer.Option("1GiB", "--size", help="Buffer size as nccl-tests counts it, e.g. 256MiB, 1GiB, 4e9."),
    gpus: int = typer.Option(8, "--gpus", min=1, help="Ranks in the group."),
    hardware: str = typer.Option(..., "--hardware", help="Built-in system name or path to a system profile."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1,
                                                help="Ranks placed on each node (default: fill nodes)."),
    algorithm: str = typer.Option("auto", "--algorithm", help="auto | ring | tree | hierarchical."),
    nvls: bool = typer.Option(True, "--nvls/--no-nvls", help="NVLink SHARP for all-reduce (NCCL_NVLS_ENABLE)."),
    json_mode: bool = opt.JSON,
) -> None:
    """Predicted time, algorithm and bus bandwidth of one collective (compare with nccl-tests)."""
    from llmplan.cli.inputs import make_cluster
    from llmplan.specs.registry import resolve_system
    from llmplan.topology.collectives import group_collective_time
    if op not in OPS:
        raise LlmplanError(not_one_of("--op", op, OPS, "a collective llmplan models"))
    if algorithm not in ("auto", "ring", "tree", "hierarchical"):
        raise LlmplanError(f"--algorithm {algorithm}: use auto, ring, tree or hierarchical")
    system = resolve_system(hardware)
    per_node = gpus_per_node or min(gpus, system.gpus_per_node)
    if gpus % per_node:
        raise LlmplanError(f"--gpus ({gpus}) must be a multiple of --gpus-per-node ({per_node})")
    most = ClusterSpec.model_fields["num_nodes"].metadata  # the cluster's node bound, as ClusterSpec states it
    limit = next(int(b.le) for b in most if hasattr(b, "le"))
    if gpus // per_node > limit:
        raise LlmplanError(f"--gpus {gpus} at {per_node} per node is {gpus // per_node:,} nodes, more than the "
                           f"{limit:,} a cluster may have; give --gpus {limit * per_node:,} or fewer")
    cluster = make_cluster(hardware, gpus // per_node, per_node)
    ct, span = group_collective_time(op, parse_size(size, "--size"), cluster, algorithm, nvls)
    group = span.describe(*report.fabric_names(system))
    emit(report.collective_json(ct, group), json_mode, lambda: report.collective_view(out, ct, group, system))
