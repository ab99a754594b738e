"""The router script's ROUTER_PORT / PROMETHEUS_PORT against every port a server binds on the router's node
(export.serve_router._taken, NodeLaunch.binds), each case the exported script run under bash with the exact
refusal line and exit code 2, and the first free port beside the block accepted:

- SGLang's legacy gRPC server listens at --port + 10000 (sgl-project/sglang @0317b608,
  python/sglang/srt/arg_groups/serving_hook.py handle_deprecated_args: `grpc_port=cfg.port + 10000` under
  --smg-grpc-mode / --grpc-mode), which the serve script keeps free (its PORT check);
- node 0 of an SGLang server over nodes binds the dist-init port DIST_PORT and, with DP attention, port_base =
  DIST_PORT + 1 to + 5, the Rust path's one port a DP rank from port_base + 6 (sgl-project/sglang @001067ff,
  python/sglang/srt/server_args.py PortArgs.init_new) and the DP handshake at + 13
  (DP_ATTENTION_HANDSHAKE_PORT_DELTA): 16 ranks end at DIST_PORT + 22;
- vLLM's head of a DP rank over nodes binds --master-port (vllm-project/vllm @00193b82, vllm/config/parallel.py
  ParallelConfig.master_port);
- a vLLM pool's NIXL side-channel ports, VLLM_NIXL_SIDE_CHANNEL_PORT + DP rank of each server on the node
  (vllm-project/vllm @026c83f9, docs/features/nixl_connector_usage.md, "Environment Variables").
Before, the router's check covered the servers' --port blocks and bootstrap ports only."""

from __future__ import annotations

from pathlib import Path

import pytest
from serve_scripts import export_serving, run_with_stand_ins

DPA = ("--model", "qwen3-30b-a3b", "--dp-attention", "--moe-dispatcher", "deepep")
STAND_IN = '#!/bin/bash\nf=$(mktemp "$RECORDS/run.XXXXXX")\nprintf \'%s\\0\' "$@" > "$f"\n'
TAIL = "from 1024 to 65535 outside those"

CASES = {  # name: (target, plan args, router environment, the ports the router must avoid, in the script's words)
    # 2 DP-attention servers of 4 ranks on each of 2 nodes: --port 30000 and 31000, derived ports to
    # 31000 + 240 + 4 - 1 = 31243, gRPC ports 40000 and 41000
    "co-located": ("sglang", (*DPA, "--nodes", "2", "--dp", "16", "--ep", "4"), {"NODE_ADDRS": "10.0.1.1 10.0.1.2"},
                   "a server's port (30000 to 31243 on a node) and its gRPC ports at --port+10000 (40000 to 41000)"),
    # 2 DP-attention servers of 16 ranks over 2 nodes each: node 0 binds 20000 to 20000 + 6 + 16 = 20022
    "dpa-over-nodes": ("sglang", (*DPA, "--nodes", "4", "--dp", "32", "--ep", "16"),
                       {"NODE_ADDRS": "10.0.1.1 10.0.1.3"},
                       "a server's port (30000 to 30255 on a node), its gRPC port at --port+10000 (40000) and node "
                       "0's dist-init ports (20000 to 20022)"),
    # 2 replicas of tp 8 x pp 2 over 2 nodes each: node 0 binds the dist-init port 20000 alone
    "tp-over-nodes": ("sglang", ("--model", "llama-3.1-70b", "--nodes", "4", "--tp", "8", "--pp", "2"),
                      {"NODE_ADDRS": "10.0.1.1 10.0.1.3"},
                      "a server's port (30000 on a node), its gRPC port at --port+10000 (40000) and node 0's "
                      "dist-init port (20000)"),
    # one server of 2 tp-8 replicas a node (its own --dp-size)
    "replicas": ("sglang", ("--model", "llama-3.1-8b", "--nodes", "2", "--tp", "8", "--dp", "2"),
                 {"NODE_ADDRS": "10.0.1.1 10.0.1.2"},
                 "a server's port (30000 on a node) and its gRPC port at --port+10000 (40000)"),
    # a decode pool of 4 vLLM DP-attention servers of 2 ranks on one node: NIXL ports 5600 to 5600 + 4 x 2 - 1
    "vllm-pool": ("vllm", (*DPA, "--nodes", "1", "--dp", "8", "--ep", "2", "--phase", "decode"),
                  {"NODE_ADDRS": "10.0.1.1", "OTHER_POOL": "--prefiller-hosts h --prefiller-ports 1",
                   "VLLM_SRC": "/src"},
                  "a server's port (8000 to 8003 on a node) and the NIXL side-channel ports (5600 to 5607)"),
    # a decode pool of one vLLM replica of tp 8 x pp 2 over 2 nodes: the head binds --master-port 29501
    "vllm-over-nodes": ("vllm", ("--model", "llama-3.1-70b", "--nodes", "2", "--tp", "8", "--pp", "2", "--phase",
                                 "decode"),
                        {"NODE_ADDRS": "10.0.1.1", "OTHER_POOL": "--prefiller-hosts h --prefiller-ports 1",
                         "VLLM_SRC": "/src"},
                        "a server's port (8000 on a node) and the head's --master-port (29501)"),
}

