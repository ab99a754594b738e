"""The serving scripts' review fixes (export.serve_nodes, export.serve_shell, export.serve_router): vLLM
DP-attention servers that straddle nodes exported as priced, port values read as decimal port numbers only, the
caller's CUDA_VISIBLE_DEVICES honoured, the NIXL side-channel host, the base-port variables cleared in one-command
scripts, and the notes naming the router script.

Each test exports saved plans with the real CLI and runs the exported scripts with stand-ins for `vllm` and
`python` that record their arguments and environment; vLLM's commands are parsed with its recorded parser
(tests/data/launchers/vllm.json, vLLM 0.33.0's make_arg_parser, which defines --data-parallel-size-local,
--data-parallel-start-rank, --data-parallel-address, --data-parallel-rpc-port and --headless). Launcher facts the
tests check, from the launchers' sources:
- vLLM's multi-node DP launch: each node runs its DP ranks with --data-parallel-size-local, the nodes past the
  head with --data-parallel-start-rank and --headless, all with the head's --data-parallel-address and
  --data-parallel-rpc-port (vllm-project/vllm @01e4fce0, docs/serving/data_parallel_deployment.md, "Internal Load
  Balancing"); DP rank r of a command on its visible devices r x (tp x pp) onward.
- NixlConnector: each DP rank's side channel at VLLM_NIXL_SIDE_CHANNEL_PORT + dp_rank on its host, its host
  VLLM_NIXL_SIDE_CHANNEL_HOST (default localhost; set when prefill and decode run on different machines):
  @026c83f9, docs/features/nixl_connector_usage.md, "Environment Variables".
- bash reads 020300 in arithmetic as octal (8384) and refuses 08000 (bash manual, 6.5 Shell Arithmetic)."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
from serve_scripts import H100, export_serving as _export, run_with_stand_ins

from tests.test_export import recorded_parser

DPA = ("--model", "qwen3-30b-a3b", "--dp-attention", "--moe-dispatcher", "deepep")
STRADDLE = (*DPA, "--nodes", "3", "--dp", "24", "--ep", "6", "--redundant-experts", "16")
STAND_IN = r'''#!/bin/bash
f=$(mktemp "$RECORDS/run.XXXXXX")
printf '%s\0' "${CUDA_VISIBLE_DEVICES-unset}" "${VLLM_NIXL_SIDE_CHANNEL_PORT-unset}" \
    "${VLLM_NIXL_SIDE_CHANNEL_HOST-unset}" "${VLLM_PORT-unset}" "${SGLANG_PORT-unset}" "$@" > "$f"
'''
ENV = 5  # recorded environment values before argv
ADDRS = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def _run(script: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """Run `script` with the stand-ins on PATH; the recorded launches as [CUDA_VISIBLE_DEVICES, NIXL port, NIXL
    host, VLLM_PORT, SGLANG_PORT, argv...]."""
    r, records = run_with_stand_ins(script, tmp_path, STAND_IN, {"MODEL": "m", **env})
    return r, [f.read_bytes().decode().split("\0")[:-1] for f in records.iterdir()]


def _vllm(argv: list[str]) -> argparse.Namespace:
    ap, rec = recorded_parser("vllm")
    ap.add_argument("model_tag")
    assert argv[0] == "serve"
    ns, unknown = ap.parse_known_args(argv[1:])
    assert not unknown, f"vLLM {rec['version']} does not define {unknown}"
    return ns


@pytest.mark.parametrize("ep,straddling", [(6, [1, 2]), (12, [0, 1])])
def test_sglang_refuses_the_straddling_plan_and_vllm_exports_it_as_placed(cli, tmp_path: Path, ep, straddling):
    """Servers of 6 GPUs on nodes of 8 (128 experts + 16 redundant over ep 6): server 1 takes GPUs 6-7 of node 0
    and 0-3 of node 1, server 2 GPUs 4-7 of node 1 and 0-1 of node 2. check_plan refuses it under SGLang and
    sends the user to vLLM, which takes uneven ranks per node. Before: `export --to vllm` of the accepted vLLM plan
    exited 2 with "re-plan with --ep dividing 8". Servers of 12: node 1 holds half of each; before, the export
    wrote one server over 2 nodes to start "on each group of nodes" (4 nodes, not the plan's 3)."""
    args = (*DPA, "--nodes", "3", "--dp", "24", "--ep", str(ep), "--redundant-experts", "16")
    r = cli("estimate", "--mode", "infer", *H100, *args, "--engine", "sglang")
    assert r.code == 2 and "--engine vllm, which takes uneven ranks per node" in r.err
    out = _export(cli, tmp_path, f"ep{ep}", "vllm", *args, "--phase", "decode")
    pieces = []  # (node, global GPUs, namespace, NIXL base)
    for k, addr in enumerate(ADDRS):
        r, runs = _run(out / "vllm_serve.sh", tmp_path, NODE_RANK=str(k), NODE_ADDRS=" ".join(ADDRS), NODE_ADDR=addr)
        assert r.returncode == 0, r.stderr
        assert {run[2] for run in runs} == {addr}  # the NIXL side channel listens on the node's address
        node_gpus = [int(g) for run in runs for g in run[0].split(",")]
        assert sorted(node_gpus) == list(range(8))  # every GPU of the node, once
        for run in runs:
            pieces.append((k, [8 * k + int(g) for g in run[0].split(",")], _vllm(run[ENV:]), int(run[1])))
    head: dict[int, tuple[str, int]] = {}  # a straddling server: its head's address and handshake port
    parts: dict[int, list[tuple[int, int, tuple[str, int]]]] = {}  # its (start rank, ranks, head named)
    for k, gpus, ns, _ in pieces:
        dp, local = int(ns.data_parallel_size), int(ns.data_parallel_size_local or ns.data_parallel_size)
        start = int(ns.data_parallel_start_rank or 0)
        assert dp == ep and len(gpus) == local and gpus == list(range(gpus[0], gpus[0] + local))
        server = (gpus[0] - start) // ep  # DP rank r of server i on global GPU ep i + r (tp 1)
        assert gpus[0] - start == ep * server and bool(ns.headless) == (start > 0)
        if local < dp:
            key = (ns.data_parallel_address, int(ns.data_parallel_rpc_port))
            if start == 0:
                assert ns.data_parallel_address == ADDRS[k]
                head[server] = key
            parts.setdefault(server, []).append((start, local, key))
    assert sorted(head) == sorted(parts) == straddling
    for server, got in parts.items():
        assert sum(m for _, m, _ in got) == ep and {key for *_, key in got} == {head[server]}
    for k in range(3):  # per node: API ports, handshake ports and NIXL ranges disjoint
        taken: list[int] = []
        for node, gpus, ns, nixl in pieces:
            if node != k:
                continue
            taken += range(nixl, nixl + ep)  # base + dp_rank, global or local: within one server's ranks
            if not ns.headless:
                taken.append(int(ns.port))
                if ns.data_parallel_rpc_port:
                    taken.append(int(ns.data_parallel_rpc_port))
        assert len(taken) == len(set(taken)), sorted(taken)
    text = (out / "vllm_serve.sh").read_text()
    assert "(vllm_router.sh, written beside this script)" in text and "e.g. a router" not in text


def test_the_straddling_plans_proxy_names_the_four_servers_heads(cli, tmp_path: Path):
    out = _export(cli, tmp_path, "ep6", "vllm", *STRADDLE, "--phase", "decode")
    r, runs = _run(out / "vllm_router.sh", tmp_path, NODE_ADDRS=" ".join(ADDRS), OTHER_POOL="--prefiller-hosts h "
                   "--prefiller-ports 1", VLLM_SRC="/src")
    assert r.returncode == 0, r.stderr
    argv = runs[0][ENV:]
    hosts = argv[argv.index("--decoder-hosts") + 1:argv.index("--decoder-ports")]
    ports = argv[argv.index("--decoder-ports") + 1:argv.index("--prefiller-hosts")]
    # heads: servers 0 and 1 on node 0 (--port 8000, 8001), server 2 on node 1, server 3 on node 2
    assert list(zip(hosts, ports)) == [("10.0.0.1", "8000"), ("10.0.0.1", "8001"), ("10.0.0.2", "8000"),
                                       ("10.0.0.3", "8000")]


def test_the_straddling_script_needs_every_nodes_address(cli, tmp_path: Path):
    out = _export(cli, tmp_path, "ep6", "vllm", *STRADDLE)
    r, runs = _run(out / "vllm_serve.sh", tmp_path, NODE_RANK="1", NODE_ADDRS="10.0.0.1 10.0.0.2")
    assert r.returncode == 2 and runs == [] and len(r.stderr.splitlines()) == 1, r.stderr
    assert "NODE_ADDRS names 2 addresses; give those of the 3 nodes" in r.stderr


VARS = [  # every port variable a script checks, with an export that reads it (target, plan args, script)
    ("PORT", "sglang", (*DPA, "--nodes", "1", "--dp", "8", "--ep", "2", "--phase", "prefill"), "serve"),
    ("BOOTSTRAP_PORT", "sglang", (*DPA, "--nodes", "1", "--dp", "8", "--ep", "2", "--phase", "prefill"), "serve"),
    ("NIXL_PORT", "vllm", (*DPA, "--nodes", "1", "--dp", "8", "--ep", "2", "--phase", "decode"), "serve"),
    ("DIST_PORT", "sglang", ("--model", "llama-3.1-70b", "--nodes", "2", "--tp", "8", "--pp", "2"), "serve"),
    ("MASTER_PORT", "vllm", ("--model", "llama-3.1-70b", "--nodes", "2", "--tp", "8", "--pp", "2"), "serve"),
    ("RPC_PORT", "vllm", STRADDLE, "serve"),
    ("ROUTER_PORT", "sglang", (*DPA, "--nodes", "1", "--dp", "8", "--ep", "4"), "router"),
]


@pytest.mark.parametrize("value", ["020300", "08000", "1" * 25])
@pytest.mark.parametrize("var,target,args,script", VARS, ids=[v[0] for v in VARS])
def test_a_zero_padded_or_overlong_port_stops_the_script_with_one_line(cli, tmp_path: Path, var, target, args,
                                                                       script, value):
    """Before: 020300 passed the ^[0-9]+$ check and bash's arithmetic read it as octal 8384 (PORT=020300 with
    BOOTSTRAP_PORT=5000 ran with colliding ports), 08000 printed bash's error and the script's, and a 25-digit
    value wrapped in bash's 64-bit arithmetic."""
    out = _export(cli, tmp_path, "m", target, *args)
    env = {"NODE_RANK": "0", "HEAD_ADDR": "10.0.0.1", "NODE_ADDR": "10.0.0.1", "NODE_ADDRS": " ".join(ADDRS),
           "BOOTSTRAP_PORT": "5000", var: value}
    if script == "router":
        env["NODE_ADDRS"] = "10.0.0.1"
    r, runs = _run(out / f"{target}_{script}.sh", tmp_path, **env)
    assert r.returncode == 2 and runs == [], (r.returncode, r.stderr)
    assert r.stderr.splitlines() == [f"{var}={value} is not a port number (1 to 5 digits, no leading 0)"]


@pytest.mark.parametrize("env,says,not_says", [
    # PORT 1024: nothing fits below it; the 4 bootstrap ports fit above PORT + 13000 only
    ({"PORT": "1024", "BOOTSTRAP_PORT": "2000"}, "set BOOTSTRAP_PORT from 14025 to 65532", "from 1024 to"),
    # PORT 52535: the span reaches 65535, nothing fits above it
    ({"PORT": "52535", "BOOTSTRAP_PORT": "60000"}, "set BOOTSTRAP_PORT from 1024 to 52531", " or "),
])
def test_the_suggested_bootstrap_range_names_only_the_sides_that_exist(cli, tmp_path: Path, env, says, not_says):
    """Before: PORT=1024 printed "set BOOTSTRAP_PORT from 1024 to 1020 or above 14024", and the range above could
    pass 65535."""
    out = _export(cli, tmp_path, "pre", "sglang", *DPA, "--nodes", "1", "--dp", "8", "--ep", "2", "--phase",
                  "prefill")
    r, runs = _run(out / "sglang_serve.sh", tmp_path, NODE_RANK="0", **env)
    assert r.returncode == 2 and runs == [] and len(r.stderr.splitlines()) == 1, r.stderr
    assert says in r.stderr and not_says not in r.stderr.split("; set ")[-1], r.stderr
    assert "conservative" in r.stderr


@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_each_server_takes_its_gpus_from_the_callers_list(cli, tmp_path: Path, target):
    """A node of 4 GPUs used, 2 servers of 2: under a caller's CUDA_VISIBLE_DEVICES=4,5,6,7 (Slurm, a shared node)
    vLLM's servers get 4,5 and 6,7, as SGLang's --base-gpu-id 0 and 2 count within the caller's list. Before: vLLM
    wrote CUDA_VISIBLE_DEVICES=0,1 and 2,3, outside the allocation."""
    out = _export(cli, tmp_path, "g4", target, *DPA, "--nodes", "1", "--gpus-per-node", "4", "--dp", "4", "--ep", "2")
    r, runs = _run(out / f"{target}_serve.sh", tmp_path, CUDA_VISIBLE_DEVICES="4,5,6,7")
    assert r.returncode == 0 and len(runs) == 2, r.stderr
    if target == "vllm":
        assert sorted(run[0] for run in runs) == ["4,5", "6,7"]
    else:  # SGLang inherits the caller's list and counts --base-gpu-id within it
        assert {run[0] for run in runs} == {"4,5,6,7"}
        base = sorted(int(run[run.index("--base-gpu-id") + 1]) for run in runs)
        assert [[4, 5, 6, 7][b:b + 2] for b in base] == [[4, 5], [6, 7]]
    if target == "vllm":
        r, runs = _run(out / "vllm_serve.sh", tmp_path, CUDA_VISIBLE_DEVICES="4,5")
        assert r.returncode == 2 and runs == [] and r.stderr.splitlines() == [
            "CUDA_VISIBLE_DEVICES=4,5 names 2 GPUs; the plan places 4 on each node"]


def test_a_vllm_pool_over_nodes_needs_the_nodes_nixl_host(cli, tmp_path: Path):
    """Prefill servers on 2 nodes: NIXL's side channel must listen on each node's reachable address, not vLLM's
    default localhost; on one node it stays localhost unless NODE_ADDR is given."""
    out = _export(cli, tmp_path, "pre", "vllm", *DPA, "--nodes", "2", "--dp", "16", "--ep", "2", "--phase", "prefill")
    r, runs = _run(out / "vllm_serve.sh", tmp_path, NODE_RANK="1")
    assert r.returncode != 0 and runs == [] and "FILL IN the address of this node" in r.stderr, r.stderr
    r, runs = _run(out / "vllm_serve.sh", tmp_path, NODE_RANK="1", NODE_ADDR="10.0.0.7")
    assert r.returncode == 0 and {run[2] for run in runs} == {"10.0.0.7"}, r.stderr
    one = _export(cli, tmp_path, "one", "vllm", *DPA, "--nodes", "1", "--dp", "8", "--ep", "2", "--phase", "decode")
    r, runs = _run(one / "vllm_serve.sh", tmp_path)
    assert r.returncode == 0 and {run[2] for run in runs} == {"localhost"}, r.stderr


@pytest.mark.parametrize("target,var", [("vllm", "VLLM_PORT"), ("sglang", "SGLANG_PORT")])
def test_one_command_scripts_clear_the_launchers_base_port_variable(cli, tmp_path: Path, target, var):
    out = _export(cli, tmp_path, "one", target, "--model", "llama-3.1-8b", "--nodes", "1", "--tp", "1")
    r, runs = _run(out / f"{target}_serve.sh", tmp_path, **{var: "8001"})
    assert r.returncode == 0 and len(runs) == 1, r.stderr
    assert runs[0][3] == runs[0][4] == "unset"


def test_a_pool_scripts_notes_name_its_router_script(cli, tmp_path: Path):
    out = _export(cli, tmp_path, "one", "sglang", "--model", "llama-3.1-8b", "--nodes", "1", "--tp", "1",
                  "--phase", "prefill")
    assert "# requests: through sglang_router.sh, written beside this script" in (out / "sglang_serve.sh").read_text()
    co = _export(cli, tmp_path, "co", "vllm", *DPA, "--nodes", "1", "--dp", "8", "--ep", "4")
    assert not (co / "vllm_router.sh").exists() and "(e.g. a router)" in (co / "vllm_serve.sh").read_text()


def test_the_nixl_port_check_says_what_its_width_counts(cli, tmp_path: Path):
    """Servers of 12 GPUs on nodes of 8: node 1 runs two commands (a part of each server), each of a server's 12
    DP ranks' NIXL ports, so the check covers 2 x 12 = 24 ports on a node of 8 GPUs. Before, the message called
    them "the 24 DP ranks of a node"."""
    args = (*DPA, "--nodes", "3", "--dp", "24", "--ep", "12", "--redundant-experts", "16", "--phase", "decode")
    out = _export(cli, tmp_path, "ep12", "vllm", *args)
    r, runs = _run(out / "vllm_serve.sh", tmp_path, NODE_RANK="1", NODE_ADDRS=" ".join(ADDRS), NIXL_PORT="7990")
    assert r.returncode == 2 and runs == [] and len(r.stderr.splitlines()) == 1, r.stderr
    assert "(2 vLLM commands x 12 DP ranks of a server each), NIXL_PORT to NIXL_PORT+23" in r.stderr
    assert "DP ranks of a node" not in r.stderr


def test_a_straddling_pool_takes_the_nodes_nixl_host_from_node_addrs(cli, tmp_path: Path):
    """A straddling decode pool reads every node's address (NODE_ADDRS): NODE_ADDR defaults to the NODE_RANK-th
    of them (before: the script stopped asking for NODE_ADDR as well); a NODE_ADDR given wins; with neither the
    script stops on the missing addresses."""
    out = _export(cli, tmp_path, "ep6", "vllm", *STRADDLE, "--phase", "decode")
    for k, addr in enumerate(ADDRS):
        r, runs = _run(out / "vllm_serve.sh", tmp_path, NODE_RANK=str(k), NODE_ADDRS=" ".join(ADDRS))
        assert r.returncode == 0 and runs and {run[2] for run in runs} == {addr}, r.stderr
    r, runs = _run(out / "vllm_serve.sh", tmp_path, NODE_RANK="2", NODE_ADDRS=" ".join(ADDRS), NODE_ADDR="10.9.9.9")
    assert r.returncode == 0 and {run[2] for run in runs} == {"10.9.9.9"}, r.stderr
    r, runs = _run(out / "vllm_serve.sh", tmp_path, NODE_RANK="1")
    assert r.returncode != 0 and runs == [] and "FILL IN the addresses of the 3 nodes" in r.stderr, r.stderr
    r, runs = _run(out / "vllm_serve.sh", tmp_path, NODE_RANK="7", NODE_ADDRS=" ".join(ADDRS))
    assert r.returncode != 0 and runs == [], r.stderr
