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
  `--data-parallel-backend=ray` with VLLM_RAY_DP_PACK_STRATEGY=span), which llmplan does not write. The same flags
  start DP-attention servers placed on consecutive GPUs that straddle nodes (check_plan's dp_attention_nodes rule
  leaves them to vLLM): one command per server part, its GPUs a slice of the node's CUDA_VISIBLE_DEVICES; all five
  flags are in vLLM 0.33.0's parser (vllm/entrypoints/common/cli_args.py make_arg_parser, as recorded in
  tests/data/launchers/vllm.json)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from llmplan.export.common import refuse
from llmplan.export.serve_shell import (count_check, joined, port_advice, port_var, port_word,
                                         visible_lines, visible_slice)
from llmplan.planfile import PlanFile

HEAD_LINE = ("# FILL IN HEAD_ADDR: the IP address of node 0 of the server, reachable from its other nodes, the "
             "same on every node (e.g. HEAD_ADDR=10.0.0.1 NODE_RANK=1 ./this_script)\n"
             "HEAD_ADDR=${HEAD_ADDR:?FILL IN the IP address of node 0}\n")
"""The head address placeholder: the script stops with this message until the user sets it."""

ROUTER_HINT = "(e.g. a router)"
"""How a note names what spreads requests over several servers; the export puts its router script's name in its
place where it writes one (export.serve)."""

NIXL_HOST = ("VLLM_NIXL_SIDE_CHANNEL_HOST, where NIXL's side channel listens, defaults to localhost and must be this "
             "node's address when prefill and decode run on different machines (vllm-project/vllm @026c83f9, "
             "docs/features/nixl_connector_usage.md, \"Environment Variables\")")
"""Why a vLLM pool's per-node script sets VLLM_NIXL_SIDE_CHANNEL_HOST (node_script)."""


@dataclass(frozen=True)
class NodeLaunch:
    """The commands of a plan's launch that needs more than one command: `nodes[k]` the extra flags of each
    server command node k runs (appended to the common ones), `env[k]` the environment assignments written before
    each of those commands (none where empty), `drop` the common flags left out (a per-node value replaces them),
    `head` whether the commands name node 0's address, `ports` the port variables the commands read (each with
    its default, the user's value taken), `checks` the lines that stop the script (exit 2) on a port value whose
    ports would collide, `note` comment lines saying how to run it; `endpoints` the servers a router reaches,
    per address (one address a node, or a server's node 0 where `per_server`): each server's --port and, for a
    prefill server, its bootstrap port, as shell words over the port variables (export.serve_router). `visible`:
    the GPUs a node's servers take slices of (serve_shell.visible_lines; 0: no slices); `addrs`: the nodes whose
    addresses NODE_ADDRS lists, in NODE_RANK order (0: none read); `nixl_host`: the node's NIXL side-channel host
    is set from NODE_ADDR (NIXL_HOST); `guard`: lines that stop the serve script (not its router's) on an
    environment the launch cannot run under (none written at present); `binds`: the ports a node binds besides
    its servers' --port (and a prefill server's bootstrap port), which a router on that node must avoid: (lo, hi,
    words) blocks, lo and hi shell arithmetic over the port variables, the words naming them with their values
    at run time (bound_block)."""
    nodes: list[list[list[str]]]
    note: str
    head: bool = False
    ports: str = ""
    drop: tuple[str, ...] = field(default=())
    env: list[list[str]] = field(default_factory=list)
    checks: str = ""
    endpoints: list[list[tuple[str, str]]] = field(default_factory=list)
    per_server: bool = False
    visible: int = 0
    addrs: int = 0
    nixl_host: bool = False
    guard: str = ""
    binds: tuple[tuple[str, str, str], ...] = ()


def shown_port(expr: str) -> str:
    """The shell word that prints the port of the arithmetic `expr` inside a message: a number as is, a port
    variable as $VAR, else $((...)) without blanks (stop breaks a message at blanks, which must not fall inside
    an expansion)."""
    if expr.isdigit():
        return expr
    return f"${expr}" if expr.isidentifier() else f"$(({expr.replace(' ', '')}))"


def bound_block(lo: str, hi: str, what: str) -> tuple[str, str, str]:
    """A block of ports a node binds (NodeLaunch.binds): its ends, shell arithmetic over the port variables, and
    `what` followed by the ends' values as the shell computes them (shown_port)."""
    ends = shown_port(lo) if lo == hi else f"{shown_port(lo)} to {shown_port(hi)}"
    return lo, hi, f"{what} ({ends})"


