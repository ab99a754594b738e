"""Where the vLLM and SGLang launch lines of a serving plan run when its servers do not fit one node as one
command: one command per node (or per server on a node), with the flags each launcher needs to join the nodes of
one server, and the refusals where the launcher cannot start the plan as llmplan placed it (consecutive GPUs,
topology.placement).

Launcher facts (each read in the launcher's source):
- SGLang: one server over several nodes runs `--nnodes N --node-rank K --dist-init-addr HOST:PORT` on each
  (the same address everywhere; sgl-project/sglang python/sglang/srt/server_args.py, add_cli_args "Multi-node
  distributed serving"), and starts tp-size / nnodes ranks per node on consecutive GPUs from `--base-gpu-id`
  (sgl-project/sglang @001067ff, python/sglang/srt/entrypoints/engine.py, _calculate_rank_ranges and
  _launch_scheduler_processes), so a server is whole nodes or an even share of one node.
- vLLM, one DP rank (tp x pp) over several nodes: `--nnodes N --node-rank K --master-addr HEAD` on each, and
  `--headless` on all but node 0 (vllm-project/vllm @096bd6a4, docs/serving/parallelism_scaling.md, "Running
  vLLM with MultiProcessing"; the flags: vllm/engine/arg_utils.py, EngineArgs.add_cli_args, ParallelConfig group).
- vLLM, DP ranks over several nodes: `--data-parallel-size D --data-parallel-size-local R
  --data-parallel-address HEAD --data-parallel-rpc-port PORT` on each node, `--data-parallel-start-rank S` and
  `--headless` on the others (vllm-project/vllm @01e4fce0, docs/serving/data_parallel_deployment.md, "Internal
  Load Balancing"); a DP rank whose TP group spans nodes runs only through its Ray backend (same page:
  `--data-parallel-backend=ray` with VLLM_RAY_DP_PACK_STRATEGY=span), which llmplan does not write."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmplan.export.common import refuse
from llmplan.planfile import PlanFile

HEAD_LINE = ("# FILL IN HEAD_ADDR: the IP address of node 0 of the server, reachable from its other nodes, the "
             "same on every node (e.g. HEAD_ADDR=10.0.0.1 NODE_RANK=1 ./this_script)\n"
             "HEAD_ADDR=${HEAD_ADDR:?FILL IN the IP address of node 0}\n")
"""The head address placeholder: the script stops with this message until the user sets it."""


@dataclass(frozen=True)
class NodeLaunch:
    """The commands of a plan's launch that needs more than one command: `nodes[k]` the extra flags of each
    server command node k runs (appended to the common ones), `drop` the common flags left out (a per-node value
    replaces them), `head` whether the commands name node 0's address, `note` comment lines saying how to run it."""
    nodes: list[list[list[str]]]
    note: str
    head: bool = False
    ports: str = ""
    drop: tuple[str, ...] = field(default=())


SGLANG_PORT, PORT_STRIDE = 30000, 1000
"""The --port of the first SGLang server on a node and the step between the servers of one node. With DP attention
SGLang binds TCP ports derived from --port: the dist-init port --port + 233 (ZMQ_TCP_PORT_DELTA, single node, no
--dist-init-addr), then the tokenizer, detokenizer, rpc, metrics and scheduler-input ports at +234 to +238, the load
collector at +239 and, on its Rust-server path, one scheduler-input port a DP rank from +240
(sgl-project/sglang @001067ff, python/sglang/srt/server_args.py, PortArgs.init_new; older versions put the DP ranks'
scheduler-input ports at +239 + dp_rank and the nccl port at --port + 100 to 1000, checked free). Servers 1 apart
overlapped (server j's +234 is server j+1's +233); 1000 apart, each server's ports stay below the next one's --port
for any DP size up to 760 ranks."""

UNEVEN = {"sglang": "SGLang starts tp-size / nnodes ranks on every node of a server (entrypoints/engine.py "
                    "_calculate_rank_ranges)",
          "vllm": "llmplan writes vLLM's --nnodes launch for whole nodes only (its documented example: 8 GPUs on "
                  "each of 2 nodes; an uneven split was not read in its source)"}
"""Why each launcher's server over nodes must be whole nodes."""


def _span(g: int, per_node: int, engine: str, what: str) -> int:
    """Nodes a group of g GPUs spans; refuses a group that is not whole nodes (UNEVEN)."""
    if g % per_node:
        raise refuse(engine, f"{what} of {g} GPUs over nodes of {per_node} would take part of a node (llmplan places "
                     f"it on consecutive GPUs), and {UNEVEN[engine]}",
                     f"re-plan with a group of whole nodes (a multiple of {per_node} GPUs) or at most one node")
    return g // per_node


