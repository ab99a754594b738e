"""The message text of four checks in the generated serving scripts (export.serve_router, export.serve_nodes): the
router's count of NODE_ADDRS, the per-node vLLM servers' RPC_PORT block against their --port block, a single SGLang
server's PORT below its gRPC port's limit, and the head's PORT of a vLLM deployment over nodes.

Each test exports a saved plan with the real CLI and runs the exported script with stand-ins for `vllm` and `python`
that record that they ran, with the offending variable set; it checks exit status 2, nothing launched, one line on
stderr, and the line's words: what the value is for, the value, the rule or range, the fix. The limits are written
here from the launchers' sources, not from llmplan:
- SGLang serves a legacy gRPC port at --port + 10000 (SGLang 0.5.23 PyPI wheel, srt/server_args.py), so --port is
  at most 65535 - 10000 = 55535.
- vLLM's --data-parallel-rpc-port is the head's DP handshake (vllm-project/vllm @00193b82, vllm/config/parallel.py
  ParallelConfig.data_parallel_rpc_port); a port is 1 to 65535, llmplan's scripts ask for 1024 onward (unprivileged).
- Two DP-attention servers of 6 GPUs (qwen3-30b-a3b, dp 24, ep 6) on 8-GPU nodes: server 0 on GPUs 0-5 and server
  1 from GPU 6, so node 0 holds the heads of 2 servers, at --port PORT and PORT + 1, with handshakes at RPC_PORT
  and RPC_PORT + 1."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from serve_scripts import export_serving, run_with_stand_ins

DPA = ("--model", "qwen3-30b-a3b", "--dp-attention", "--moe-dispatcher", "deepep")
STAND_IN = '#!/bin/bash\nmktemp "$RECORDS/run.XXXXXX" > /dev/null\n'


def _export(cli, tmp_path: Path, target: str, *args: str) -> Path:
    return export_serving(cli, tmp_path, "out", target, *args)


def _run(script: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, int]:
    """Run `script` with the stand-ins on PATH; its result and how many launcher commands it started."""
    r, records = run_with_stand_ins(script, tmp_path, STAND_IN, {"HEAD_ADDR": "10.0.0.1", "NODE_ADDR": "10.0.0.9",
                                                              "NODE_RANK": "0", "MODEL": "m", **env})
    return r, len(list(records.iterdir()))


def _refused(r: subprocess.CompletedProcess, launched: int) -> str:
    assert r.returncode == 2 and launched == 0, (r.returncode, r.stderr)
    assert len(r.stderr.splitlines()) == 1, r.stderr
    return r.stderr.strip()


def test_the_router_names_the_count_of_addresses_it_needs(cli, tmp_path: Path):
    """SGLang DP-attention servers co-located on 2 nodes: the router needs one address a node."""
    out = _export(cli, tmp_path, "sglang", *DPA, "--nodes", "2", "--dp", "16", "--ep", "4")
    r, launched = _run(out / "sglang_router.sh", tmp_path, NODE_ADDRS="10.0.1.1 10.0.1.2")
    assert r.returncode == 0 and launched == 1, r.stderr
    line = _refused(*_run(out / "sglang_router.sh", tmp_path, NODE_ADDRS="10.0.1.1 10.0.1.2 10.0.1.3"))
    assert line.startswith("NODE_ADDRS names 3 addresses"), line  # what, and the value (its count)
    assert "give the 2 addresses of each node the serve script runs on, in NODE_RANK order" in line, line  # rule, fix


@pytest.mark.parametrize("rpc,ok", [(7998, True), (7999, False), (8000, False), (8001, False), (8002, True)])
def test_vllm_rpc_ports_of_a_nodes_servers_must_clear_their_api_ports(cli, tmp_path: Path, rpc, ok):
    """Node 0 heads 2 servers (docstring): --port 8000 and 8001, handshakes RPC_PORT and RPC_PORT + 1."""
    assert ok == (not {rpc, rpc + 1} & {8000, 8001})  # the expectation agrees with the rule written above
    out = _export(cli, tmp_path, "vllm", *DPA, "--nodes", "3", "--dp", "24", "--ep", "6", "--redundant-experts", "16")
    r, launched = _run(out / "vllm_serve.sh", tmp_path, NODE_ADDRS="10.0.0.1 10.0.0.2 10.0.0.3", RPC_PORT=str(rpc))
    if ok:
        assert r.returncode == 0 and launched == 2, r.stderr
        return
    line = _refused(r, launched)
    assert line.startswith(f"RPC_PORT={rpc}: the DP handshakes of the servers whose head is on a node"), line
    assert "RPC_PORT to RPC_PORT+1, must lie outside PORT to PORT+1 (PORT=8000)" in line, line  # the rule
    assert line.endswith("set RPC_PORT from 1024 to 65535 outside those"), line  # the fix


@pytest.mark.parametrize("args", [
    ("--model", "llama-3.1-8b", "--nodes", "2", "--tp", "4", "--dp", "4"),  # one server a node, its replicas
    ("--model", "llama-3.1-70b", "--nodes", "2", "--tp", "8", "--pp", "2"),  # one server over 2 nodes
])
@pytest.mark.parametrize("port,ok", [(55535, True), (55536, False), (65535, False)])
def test_a_single_sglang_servers_port_leaves_room_for_its_grpc_port(cli, tmp_path: Path, args, port, ok):
    out = _export(cli, tmp_path, "sglang", *args)
    r, launched = _run(out / "sglang_serve.sh", tmp_path, PORT=str(port))
    if ok:
        assert r.returncode == 0 and launched == 1, r.stderr
        return
    line = _refused(r, launched)
    assert line.startswith(f"PORT={port}: the SGLang server's gRPC port --port+10000 must stay within 65535"), line
    assert line.endswith("set PORT from 1024 to 55535"), line


@pytest.mark.parametrize("args", [
    ("--model", "llama-3.1-70b", "--nodes", "2", "--tp", "8", "--pp", "2"),  # a DP rank over 2 nodes: MASTER_PORT
    ("--model", "llama-3.1-70b", "--nodes", "2", "--tp", "4", "--dp", "4"),  # DP ranks over 2 nodes: RPC_PORT
])
@pytest.mark.parametrize("port,ok", [(1023, False), (1024, True), (65535, True), (65536, False)])
def test_the_vllm_heads_api_port_is_a_port_from_1024(cli, tmp_path: Path, args, port, ok):
    out = _export(cli, tmp_path, "vllm", *args)
    r, launched = _run(out / "vllm_serve.sh", tmp_path, PORT=str(port))
    if ok:
        assert r.returncode == 0 and launched == 1, r.stderr
        return
    line = _refused(r, launched)
    assert line.startswith(f"PORT={port}: the head's API server port"), line  # what, and the value
    assert line.endswith("set PORT from 1024 to 65535"), line  # the range, and the fix