SGLANG_PORT, PORT_STRIDE, GRPC_DELTA, BOOTSTRAP_PORT = 30000, 1000, 10000, 8998
"""SGLang servers on one node (sgl-project/sglang, the 0.5.23 PyPI wheel, read): the default --port of the first,
the step between the --port of the servers of a node, the offset of the gRPC port from --port, and the default
--disaggregation-bootstrap-port. Besides --port, a DP-attention server binds TCP ports derived from it: the
dist-init port --port + 233 (ZMQ_TCP_PORT_DELTA, one node, no --dist-init-addr), the tokenizer, detokenizer, rpc,
metrics, scheduler-input and load-collector ports at + 234 to + 239 and, on its Rust-server path
(SGLANG_RUST_SERVER), one scheduler-input port a DP rank from + 240 and one listener a local DP rank from --port
itself (srt/server_args.py PortArgs.init_new; rust_server/server.py); the DP controller's handshake at --port + 13
(DP_ATTENTION_HANDSHAKE_PORT_DELTA, managers/data_parallel_controller.py); the legacy gRPC server (--smg-grpc-mode)
at --port + 10000, whose range SGLang checks (arg_groups/serving_hook.py _handle_deprecated_args; an older
server_args.py, quoted in notes in the code index, checked --port + 10000 <= 65535 on every launch). A prefill
server of a disaggregated deployment also binds its KV bootstrap server at --disaggregation-bootstrap-port, 8998
unless given (managers/disagg_service.py start_disagg_service, which warns that servers on one host need distinct
ones). Where a derived port would pass 65535 SGLang moves the block below --port instead, outside the layout below;
so the script keeps every server's --port + 10000 within 65535 (sglang_ports). The NCCL and DP worker ports are
picked free by the OS. Re-read at named commits for the router's check (serve_router._taken): sgl-project/sglang
@001067ff python/sglang/srt/server_args.py PortArgs.init_new (`nccl_port = get_free_port()` unless --nccl-port;
with DP attention `port_base = dist_init_port + 1`, detokenizer / rpc / metrics / scheduler-input /
load-collector at port_base + 1 to + 5, the Rust path's `port_base + 6 + dp_rank`, dist_init_port = --port +
ZMQ_TCP_PORT_DELTA on one node without --dist-init-addr, else --dist-init-addr's port); @0317b608
python/sglang/srt/arg_groups/serving_hook.py handle_deprecated_args (`grpc_port=cfg.port + 10000` only under
--smg-grpc-mode / --grpc-mode; the native gRPC server only at --grpc-port / SGLANG_GRPC_PORT, neither written
by llmplan): the gRPC port is kept free as the server's own whether or not the user adds that flag."""


ZMQ_SPAN = 240
"""--port + 233 (the dist-init port) + 1 (port_base) + 6 fixed ports: the derived block ends at --port + 239, the
Rust path's DP-rank ports follow it (SGLANG_PORT)."""


def sglang_span(ranks: int) -> int:
    """Ports from a DP-attention server's --port through the last one it derives (SGLANG_PORT's list, the Rust
    path's one port a DP rank included): --port + 239 + ranks is its last."""
    return ZMQ_SPAN + ranks


def sglang_stride(servers: int, ranks: int, per_node: int) -> int:
    """The step between the --port of `servers` DP-attention servers of `ranks` ranks on one node: PORT_STRIDE,
    or where that many would not fit their blocks inside GRPC_DELTA ports (so that no gRPC port lands in a block),
    GRPC_DELTA // servers; refuses when a block does not fit that step."""
    stride = PORT_STRIDE if servers * PORT_STRIDE <= GRPC_DELTA else GRPC_DELTA // servers
    if stride < sglang_span(ranks):
        raise refuse("sglang", f"{servers} DP-attention servers of {ranks} ranks on a node of {per_node} GPUs: each "
                     f"binds {sglang_span(ranks)} ports from its --port (PortArgs.init_new), and {servers} such "
                     f"blocks do not fit under the {GRPC_DELTA} ports below their gRPC ports (--port + {GRPC_DELTA})",
                     "re-plan with fewer, larger servers (a larger --ep)")
    return stride


def sglang_ports(servers: int, stride: int, ranks: int, prefill: bool) -> tuple[str, str]:
    """The port variables of `servers` SGLang DP-attention servers on a node and the checks on the user's values:
    server j's --port is PORT + stride j; PORT must keep the last server's gRPC port (--port + GRPC_DELTA) within
    65535, and a prefill server's bootstrap ports (BOOTSTRAP_PORT + j) must lie outside every server's ports
    (SGLANG_PORT)."""
    last = stride * (servers - 1)
    top, reach = 65535 - GRPC_DELTA - last, last + GRPC_DELTA
    parts = [port_var("PORT", SGLANG_PORT,
        f"PORT >= 1024 && PORT <= {top}",
        f"PORT=$PORT: the {servers} SGLang servers of a node take --port PORT to PORT+{last}, each deriving ports up "
        f"to --port+{sglang_span(ranks) - 1} and its gRPC port at --port+{GRPC_DELTA}, which must stay within "
        f"65535; set PORT from 1024 to {top}")]
    if prefill:
        parts.append(port_var("BOOTSTRAP_PORT", BOOTSTRAP_PORT,
            f"BOOTSTRAP_PORT >= 1024 && BOOTSTRAP_PORT + {servers - 1} <= 65535 && (BOOTSTRAP_PORT + {servers} "
            f"<= PORT || BOOTSTRAP_PORT > PORT + {reach})",
            f"BOOTSTRAP_PORT=$BOOTSTRAP_PORT: the {servers} prefill servers' bootstrap ports BOOTSTRAP_PORT to "
            f"BOOTSTRAP_PORT+{servers - 1} must lie outside PORT to PORT+{reach} (PORT=$PORT), the whole span from "
            f"the first server's --port to the last one's gRPC port (conservative: the span holds unused ports); "
            f"set BOOTSTRAP_PORT $FIX", port_advice(servers, "PORT", f"PORT + {reach}")))
    return joined(parts)


