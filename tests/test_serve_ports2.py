"""The per-node serving scripts' multi-node ports and the router script (export.serve_nodes, export.serve_router).

Each test exports saved plans with the real CLI, runs the exported scripts with stand-ins for `vllm` and `python`
that record their arguments and environment, and checks what the launchers would receive. The ports and flags the
tests check are written here from the launchers' sources, not from llmplan:
- SGLang 0.5.23 (PyPI wheel, read): a server over nodes binds on node 0 its --dist-init-addr port and, with DP
  attention, the 6 ports after it, one scheduler-input port a DP rank from + 7 on the Rust-server path
  (srt/server_args.py PortArgs.init_new, port_base = dist-init port + 1) and the DP handshake at + 13
  (managers/data_parallel_controller.py); besides --port (with the Rust path's listeners from it) and the legacy
  gRPC port --port + 10000; a prefill server its --disaggregation-bootstrap-port.
- vLLM: --master-port (node 0's torch.distributed rendezvous) and --data-parallel-rpc-port (the head's DP
  handshake) besides --port (vllm-project/vllm @00193b82, vllm/config/parallel.py).
- The SGLang router's flags (sgl-project/sglang @094b723a, sgl-router/py_src/sglang_router/launch_router.py
  RouterArgs.add_cli_args): --host, --port, --worker-urls URL..., --pd-disaggregation, --prefill URL
  BOOTSTRAP_PORT (repeated), --decode URL (repeated); --prometheus-port, default 29000 (@083d6013,
  sgl-router/py_src/sglang_router/router_args.py add_cli_args). vLLM's NixlConnector proxy (@030ea52e,
  tests/v1/kv_connector/nixl_integration/toy_proxy_server.py parse_args): --host, --port, --prefiller-hosts,
  --prefiller-ports, --decoder-hosts, --decoder-ports, hosts and ports paired in order."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
from serve_scripts import export_serving as _export, run_with_stand_ins

DPA = ("--model", "qwen3-30b-a3b", "--dp-attention", "--moe-dispatcher", "deepep")
STAND_IN = r'''#!/bin/bash
f=$(mktemp "$RECORDS/run.XXXXXX")
printf '%s\0' "${VLLM_PORT-unset}" "${SGLANG_PORT-unset}" "$@" > "$f"
'''
PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"


def _run(script: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """Run `script` with the stand-ins on PATH; the recorded launches as [VLLM_PORT, SGLANG_PORT, argv...]."""
    r, records = run_with_stand_ins(script, tmp_path, STAND_IN, {"HEAD_ADDR": "10.0.0.1", "NODE_ADDR": "10.0.0.9", "MODEL": "m", **env})
    return r, [f.read_bytes().decode().split("\0")[:-1] for f in records.iterdir()]


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _servers(out: Path, target: str, addrs: list[str], tmp_path: Path, **env: str) -> list[tuple[str, int, int | None]]:
    """Every server the serve script starts that serves the API, over its nodes (NODE_RANK k at addrs[k]): its
    address, --port (the launcher's default where the script gives none) and bootstrap port."""
    default = 8000 if target == "vllm" else 30000
    found = []
    for k, addr in enumerate(addrs):
        r, runs = _run(out / f"{target}_serve.sh", tmp_path, NODE_RANK=str(k), **env)
        assert r.returncode == 0, r.stderr
        for run in runs:
            argv = run[2:]
            if "--headless" in argv or ("--node-rank" in argv and _flag(argv, "--node-rank") != "0"):
                continue  # no API server on the other nodes of a server
            boot = _flag(argv, "--disaggregation-bootstrap-port")
            found.append((addr, int(_flag(argv, "--port") or default), None if boot is None else int(boot)))
    return sorted(found)


def _sglang_router(argv: list[str]) -> argparse.Namespace:
    assert argv[:2] == ["-m", "sglang_router.launch_router"]
    ap = argparse.ArgumentParser()
    ap.add_argument("--host")
    ap.add_argument("--port", type=int)
    ap.add_argument("--worker-urls", nargs="*", default=[])
    ap.add_argument("--pd-disaggregation", action="store_true")
    ap.add_argument("--prefill", nargs="+", action="append", default=[])
    ap.add_argument("--decode", nargs=1, action="append", default=[])
    ap.add_argument("--prometheus-port", type=int, default=29000)
    return ap.parse_args(argv[2:])  # an unknown word is an error here


def _vllm_proxy(argv: list[str]) -> argparse.Namespace:
    assert argv[0].endswith("/" + PROXY)
    ap = argparse.ArgumentParser()
    ap.add_argument("--host")
    ap.add_argument("--port", type=int)
    for role in ("prefiller", "decoder"):
        ap.add_argument(f"--{role}-hosts", nargs="+")
        ap.add_argument(f"--{role}-ports", type=int, nargs="+")
    return ap.parse_args(argv[1:])


def _url(addr: str, port: int) -> str:
    return f"http://{addr}:{port}"


def test_sglang_router_of_a_disaggregated_deployment_names_every_server(cli, tmp_path: Path):
    """Prefill: 4 DP-attention servers on one node (their own --port and bootstrap port); decode: one server over
    2 nodes. The router gets each prefill server's URL with its bootstrap port and the decode server's URL."""
    pre = _export(cli, tmp_path, "pre", "sglang", *DPA, "--nodes", "1", "--dp", "8", "--ep", "2", "--phase", "prefill")
    dec = _export(cli, tmp_path, "dec", "sglang", *DPA, "--nodes", "2", "--dp", "16", "--ep", "16", "--phase",
                  "decode")
    prefill = _servers(pre, "sglang", ["10.0.0.2"], tmp_path)
    decode = _servers(dec, "sglang", ["10.0.0.5", "10.0.0.6"], tmp_path)
    assert len(prefill) == 4 and len(decode) == 1
    words = subprocess.run(["bash", str(dec / "sglang_router.sh")], capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "POOL_ARGS_ONLY": "1", "NODE_ADDRS": "10.0.0.5"})
    assert words.returncode == 0, words.stderr
    r, runs = _run(pre / "sglang_router.sh", tmp_path, NODE_ADDRS="10.0.0.2", OTHER_POOL=words.stdout.strip())
    assert r.returncode == 0 and len(runs) == 1, r.stderr
    ns = _sglang_router(runs[0][2:])
    assert ns.pd_disaggregation and ns.worker_urls == []
    assert sorted(ns.prefill) == sorted([_url(a, p), str(b)] for a, p, b in prefill)
    assert ns.decode == [[_url(a, p)] for a, p, _ in decode]
    assert ns.port not in {p for _, p, _ in prefill}  # not SGLang's router default 30000, a server's port