def _on_nodes(n: int) -> str:
    """Where the script runs: on its one node, or on each of n with its NODE_RANK."""
    return "on its node" if n == 1 else f"on each of the {n} nodes with NODE_RANK 0 to {n - 1}"


def _head_note(n: int, per_node: int, groups: int, head: str = "the head") -> str:
    """The first note of a server over n nodes: where to run the script, and whose address HEAD_ADDR is."""
    whose = "HEAD_ADDR the same on all" if groups == 1 else "HEAD_ADDR that server's node 0 on all of them"
    return (f"# one server over {n} nodes of {per_node} GPUs: run this script on each of them with NODE_RANK 0 "
            f"({head}) to {n - 1}, {whose}\n")


def _groups_note(groups: int, what: str, g: int, n: int) -> str:
    """The note of `groups` independent servers of g GPUs over n nodes each: one group of nodes each, its own
    HEAD_ADDR; empty for one server."""
    if groups == 1:
        return ""
    return (f"# {groups} {what} of {g} GPUs ({n} nodes each), independent servers as priced: start this script on "
            "each group of nodes, HEAD_ADDR that group's node 0, and spread requests over the servers (e.g. a "
            "router)\n")


def _shares(servers: int, per_node: int) -> list[int]:
    """Servers (or DP ranks) on each node, `per_node` on each but the last."""
    return [min(per_node, servers - k) for k in range(0, servers, per_node)]