VLLM_PORT, NIXL_PORT = 8000, 5600
"""vLLM servers on one node: the default --port of the first (vllm serve's own default), the servers' --port one
apart; and the default VLLM_NIXL_SIDE_CHANNEL_PORT, from which each DP rank of a server on the node takes base +
dp_rank (vllm-project/vllm @026c83f9, docs/features/nixl_connector_usage.md, "Environment Variables": each worker
needs a unique port on its host), so the servers' bases are one server's ranks apart. A server whose DP ranks are
all on its node binds nothing else at a fixed port: its engines' handshake and client sockets are IPC paths
(vllm-project/vllm @0018dd01, vllm/v1/engine/utils.py launch_core_engines: handshake_local_only when
local_engine_count == dp_size, so --data-parallel-rpc-port is not read), so are its DP coordinator's (@0090ad12,
vllm/v1/engine/coordinator.py DPCoordinator: local_only_eng when dp_size == data_parallel_size_local), and its DP
master ports are picked free by
the OS (@00193b82, vllm/config/parallel.py ParallelConfig.__post_init__, get_open_ports_list). Its GPUs are the
ones CUDA_VISIBLE_DEVICES makes visible, DP rank r on visible devices r x (tp x pp) onward (vllm/v1/engine/utils.py
get_physical_gpu_ids_for_local_dp_rank); the documented co-located launch sets CUDA_VISIBLE_DEVICES and --port per
server (vllm-project/vllm @01e4fce0, docs/serving/data_parallel_deployment.md, "External Load Balancing")."""


def vllm_ports(servers: int, slots: int, ranks: int, nixl: bool, rpc: bool = False) -> tuple[str, str]:
    """The port variables of `servers` vLLM API servers on a node and the checks on the user's values: server j's
    --port is PORT + j; (a pool of a disaggregated deployment) the node's NIXL side-channel ports from NIXL_PORT,
    `slots` commands (servers or parts of servers) of `ranks` ports each, a whole server's DP ranks whatever part
    of it runs there, so the width over-allows for a part (VLLM_PORT); (`rpc`: servers that straddle nodes) server
    j's --data-parallel-rpc-port RPC_PORT + j (MASTER_PORT); the ranges must not meet."""
    width = slots * ranks
    parts = [port_var("PORT", VLLM_PORT,
        f"PORT >= 1024 && PORT + {servers - 1} <= 65535",
        f"PORT=$PORT: the {servers} vLLM servers of a node listen on PORT to PORT+{servers - 1}; set PORT from "
        f"1024 to {65535 - servers + 1}")]
    taken, which = [("PORT", f"PORT + {servers - 1}")], f"PORT to PORT+{servers - 1} (PORT=$PORT)"
    if nixl:
        parts.append(port_var("NIXL_PORT", NIXL_PORT,
            f"NIXL_PORT >= 1024 && NIXL_PORT + {width - 1} <= 65535 && {_outside('NIXL_PORT', width, taken)}",
            f"NIXL_PORT=$NIXL_PORT: the NIXL side-channel ports of a node ({slots} vLLM commands x {ranks} DP "
            f"ranks of a server each), NIXL_PORT to NIXL_PORT+{width - 1}, must lie outside the servers' ports "
            f"PORT to PORT+{servers - 1} (PORT=$PORT); "
            "set NIXL_PORT $FIX", port_advice(width, "PORT", f"PORT + {servers - 1}")))
        taken.append(("NIXL_PORT", f"NIXL_PORT + {width - 1}"))
        which += f", NIXL_PORT to NIXL_PORT+{width - 1} (NIXL_PORT=$NIXL_PORT)"
    if rpc:
        parts.append(port_var("RPC_PORT", RPC_PORT,
            f"RPC_PORT >= 1024 && RPC_PORT + {servers - 1} <= 65535 && {_outside('RPC_PORT', servers, taken)}",
            f"RPC_PORT=$RPC_PORT: the DP handshakes of the servers whose head is on a node, RPC_PORT to "
            f"RPC_PORT+{servers - 1}, must lie outside {which}; set RPC_PORT from 1024 to 65535 outside those"))
    return joined(parts)


DIST_PORT, DIST_HANDSHAKE, DIST_FIXED = 20000, 13, 6
"""SGLang's port of a server over nodes, --dist-init-addr HEAD:DIST_PORT (llmplan's default 20000, SGLang's own
examples' port): node 0 binds DIST_PORT itself (the torch.distributed rendezvous, distributed/bootstrap.py) and,
with DP attention, the 6 ports after it (tokenizer, detokenizer, rpc, metrics, scheduler input, load collector:
port_base = DIST_PORT + 1) and on the Rust-server path one scheduler-input port a DP rank from DIST_PORT + 7
(srt/server_args.py PortArgs.init_new), and the DP controller's handshake at DIST_PORT + 13
(DP_ATTENTION_HANDSHAKE_PORT_DELTA, managers/data_parallel_controller.py); --port itself is then its HTTP port
(and the Rust path's listeners from it) and --port + 10000 the legacy gRPC port (SGLANG_PORT). SGLang 0.5.23
PyPI wheel, read."""


def dist_top(ranks: int, dpa: bool) -> int:
    """The last port node 0 of an SGLang server over nodes binds from DIST_PORT, as an offset: with DP attention
    the DP handshake (+ DIST_HANDSHAKE) or the Rust path's last DP-rank port (+ DIST_FIXED + ranks), whichever is
    higher; else DIST_PORT alone (DIST_PORT)."""
    return max(DIST_HANDSHAKE, DIST_FIXED + ranks) if dpa else 0