MISSED = [  # (case, a port a server binds that the router check missed before)
    ("co-located", "40000"), ("co-located", "41000"),
    ("dpa-over-nodes", "20000"), ("dpa-over-nodes", "20013"), ("dpa-over-nodes", "20022"),
    ("dpa-over-nodes", "40000"), ("tp-over-nodes", "20000"), ("tp-over-nodes", "40000"), ("replicas", "40000"),
    ("vllm-pool", "5600"), ("vllm-pool", "5607"), ("vllm-over-nodes", "29501"),
]
# (case, a port no server binds, refused all the same): _taken keeps each block whole from its first port to its
# last, so the gap between strided servers' gRPC ports (40000 and 41000) is refused too, deliberately conservative
CONSERVATIVE = [("co-located", "40500")]
REFUSED = MISSED + CONSERVATIVE
ACCEPTED = [("co-located", "41001"), ("co-located", "39999"), ("dpa-over-nodes", "20023"),
            ("dpa-over-nodes", "19999"), ("tp-over-nodes", "20001"), ("replicas", "40001"), ("vllm-pool", "5608"),
            ("vllm-over-nodes", "29502")]


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    from conftest import run_cli  # the real CLI, in process (conftest's cli fixture is function-scoped)
    tmp = tmp_path_factory.mktemp("router_ports")
    return {name: export_serving(run_cli, tmp, name, target, *args) for name, (target, args, _, _) in CASES.items()}


def _router(exports: dict[str, Path], case: str, tmp_path: Path, **env: str):
    target, _, base, _ = CASES[case]
    return run_with_stand_ins(exports[case] / f"{target}_router.sh", tmp_path, STAND_IN,
                              {"MODEL": "m", **base, **env})


@pytest.mark.parametrize("case,port", REFUSED)
def test_the_router_port_avoids_every_port_a_server_binds(exports, tmp_path: Path, case: str, port: str):
    r, records = _router(exports, case, tmp_path, ROUTER_PORT=port)
    assert r.returncode == 2 and list(records.iterdir()) == [], r.stderr
    assert r.stderr.splitlines() == [f"ROUTER_PORT={port}: the router must not take {CASES[case][3]}; set "
                                     f"ROUTER_PORT {TAIL}"]


@pytest.mark.parametrize("case,port", [c for c in REFUSED if CASES[c[0]][0] == "sglang"])
def test_the_metrics_port_avoids_every_port_a_server_binds(exports, tmp_path: Path, case: str, port: str):
    r, records = _router(exports, case, tmp_path, PROMETHEUS_PORT=port)
    assert r.returncode == 2 and list(records.iterdir()) == [], r.stderr
    assert r.stderr.splitlines() == [
        f"PROMETHEUS_PORT={port}: the router's metrics port must differ from ROUTER_PORT=8080 and from "
        f"{CASES[case][3]}; set PROMETHEUS_PORT {TAIL}"]


@pytest.mark.parametrize("case,port", ACCEPTED)
def test_a_router_port_beside_the_blocks_runs(exports, tmp_path: Path, case: str, port: str):
    r, records = _router(exports, case, tmp_path, ROUTER_PORT=port)
    assert r.returncode == 0 and len(list(records.iterdir())) == 1, r.stderr


@pytest.mark.parametrize("case", list(CASES))
def test_the_router_script_fits_80_columns(exports, case: str):
    """The messages name each block's ends as $((...)) without blanks, so the message breaks between words
    (serve_shell.stop) never fall inside an expansion (before the fix: lines of 180 columns)."""
    text = (exports[case] / f"{CASES[case][0]}_router.sh").read_text()
    assert max(len(line) for line in text.splitlines()) <= 80