def test_sglang_router_spreads_requests_over_co_located_servers_on_two_nodes(cli, tmp_path: Path):
    out = _export(cli, tmp_path, "co", "sglang", *DPA, "--nodes", "2", "--dp", "16", "--ep", "4")
    servers = _servers(out, "sglang", ["10.0.1.1", "10.0.1.2"], tmp_path, PORT="31000")
    assert len(servers) == 4
    r, runs = _run(out / "sglang_router.sh", tmp_path, NODE_ADDRS="10.0.1.1 10.0.1.2", PORT="31000")
    assert r.returncode == 0, r.stderr
    ns = _sglang_router(runs[0][2:])
    assert not ns.pd_disaggregation and sorted(ns.worker_urls) == sorted(_url(a, p) for a, p, _ in servers)
    r, runs = _run(out / "sglang_router.sh", tmp_path, NODE_ADDRS="10.0.1.1")  # one address for two nodes
    assert r.returncode == 2 and runs == [] and len(r.stderr.splitlines()) == 1, r.stderr


def test_vllm_proxy_of_a_disaggregated_deployment_names_every_server(cli, tmp_path: Path):
    """Prefill: 4 DP-attention servers on each of 2 nodes; decode: 16 DP ranks over 2 nodes, one endpoint (the
    head: "for multi-host DP deployment, only need to provide the host/port of the head instances")."""
    pre = _export(cli, tmp_path, "pre", "vllm", *DPA, "--nodes", "2", "--dp", "16", "--ep", "2", "--phase", "prefill")
    dec = _export(cli, tmp_path, "dec", "vllm", *DPA, "--nodes", "2", "--dp", "16", "--ep", "16", "--phase", "decode")
    prefill = _servers(pre, "vllm", ["10.0.0.2", "10.0.0.3"], tmp_path)
    decode = _servers(dec, "vllm", ["10.0.0.5", "10.0.0.6"], tmp_path)
    assert len(prefill) == 8 and decode == [("10.0.0.5", 8000, None)]
    words = subprocess.run(["bash", str(dec / "vllm_router.sh")], capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "POOL_ARGS_ONLY": "1", "NODE_ADDRS": "10.0.0.5"})
    assert words.returncode == 0, words.stderr
    r, runs = _run(pre / "vllm_router.sh", tmp_path, NODE_ADDRS="10.0.0.2 10.0.0.3", OTHER_POOL=words.stdout.strip(),
                   VLLM_SRC="/src/vllm")
    assert r.returncode == 0 and len(runs) == 1, r.stderr
    ns = _vllm_proxy(runs[0][2:])
    assert sorted(zip(ns.prefiller_hosts, ns.prefiller_ports)) == [(a, p) for a, p, _ in prefill]
    assert list(zip(ns.decoder_hosts, ns.decoder_ports)) == [(a, p) for a, p, _ in decode]