def _outside(var: str, width: int, ranges: list[tuple[str, str]]) -> str:
    """Shell arithmetic: the ports var .. var + width - 1 meet none of the ranges (lo, hi), each end a shell
    arithmetic expression over the port variables."""
    last = var if width == 1 else f"{var} + {width - 1}"
    return " && ".join(f"({last} < {lo} || {var} > {hi})" for lo, hi in ranges)


def sglang_server_ports(ranks: int, dpa: bool, prefill: bool, dist: bool) -> tuple[str, str]:
    """The port variables of one SGLang server a node (over nodes with `dist`, or one node's replicas) and the
    checks on the user's values: PORT (--port, its gRPC port + 10000 within 65535); over nodes DIST_PORT and the
    ports SGLang derives from it (DIST_PORT) outside PORT's; a prefill server's BOOTSTRAP_PORT outside all."""
    top = dist_top(ranks, dpa)
    http = [("PORT", f"PORT + {ranks - 1}" if ranks > 1 else "PORT"), (f"PORT + {GRPC_DELTA}", f"PORT + {GRPC_DELTA}")]
    parts = [port_var("PORT", SGLANG_PORT,
        f"PORT >= 1024 && PORT <= {65535 - GRPC_DELTA}",
        f"PORT=$PORT: the SGLang server's gRPC port --port+{GRPC_DELTA} must stay within 65535; set PORT from 1024 "
        f"to {65535 - GRPC_DELTA}")]
    taken, which = list(http), f"PORT to PORT+{ranks - 1}, PORT+{GRPC_DELTA}" if ranks > 1 else \
        f"PORT, PORT+{GRPC_DELTA}"
    if dist:
        binds = (f"DIST_PORT to DIST_PORT+{top} (the dist-init port, the ports SGLang derives from it and its DP "
                 f"handshake at +{DIST_HANDSHAKE})" if dpa else "DIST_PORT (the dist-init port)")
        parts.append(port_var("DIST_PORT", DIST_PORT,
            f"DIST_PORT >= 1024 && DIST_PORT + {top} <= 65535 && {_outside('DIST_PORT', top + 1, http)}",
            f"DIST_PORT=$DIST_PORT: node 0 binds {binds}, which must lie outside the server's ports {which} "
            f"(PORT=$PORT); set DIST_PORT $FIX", port_advice(top + 1, "PORT", f"PORT + {GRPC_DELTA}")))
        taken.append(("DIST_PORT", f"DIST_PORT + {top}" if top else "DIST_PORT"))
        which += f", DIST_PORT to DIST_PORT+{top}" if top else ", DIST_PORT"
    if prefill:
        parts.append(port_var("BOOTSTRAP_PORT", BOOTSTRAP_PORT,
            f"BOOTSTRAP_PORT >= 1024 && BOOTSTRAP_PORT <= 65535 && {_outside('BOOTSTRAP_PORT', 1, taken)}",
            f"BOOTSTRAP_PORT=$BOOTSTRAP_PORT: the prefill server's bootstrap port must lie outside its ports {which} "
            f"(PORT=$PORT); set BOOTSTRAP_PORT from 1024, outside those"))
    return joined(parts)


MASTER_PORT, RPC_PORT = 29501, 13345
"""vLLM's ports of a deployment over nodes besides --port (vllm serve's 8000, the constant VLLM_PORT above):
--master-port, the
torch.distributed rendezvous of a DP rank over nodes on node 0 (ParallelConfig.master_port, default 29501), and
--data-parallel-rpc-port, the DP ranks' handshake on the head ("fixed port for data parallel messaging, shared by
all nodes", ParallelConfig.data_parallel_rpc_port; vLLM's default 29550, llmplan writes the documented example's
13345: docs/serving/data_parallel_deployment.md): vllm-project/vllm @00193b82, vllm/config/parallel.py. The DP
master ports are picked free (get_open_ports_list)."""


def vllm_head_ports(var: str, default: int, what: str) -> tuple[str, str]:
    """The port variables of a vLLM deployment over nodes, PORT and `var` (--master-port or
    --data-parallel-rpc-port, both bound on the head), and the checks on the user's values: numbers in range, and
    `var` not PORT."""
    return joined([
        port_var("PORT", VLLM_PORT, "PORT >= 1024 && PORT <= 65535",
                 "PORT=$PORT: the head's API server port is out of range; set PORT from 1024 to 65535"),
        port_var(var, default, f"{var} >= 1024 && {var} <= 65535 && {var} != PORT",
                 f"{var}=${var}: the head binds {what} at {var} and the API server at PORT (PORT=$PORT); set {var} "
                 "from 1024 to 65535, not PORT")])


PORT_ENV = {
    "vllm": "VLLM_PORT: set, vLLM searches each server's free ports (its DP master ports among them) upward from it, "
            "probing by bind and close (vllm-project/vllm @aedcda89, vllm/foundation/utilities/network_utils.py "
            "_get_open_port, get_open_ports_list), so servers started together pick the same ports, and a search can "
            "take a port the script gives a server; unset, the OS picks free ones",
    "sglang": "SGLANG_PORT: set, SGLang searches its free ports upward from it, probing before it binds "
              "(srt/utils/network.py get_open_port; shm_broadcast.py binds in SGLANG_PORT .. + 8), so servers "
              "started together pick the same ports, and a search can take a port the script gives a server; "
              "unset, the OS picks free ones",
}
"""Why the per-node scripts clear the launcher's base-port variable (SGLang 0.5.23 PyPI wheel, srt/environ.py
SGLANG_PORT, read)."""