def sglang_nodes(pf: PlanFile) -> NodeLaunch | None:
    """SGLang's commands when one command on one node does not run the plan (None: it does). A server over n
    nodes: one command per node with --nnodes / --node-rank / --dist-init-addr; TP replicas that fill several
    nodes: one server per node with that node's --dp-size (each its own DP controller); DP-attention servers
    smaller than a node: one command per server with --base-gpu-id and its own --port."""
    p, per_node = pf.plan, pf.cluster.gpus_per_node_used
    s, copies = p.gpus_per_copy, p.copies
    if s > per_node:
        n = _span(s, per_node, "sglang", "a DP-attention server" if p.dp_attention else "a replica (tp x pp)")
        dist = '--dist-init-addr "$HEAD_ADDR:$DIST_PORT"'
        nodes = [[[f"--nnodes {n}", f"--node-rank {k}", dist]] for k in range(n)]
        note = _head_note(n, per_node, copies) + _groups_note(
            copies, "DP-attention servers" if p.dp_attention else "replicas", s, n)
        return NodeLaunch(nodes, note, head=True, ports="DIST_PORT=${DIST_PORT:-20000}\n", drop=("--dp-size",))
    if p.dp_attention and s < per_node and copies > 1:
        if per_node % s:
            raise refuse("sglang", f"DP-attention servers of {s} GPUs on nodes of {per_node} would straddle nodes",
                         f"re-plan with --ep dividing {per_node}")
        shares = _shares(copies, per_node // s)
        nodes = [[[f"--base-gpu-id {j * s}", f"--port {SGLANG_PORT + PORT_STRIDE * j}"] for j in range(m)]
                 for m in shares]
        return NodeLaunch(nodes, (f"# {copies} DP-attention servers of {s} GPUs, {per_node // s} on a node: each "
                                  "command is one server on GPUs --base-gpu-id onward, at its own --port; run this "
                                  f"script {_on_nodes(len(shares))} and spread requests over the servers (e.g. a "
                                  "router)\n"))
    if not p.dp_attention and p.num_gpus > per_node:
        if per_node % s:
            raise refuse("sglang", f"replicas of tp x pp = {s} GPUs on nodes of {per_node} would straddle nodes",
                         f"re-plan with tp x pp dividing {per_node}")
        shares = _shares(copies, per_node // s)
        nodes = [[[f"--dp-size {m}"] if m > 1 else []] for m in shares]
        each = ", its replicas under its own --dp-size (one DP controller each)" if shares[0] > 1 else ""
        return NodeLaunch(nodes, (f"# {copies} replicas over {len(shares)} nodes: one SGLang server a node{each} "
                                  "(SGLang runs --dp-size over one node only without DP attention); run this script "
                                  f"{_on_nodes(len(shares))} and spread requests over the servers (e.g. a "
                                  "router)\n"), drop=("--dp-size",))
    return None


def vllm_nodes(pf: PlanFile) -> NodeLaunch | None:
    """vLLM's commands when one command on one node does not run the plan's launch (one DP deployment: dp
    replicas, or under DP attention one server's attention ranks; None: it fits a node). A DP rank over n nodes
    (dp 1): --nnodes / --node-rank / --master-addr, --headless but on node 0; DP ranks over several nodes:
    --data-parallel-size-local / --data-parallel-start-rank / --data-parallel-address / --data-parallel-rpc-port,
    --headless but on node 0. Refuses DP ranks whose TP group spans nodes when they share experts."""
    p, per_node = pf.plan, pf.cluster.gpus_per_node_used
    unit, ranks = p.tp * p.pp, p.attn_dp if p.dp_attention else p.dp
    if unit * ranks <= per_node:
        return None
    if unit > per_node:
        n = _span(unit, per_node, "vllm", "a DP rank (tp x pp)")
        if ranks > 1 and (p.ep > 1 or p.dp_attention):
            raise refuse("vllm", f"{ranks} DP ranks sharing their experts, each of tp x pp = {unit} GPUs over {n} "
                         "nodes: vLLM starts a DP rank that spans nodes only with its Ray backend "
                         "(--data-parallel-backend ray, VLLM_RAY_DP_PACK_STRATEGY=span), which llmplan does not write",
                         f"re-plan with tp x pp at most {per_node}, or one replica")
        nodes = [[[f"--nnodes {n}", f"--node-rank {k}", '--master-addr "$HEAD_ADDR"', *(["--headless"] if k else [])]]
                 for k in range(n)]
        note = _head_note(n, per_node, p.copies, "the head, which serves the API") + _groups_note(
            p.copies, "DP-attention servers" if p.dp_attention else "replicas", p.gpus_per_copy, n)
        return NodeLaunch(nodes, note, head=True, drop=("--data-parallel-size",))
    if per_node % unit:
        raise refuse("vllm", f"DP ranks of tp x pp = {unit} GPUs on nodes of {per_node} would straddle nodes",
                     f"re-plan with tp x pp dividing {per_node}")
    local = per_node // unit
    shares = _shares(ranks, local)
    common = ['--data-parallel-address "$HEAD_ADDR"', '--data-parallel-rpc-port "$RPC_PORT"']
    nodes = [[[f"--data-parallel-size-local {m}", *([f"--data-parallel-start-rank {k * local}", "--headless"]
                                                    if k else []), *common]] for k, m in enumerate(shares)]
    n, whose = len(shares), "HEAD_ADDR the same on all" if p.copies == 1 else "HEAD_ADDR that server's node 0 on all"
    note = (f"# {ranks} DP ranks of {unit} GPU{'s' * (unit > 1)} over {n} nodes, one endpoint: run this script on each "
            f"node with NODE_RANK 0 (the head, which serves the API) to {n - 1}, {whose}\n")
    return NodeLaunch(nodes, note + _groups_note(p.copies, "DP-attention servers", unit * ranks, n), head=True,
                      ports="RPC_PORT=${RPC_PORT:-13345}\n")


def node_script(launch: NodeLaunch, command: str, flags: list[str]) -> str:
    """The shell text that runs `command` with the common `flags` (less launch.drop) and each node's own: the
    head address placeholder and the port lines where the commands need them, NODE_RANK, one case per node; several
    servers on a node run in the background, and the first that exits non-zero ends the script (bash wait -n)."""
    kept = [f for f in flags if f.split(" ", 1)[0] not in launch.drop]
    n = len(launch.nodes)
    text = (HEAD_LINE if launch.head else "") + launch.ports
    text += ("NODE_RANK=${NODE_RANK:-0}\n" if n == 1 else
             f"NODE_RANK=${{NODE_RANK:?set NODE_RANK to the rank of this node, 0 to {n - 1}}}\n")
    text += "ARGS=(\n" + "".join(f"    {f}\n" for f in kept) + ")\n"
    text += 'case "$NODE_RANK" in\n'
    for k, servers in enumerate(launch.nodes):
        many = len(servers) > 1
        text += f"    {k})\n"
        for extra in servers:
            words = [f'{command} "${{ARGS[@]}}"', *extra]
            text += " \\\n".join(f"        {w}" if i == 0 else f"            {w}" for i, w in enumerate(words))
            text += (" &" if many else "") + "\n"
        if many:  # the first server to fail stops the others and the script with its status (plain wait: 0)
            text += (f"        for _ in {' '.join(str(i + 1) for i in range(len(servers)))}; do\n"
                     '            wait -n || { s=$?; kill $(jobs -p) 2>/dev/null || true; exit "$s"; }\n'
                     "        done\n")
        text += "        ;;\n"
    return text + f'    *) echo "NODE_RANK must be 0 to {n - 1}" >&2; exit 2 ;;\nesac\n'