def test_no_router_script_where_vllm_documents_none_or_one_server_serves(cli, tmp_path: Path):
    out = _export(cli, tmp_path, "co", "vllm", *DPA, "--nodes", "1", "--dp", "8", "--ep", "4")
    assert not (out / "vllm_router.sh").exists()  # co-located vLLM servers: any HTTP load balancer
    out = _export(cli, tmp_path, "one", "sglang", "--model", "llama-3.1-8b", "--nodes", "1", "--tp", "1")
    assert not (out / "sglang_router.sh").exists()


def _sglang_dist_ports(dist: int, ranks: int) -> set[int]:
    """Node 0's ports of an SGLang DP-attention server over nodes derived from --dist-init-addr (docstring)."""
    return {dist, *range(dist + 1, dist + 7), *range(dist + 7, dist + 7 + ranks), dist + 13}


def _sglang_port_ports(port: int, ranks: int) -> set[int]:
    return {*range(port, port + ranks), port + 10000}


@pytest.mark.parametrize("dist,runs", [(29977, True), (29978, False), (39994, False), (39977, True), (29997, False)])
def test_sglang_dist_port_must_keep_its_ports_off_the_servers(cli, tmp_path: Path, dist, runs):
    """A DP-attention server of 16 ranks over 2 nodes: DIST_PORT's block ends at DIST_PORT + 22 (the Rust path's
    16 scheduler-input ports from + 7), so 29977 still clears --port 30000 and 29978 does not; 39994 meets the legacy
    gRPC port 40000 and 39977 clears it; 29997 is the example of the issue (its + 3 is --port)."""
    out = _export(cli, tmp_path, "d16", "sglang", *DPA, "--nodes", "2", "--dp", "16", "--ep", "16")
    clear = not (_sglang_dist_ports(dist, 16) & _sglang_port_ports(30000, 16))
    r, launched = _run(out / "sglang_serve.sh", tmp_path, NODE_RANK="0", DIST_PORT=str(dist))
    assert (r.returncode == 0) == clear, (r.returncode, r.stderr)
    if not clear:
        assert launched == [] and len(r.stderr.splitlines()) == 1 and "set DIST_PORT from 1024 to" in r.stderr
    else:
        assert _flag(launched[0][2:], "--dist-init-addr") == f"10.0.0.1:{dist}"
    assert clear == runs  # the expectation written above agrees with the source reading