def clear_port_env(engine: str) -> str:
    """The lines clearing the engine's base-port variable, with why (PORT_ENV)."""
    return f"# unset {PORT_ENV[engine]}\nunset {PORT_ENV[engine].split(':', 1)[0]}\n"


def _clear_env(launch: NodeLaunch, engine: str) -> NodeLaunch:
    """The launch with the engine's base-port variable cleared before its port lines (PORT_ENV)."""
    return replace(launch, ports=clear_port_env(engine) + launch.ports)


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
            "each group of nodes, HEAD_ADDR that group's node 0, and spread requests over the servers "
            f"{ROUTER_HINT}\n")


def _shares(servers: int, per_node: int) -> list[int]:
    """Servers (or DP ranks) on each node, `per_node` on each but the last."""
    return [min(per_node, servers - k) for k in range(0, servers, per_node)]


def _sglang_nodes(pf: PlanFile) -> NodeLaunch | None:
    """SGLang's commands when one command on one node does not run the plan (None: it does). A server over n
    nodes: one command per node with --nnodes / --node-rank / --dist-init-addr; TP replicas that fill several
    nodes: one server per node with that node's --dp-size (each its own DP controller); DP-attention servers
    smaller than a node: one command per server with --base-gpu-id and its own --port."""
    p, per_node = pf.plan, pf.cluster.gpus_per_node_used
    s = p.gpus_per_copy
    if s > per_node:
        return _sglang_server_over_nodes(pf)
    if p.dp_attention and s < per_node and p.copies > 1:
        return _sglang_servers_in_node(pf)
    if not p.dp_attention and p.num_gpus > per_node:
        return _sglang_replicas_over_nodes(pf)
    return None


def _sglang_server_over_nodes(pf: PlanFile) -> NodeLaunch:
    """One SGLang server (a replica or a DP-attention server) over n nodes: one command per node with --nnodes,
    --node-rank and --dist-init-addr, the copies as independent groups of nodes."""
    p, per_node = pf.plan, pf.cluster.gpus_per_node_used
    s, copies = p.gpus_per_copy, p.copies
    n = _span(s, per_node, "sglang", "a DP-attention server" if p.dp_attention else "a replica (tp x pp)")
    prefill = p.phase == "prefill"
    own = ['--dist-init-addr "$HEAD_ADDR:$DIST_PORT"', '--port "$PORT"',
           *(['--disaggregation-bootstrap-port "$BOOTSTRAP_PORT"'] if prefill else [])]
    nodes = [[[f"--nnodes {n}", f"--node-rank {k}", *own]] for k in range(n)]
    note = _head_note(n, per_node, copies) + _groups_note(
        copies, "DP-attention servers" if p.dp_attention else "replicas", s, n)
    ranks = p.attn_dp if p.dp_attention else 1
    ports, checks = sglang_server_ports(ranks, p.dp_attention, prefill, True)
    top = dist_top(ranks, p.dp_attention)
    dist = bound_block("DIST_PORT", f"DIST_PORT + {top}" if top else "DIST_PORT",
                       "node 0's dist-init port" + "s" * (top > 0))
    return NodeLaunch(nodes, note, head=True, ports=ports, drop=("--dp-size",), checks=checks,
                      endpoints=[[('"$PORT"', '"$BOOTSTRAP_PORT"' if prefill else "")]] * copies, per_server=True,
                      binds=(dist,))


def _sglang_servers_in_node(pf: PlanFile) -> NodeLaunch:
    """DP-attention servers smaller than a node: one command per server with --base-gpu-id and its own --port
    (and bootstrap port), the servers of a node at a stride of ports; refuses servers that straddle nodes."""
    p, per_node = pf.plan, pf.cluster.gpus_per_node_used
    s, copies = p.gpus_per_copy, p.copies
    if per_node % s:
        raise refuse("sglang", f"DP-attention servers of {s} GPUs on nodes of {per_node} would straddle nodes",
                     f"re-plan with --ep dividing {per_node}")
    shares = _shares(copies, per_node // s)
    stride, prefill = sglang_stride(shares[0], s, per_node), p.phase == "prefill"
    nodes = [[[f"--base-gpu-id {j * s}", f"--port {port_word('PORT', stride * j)}",
               *([f"--disaggregation-bootstrap-port {port_word('BOOTSTRAP_PORT', j)}"] if prefill else [])]
              for j in range(m)] for m in shares]
    ports, checks = sglang_ports(shares[0], stride, s, prefill)
    boot = ", its KV bootstrap server at BOOTSTRAP_PORT + j (the router needs each one)" if prefill else ""
    ends = [[(port_word("PORT", stride * j), port_word("BOOTSTRAP_PORT", j) if prefill else "")
             for j in range(m)] for m in shares]
    return NodeLaunch(nodes, (f"# {copies} DP-attention servers of {s} GPUs, {per_node // s} on a node: each "
                              "command is one server on GPUs --base-gpu-id onward; server j of a node listens on "
                              f"--port PORT + {stride} j{boot}, its derived ports between; run this script "
                              f"{_on_nodes(len(shares))} and spread requests over the servers {ROUTER_HINT}\n"),
                      ports=ports, checks=checks, endpoints=ends)


def _sglang_replicas_over_nodes(pf: PlanFile) -> NodeLaunch:
    """TP replicas that fill several nodes: one server per node with that node's --dp-size (SGLang runs
    --dp-size over one node only without DP attention); refuses replicas that straddle nodes."""
    p, per_node = pf.plan, pf.cluster.gpus_per_node_used
    s, copies = p.gpus_per_copy, p.copies
    if per_node % s:
        raise refuse("sglang", f"replicas of tp x pp = {s} GPUs on nodes of {per_node} would straddle nodes",
                     f"re-plan with tp x pp dividing {per_node}")
    shares, prefill = _shares(copies, per_node // s), p.phase == "prefill"
    own = ['--port "$PORT"', *(['--disaggregation-bootstrap-port "$BOOTSTRAP_PORT"'] if prefill else [])]
    nodes = [[[*([f"--dp-size {m}"] if m > 1 else []), *own]] for m in shares]
    each = ", its replicas under its own --dp-size (one DP controller each)" if shares[0] > 1 else ""
    ports, checks = sglang_server_ports(1, False, prefill, False)
    return NodeLaunch(nodes, (f"# {copies} replicas over {len(shares)} nodes: one SGLang server a node{each} "
                              "(SGLang runs --dp-size over one node only without DP attention); run this script "
                              f"{_on_nodes(len(shares))} and spread requests over the servers "
                              f"{ROUTER_HINT}\n"), drop=("--dp-size",), ports=ports, checks=checks,
                      endpoints=[[('"$PORT"', '"$BOOTSTRAP_PORT"' if prefill else "")] for _ in shares])


def _vllm_rank_over_nodes(pf: PlanFile, unit: int, ranks: int) -> NodeLaunch:
    """_vllm_nodes for a DP rank of tp x pp = unit GPUs over more than one node: --nnodes / --node-rank /
    --master-addr, --headless but on node 0 (dp 1); refused where several such ranks share experts."""
    p, per_node = pf.plan, pf.cluster.gpus_per_node_used
    n = _span(unit, per_node, "vllm", "a DP rank (tp x pp)")
    if ranks > 1 and (p.ep > 1 or p.dp_attention):
        raise refuse("vllm", f"{ranks} DP ranks sharing their experts, each of tp x pp = {unit} GPUs over {n} "
                     "nodes: vLLM starts a DP rank that spans nodes only with its Ray backend "
                     "(--data-parallel-backend ray, VLLM_RAY_DP_PACK_STRATEGY=span), which llmplan does not write",
                     f"re-plan with tp x pp at most {per_node}, or one replica")
    nodes = [[[f"--nnodes {n}", f"--node-rank {k}", '--master-addr "$HEAD_ADDR"', '--master-port "$MASTER_PORT"',
               *(["--headless"] if k else ['--port "$PORT"'])]] for k in range(n)]
    note = _head_note(n, per_node, p.copies, "the head, which serves the API") + _groups_note(
        p.copies, "DP-attention servers" if p.dp_attention else "replicas", p.gpus_per_copy, n)
    ports, checks = vllm_head_ports("MASTER_PORT", MASTER_PORT, "the workers' torch.distributed rendezvous")
    return NodeLaunch(nodes, note, head=True, drop=("--data-parallel-size",), ports=ports, checks=checks,
                      endpoints=[[('"$PORT"', "")]] * p.copies, per_server=True,
                      binds=(bound_block("MASTER_PORT", "MASTER_PORT", "the head's --master-port"),))


def _vllm_nodes(pf: PlanFile) -> NodeLaunch | None:
    """vLLM's commands when one command on one node does not run the plan's launch (one DP deployment: dp
    replicas, or under DP attention one server's attention ranks; None: it fits a node). A DP rank over n nodes
    (dp 1): --nnodes / --node-rank / --master-addr, --headless but on node 0; DP ranks over several nodes:
    --data-parallel-size-local / --data-parallel-start-rank / --data-parallel-address / --data-parallel-rpc-port,
    --headless but on node 0. Refuses DP ranks whose TP group spans nodes when they share experts."""
    p, per_node = pf.plan, pf.cluster.gpus_per_node_used
    unit, ranks = p.tp * p.pp, p.attn_dp if p.dp_attention else p.dp
    if p.dp_attention and p.copies > 1 and (unit * ranks) % per_node and unit <= per_node:
        return _vllm_servers_on_nodes(pf, unit * ranks, ranks)
    if unit * ranks <= per_node:
        return None
    if unit > per_node:
        return _vllm_rank_over_nodes(pf, unit, ranks)
    if per_node % unit:
        raise refuse("vllm", f"DP ranks of tp x pp = {unit} GPUs on nodes of {per_node} would straddle nodes",
                     f"re-plan with tp x pp dividing {per_node}")
    local = per_node // unit
    shares = _shares(ranks, local)
    common = ['--data-parallel-address "$HEAD_ADDR"', '--data-parallel-rpc-port "$RPC_PORT"']
    nodes = [[[f"--data-parallel-size-local {m}", *([f"--data-parallel-start-rank {k * local}", "--headless"]
                                                    if k else ['--port "$PORT"']), *common]]
             for k, m in enumerate(shares)]
    n, whose = len(shares), "HEAD_ADDR the same on all" if p.copies == 1 else "HEAD_ADDR that server's node 0 on all"
    note = (f"# {ranks} DP ranks of {unit} GPU{'s' * (unit > 1)} over {n} nodes, one endpoint: run this script on each "
            f"node with NODE_RANK 0 (the head, which serves the API) to {n - 1}, {whose}\n")
    ports, checks = vllm_head_ports("RPC_PORT", RPC_PORT, "the DP ranks' handshake")
    return NodeLaunch(nodes, note + _groups_note(p.copies, "DP-attention servers", unit * ranks, n), head=True,
                      ports=ports, checks=checks, endpoints=[[('"$PORT"', "")]] * p.copies, per_server=True,
                      binds=(bound_block("RPC_PORT", "RPC_PORT", "the head's --data-parallel-rpc-port"),))


def sglang_nodes(pf: PlanFile) -> NodeLaunch | None:
    """SGLang's per-node commands (_sglang_nodes), SGLANG_PORT cleared (PORT_ENV); None where one command runs."""
    launch = _sglang_nodes(pf)
    return None if launch is None else _clear_env(launch, "sglang")


def vllm_nodes(pf: PlanFile) -> NodeLaunch | None:
    """vLLM's per-node commands (_vllm_nodes), VLLM_PORT cleared (PORT_ENV), a pool's NIXL side-channel host set
    (NIXL_HOST); None where one command runs."""
    launch = _vllm_nodes(pf)
    return None if launch is None else replace(_clear_env(launch, "vllm"), nixl_host=pf.plan.phase != "both")


@dataclass(frozen=True)
class Piece:
    """The part of one DP-attention server on one node, its servers placed on consecutive GPUs
    (topology.placement): the server's index, its first GPU on the node, its GPUs there, and how many of its GPUs
    lie on earlier nodes (0: this node holds its head)."""
    server: int
    gpu: int
    gpus: int
    before: int


def pieces(servers: int, s: int, per_node: int) -> list[list[Piece]]:
    """The pieces of `servers` servers of s GPUs on each node of per_node GPUs, in GPU order."""
    out = []
    for k in range(-(-servers * s // per_node)):
        lo, hi = k * per_node, (k + 1) * per_node
        out.append([Piece(i, max(i * s, lo) - lo, min((i + 1) * s, hi) - max(i * s, lo), max(i * s, lo) - i * s)
                    for i in range(servers) if i * s < hi and (i + 1) * s > lo])
    return out


def _heads(layout: list[list[Piece]]) -> dict[int, tuple[int, int]]:
    """Each server's head: its node and its index j among the heads on that node (its --port PORT + j)."""
    return {pc.server: (k, j) for k, node in enumerate(layout)
            for j, pc in enumerate([x for x in node if x.before == 0])}


def _piece_flags(pc: Piece, heads: dict[int, tuple[int, int]], s: int, unit: int) -> list[str]:
    """A piece's own flags: a whole server its --port; a part of a server that straddles nodes its DP ranks on
    the node, its head's address and --data-parallel-rpc-port, and past the head its first DP rank and
    --headless (vLLM's documented multi-node DP launch, module docstring)."""
    k, j = heads[pc.server]
    if pc.gpus == s:
        return [f"--port {port_word('PORT', j)}"]
    own = ([f"--data-parallel-start-rank {pc.before // unit}", "--headless"] if pc.before else
           [f"--port {port_word('PORT', j)}"])
    return [f"--data-parallel-size-local {pc.gpus // unit}", *own, f'--data-parallel-address "${{ADDR[{k}]}}"',
            f"--data-parallel-rpc-port {port_word('RPC_PORT', j)}"]


def _pieces_note(pf: PlanFile, s: int, ranks: int, layout: list[list[Piece]], split: bool) -> str:
    """The note of servers placed piece by piece (_vllm_servers_on_nodes)."""
    p, per_node = pf.plan, pf.cluster.gpus_per_node_used
    side = f", its DP ranks' NIXL side-channel ports from NIXL_PORT + {ranks} j" if p.phase != "both" else ""
    where = f"{per_node // s} on a node" if not split else f"on consecutive GPUs of nodes of {per_node}, as priced"
    text = (f"# {p.copies} DP-attention servers of {s} GPUs, {where}: each command is one server on the GPUs its "
            f"CUDA_VISIBLE_DEVICES names; server j of a node listens on --port PORT + j{side}; run this script "
            f"{_on_nodes(len(layout))} and spread requests over the servers {ROUTER_HINT}\n")
    if split:
        text += ("# a server that straddles nodes runs one command on each of its nodes: its DP ranks there "
                 "(--data-parallel-size-local), its head's address from NODE_ADDRS and DP handshake port RPC_PORT + j "
                 "(j its index on its head's node), and past its head --data-parallel-start-rank and --headless\n")
    return text


def _vllm_servers_on_nodes(pf: PlanFile, s: int, ranks: int) -> NodeLaunch:
    """DP-attention servers of s GPUs (`ranks` DP ranks each) on consecutive GPUs (topology.placement), not whole
    nodes: one `vllm serve` a server on a node, or a server's part where it straddles nodes (_piece_flags), on its
    GPUs (CUDA_VISIBLE_DEVICES, a slice of the caller's list), at its own --port and, in a pool of a disaggregated
    deployment, its own NIXL side-channel ports (VLLM_PORT); refuses DP ranks whose TP group would span nodes."""
    p, per_node = pf.plan, pf.cluster.gpus_per_node_used
    unit = s // ranks
    if per_node % unit:
        raise refuse("vllm", f"DP ranks of tp x pp = {unit} GPUs on nodes of {per_node} would straddle nodes (a TP "
                     "group over nodes runs only through vLLM's Ray DP backend, which llmplan does not write)",
                     f"re-plan with tp x pp dividing {per_node}")
    layout, nixl = pieces(p.copies, s, per_node), p.phase != "both"
    heads, split = _heads(layout), any(pc.gpus < s for node in layout for pc in node)
    env = [[f"CUDA_VISIBLE_DEVICES={visible_slice(pc.gpu, pc.gpus)}"
            + (f" VLLM_NIXL_SIDE_CHANNEL_PORT={port_word('NIXL_PORT', ranks * q)}" if nixl else "")
            for q, pc in enumerate(node)] for node in layout]
    nodes = [[_piece_flags(pc, heads, s, unit) for pc in node] for node in layout]
    ends = [[(port_word("PORT", j), "") for j in range(sum(pc.before == 0 for pc in node))] for node in layout]
    servers, slots = max(len(e) for e in ends), max(len(node) for node in layout)
    ports, checks = vllm_ports(servers, slots, ranks, nixl, split)
    binds = (([bound_block("NIXL_PORT", f"NIXL_PORT + {slots * ranks - 1}", "the NIXL side-channel ports")]
              if nixl else [])
             + ([bound_block("RPC_PORT", f"RPC_PORT + {servers - 1}" if servers > 1 else "RPC_PORT",
                             "the DP handshake port" + "s" * (servers > 1))] if split else []))
    return NodeLaunch(nodes, _pieces_note(pf, s, ranks, layout, split), ports=ports, env=env, checks=checks,
                      endpoints=ends, visible=per_node, addrs=len(layout) if split else 0, binds=tuple(binds))


def _addrs_lines(n: int) -> str:
    """The lines reading the n nodes' addresses (NODE_ADDRS) into ADDR; none where n is 0."""
    if not n:
        return ""
    return (f"# FILL IN NODE_ADDRS: the addresses of the {n} nodes in NODE_RANK order, reachable from each other, "
            "the same on every node (a server that straddles nodes joins its head's)\n"
            f"NODE_ADDRS=${{NODE_ADDRS:?FILL IN the addresses of the {n} nodes, see above}}\n"
            "set -f\nADDR=($NODE_ADDRS)\nset +f\n"
            + count_check(n, f"give those of the {n} nodes"))


def _nixl_host_lines(n: int, addrs: int) -> str:
    """The lines exporting the node's NIXL side-channel host from NODE_ADDR (NIXL_HOST): required over several
    nodes, localhost by default on one; where the script reads the `addrs` nodes' addresses (NODE_ADDRS, into
    ADDR), NODE_ADDR defaults to the NODE_RANK-th of them."""
    value = ("${NODE_ADDR:?FILL IN the address of this node, reachable from the nodes of the other pool}"
             if n > 1 else "${NODE_ADDR:-localhost}")  # no apostrophe: it would open a quote inside ${...}
    text = f"# NODE_ADDR: {NIXL_HOST}" + ("" if n > 1 else "; set it when the other pool runs on another machine")
    if addrs:  # NODE_RANK is checked by the case below; only a plain rank in range picks an address here
        text += (f"; unset, the NODE_RANK-th address of NODE_ADDRS\nif [[ -z \"${{NODE_ADDR:-}}\" && \"$NODE_RANK\" =~ "
                 f"^(0|[1-9][0-9]*)$ ]] && (( NODE_RANK < {addrs} )); then NODE_ADDR=\"${{ADDR[NODE_RANK]}}\"; fi")
    return text + f"\nNODE_ADDR={value}\nexport VLLM_NIXL_SIDE_CHANNEL_HOST=\"$NODE_ADDR\"\n"


def node_script(launch: NodeLaunch, command: str, flags: list[str]) -> str:
    """The shell text that runs `command` with the common `flags` (less launch.drop) and each node's own: the
    head address placeholder and the port lines where the commands need them, NODE_RANK, one case per node; several
    servers on a node run in the background, and the first that exits non-zero ends the script (bash wait -n); a
    server's environment assignments (launch.env) stand on the line above its command, continued to it."""
    kept = [f for f in flags if f.split(" ", 1)[0] not in launch.drop]
    n = len(launch.nodes)
    text = (HEAD_LINE if launch.head else "") + _addrs_lines(launch.addrs) + launch.ports + launch.checks
    text += launch.guard
    text += visible_lines(launch.visible) if launch.visible else ""
    text += ("NODE_RANK=${NODE_RANK:-0}\n" if n == 1 else
             f"NODE_RANK=${{NODE_RANK:?set NODE_RANK to the rank of this node, 0 to {n - 1}}}\n")
    text += _nixl_host_lines(n, launch.addrs) if launch.nixl_host else ""
    text += "ARGS=(\n" + "".join(f"    {f}\n" for f in kept) + ")\n"
    text += 'case "$NODE_RANK" in\n'
    for k, servers in enumerate(launch.nodes):
        many = len(servers) > 1
        text += f"    {k})\n"
        for j, extra in enumerate(servers):
            env = [launch.env[k][j]] if launch.env and launch.env[k][j] else []
            words = [*env, f'{command} "${{ARGS[@]}}"', *extra]
            text += " \\\n".join(f"        {w}" if i == 0 else f"            {w}" for i, w in enumerate(words))
            text += (" &" if many else "") + "\n"
        if many:  # the first server to fail stops the others and the script with its status (plain wait: 0)
            text += (f"        for _ in {' '.join(str(i + 1) for i in range(len(servers)))}; do\n"
                     '            wait -n || { s=$?; kill $(jobs -p) 2>/dev/null || true; exit "$s"; }\n'
                     "        done\n")
        text += "        ;;\n"
    return text + f'    *) echo "NODE_RANK must be 0 to {n - 1}" >&2; exit 2 ;;\nesac\n'