@pytest.mark.parametrize("target,args,env,says", [
    # the bootstrap port inside node 0's dist-init block (20000 to 20000 + 22)
    ("sglang", (*DPA, "--nodes", "2", "--dp", "16", "--ep", "16", "--phase", "prefill"), {"BOOTSTRAP_PORT": "20005"},
     "bootstrap port must lie outside"),
    # vLLM one DP rank over 2 nodes: --master-port and --port on the head
    ("vllm", ("--model", "llama-3.1-70b", "--nodes", "2", "--tp", "8", "--pp", "2"), {"MASTER_PORT": "8000"},
     "set MASTER_PORT from 1024 to 65535, not PORT"),
    ("vllm", ("--model", "llama-3.1-70b", "--nodes", "2", "--tp", "8", "--pp", "2"), {"PORT": "29501"},
     "set MASTER_PORT from 1024 to 65535, not PORT"),
    # vLLM DP ranks over 2 nodes: --data-parallel-rpc-port and --port on the head
    ("vllm", ("--model", "llama-3.1-70b", "--nodes", "2", "--tp", "4", "--dp", "4"), {"RPC_PORT": "8000"},
     "set RPC_PORT from 1024 to 65535, not PORT"),
    ("sglang", ("--model", "llama-3.1-70b", "--nodes", "2", "--tp", "8", "--pp", "2"), {"DIST_PORT": "x"},
     "DIST_PORT=x is not a port number"),
])
def test_a_multi_node_port_that_would_collide_stops_the_script_with_one_line(cli, tmp_path: Path, target, args,
                                                                             env, says):
    out = _export(cli, tmp_path, "m", target, *args)
    r, runs = _run(out / f"{target}_serve.sh", tmp_path, NODE_RANK="0", **env)
    assert r.returncode == 2 and runs == [], (r.returncode, r.stderr)
    assert len(r.stderr.splitlines()) == 1 and says in r.stderr, r.stderr


def test_the_multi_node_defaults_run_and_reach_the_launcher(cli, tmp_path: Path):
    out = _export(cli, tmp_path, "pp", "vllm", "--model", "llama-3.1-70b", "--nodes", "2", "--tp", "8", "--pp", "2")
    r, runs = _run(out / "vllm_serve.sh", tmp_path, NODE_RANK="0")
    assert r.returncode == 0, r.stderr
    argv = runs[0][2:]
    assert (_flag(argv, "--master-port"), _flag(argv, "--port")) == ("29501", "8000")


def test_a_router_port_on_a_server_port_is_refused(cli, tmp_path: Path):
    out = _export(cli, tmp_path, "co", "sglang", *DPA, "--nodes", "1", "--dp", "8", "--ep", "4")
    r, runs = _run(out / "sglang_router.sh", tmp_path, NODE_ADDRS="10.0.0.1", ROUTER_PORT="31000")
    assert r.returncode == 2 and runs == [] and len(r.stderr.splitlines()) == 1, r.stderr
    assert "the router must not take a server's port" in r.stderr


@pytest.mark.parametrize("target,var", [("vllm", "VLLM_PORT"), ("sglang", "SGLANG_PORT")])
def test_the_launchers_base_port_variable_does_not_reach_co_located_servers(cli, tmp_path: Path, target, var):
    """VLLM_PORT / SGLANG_PORT make every server search its free ports upward from the same value (vLLM
    network_utils._get_open_port, SGLang utils/network.get_open_port): the script clears it."""
    out = _export(cli, tmp_path, "co", target, *DPA, "--nodes", "1", "--dp", "8", "--ep", "4")
    r, runs = _run(out / f"{target}_serve.sh", tmp_path, NODE_RANK="0", **{var: "8001"})
    assert r.returncode == 0 and len(runs) == 2, r.stderr
    assert {run[0] for run in runs} == {run[1] for run in runs} == {"unset"}
