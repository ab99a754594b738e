"""Several DP-attention servers on one node (export.serve_nodes): each server its own GPUs and its own ports, and
the user's port values refused by the script (exit 2, one line) where they would collide.

Each test exports a saved plan with the real CLI, runs the exported script with stand-ins for `vllm` and
`python` on PATH that record their arguments and environment, parses every recorded command with the launcher's
recorded parser (tests/data/launchers: vLLM 0.33.0, SGLang 0.5.23) and checks, per node, that the servers' GPU
sets and port sets are disjoint. The ports each server binds are written here from the launchers' sources, not
from llmplan:
- SGLang 0.5.23 (PyPI wheel): with DP attention on one node, --port itself (and on the Rust-server path one
  listener a local DP rank from it: rust_server/server.py), the DP controller's handshake at --port + 13
  (managers/data_parallel_controller.py, DP_ATTENTION_HANDSHAKE_PORT_DELTA), the dist-init port --port + 233 and
  6 ports after it, then one scheduler-input port a DP rank on the Rust path (srt/server_args.py
  PortArgs.init_new: ZMQ_TCP_PORT_DELTA = 233, port_base = dist-init + 1, NUM_DERIVED_PORTS = 6 + dp); the legacy
  gRPC server at --port + 10000 (arg_groups/serving_hook.py); a prefill server's KV bootstrap server at
  --disaggregation-bootstrap-port (default 8998, managers/disagg_service.py).
- vLLM: --port; with NixlConnector each DP rank's side channel at VLLM_NIXL_SIDE_CHANNEL_PORT + dp_rank
  (vllm-project/vllm @026c83f9, docs/features/nixl_connector_usage.md); the GPUs CUDA_VISIBLE_DEVICES names
  (@01e4fce0, docs/serving/data_parallel_deployment.md, "External Load Balancing")."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from serve_scripts import export_serving, run_with_stand_ins

from tests.test_export import recorded_parser

DPA = ("--model", "qwen3-30b-a3b", "--dp-attention", "--moe-dispatcher", "deepep")
STAND_IN = r'''#!/bin/bash
f=$(mktemp "$RECORDS/run.XXXXXX")
printf '%s\0' "${CUDA_VISIBLE_DEVICES-unset}" "${VLLM_NIXL_SIDE_CHANNEL_PORT-unset}" "$@" > "$f"
'''


def _export(cli, tmp_path: Path, name: str, target: str, *args: str) -> Path:
    return export_serving(cli, tmp_path, name, target, *DPA, *args) / f"{target}_serve.sh"


def _run(script: Path, tmp_path: Path, node: int, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """Run the exported script for NODE_RANK `node` with the stand-ins; the recorded launches as [visible GPUs,
    NIXL side-channel port, argv...], in the order of their --port."""
    r, records = run_with_stand_ins(script, tmp_path, STAND_IN, {"NODE_RANK": str(node), "HEAD_ADDR": "10.0.0.1",
                                                              "NODE_ADDR": "10.0.0.9", **env}, tag=f"{node}-")
    runs = [f.read_bytes().decode().split("\0")[:-1] for f in records.iterdir()]
    return r, sorted(runs, key=lambda run: int(run[run.index("--port") + 1]))  # the servers start in any order


def _parsed(target: str, argv: list[str]):
    ap, rec = recorded_parser(target)
    if target == "vllm":
        assert argv[0] == "serve"
        ap.add_argument("model_tag")
        argv = argv[1:]
    else:
        assert argv[:2] == ["-m", "sglang.launch_server"]
        argv = argv[2:]
    ns, unknown = ap.parse_known_args(argv)
    assert not unknown, f"{rec['launcher']} {rec['version']} does not define {unknown}"
    return ns


def _sglang_ports(ns) -> set[int]:
    """The ports an SGLang 0.5.23 DP-attention server on one node binds (module docstring)."""
    port, ranks = int(ns.port), int(ns.attn_dp_size)
    ports = {port, port + 13, port + 10000, *range(port, port + ranks), *range(port + 233, port + 240 + ranks)}
    if ns.disaggregation_mode == "prefill":
        ports.add(int(ns.disaggregation_bootstrap_port or 8998))
    return ports


def _disjoint(sets: list[set[int]]) -> None:
    seen: set[int] = set()
    for s in sets:
        assert not s & seen, sorted(s & seen)
        seen |= s


def test_vllm_dp_attention_servers_of_half_a_node_get_their_own_gpus_and_port(cli, tmp_path: Path):
    """Before: one `vllm serve --data-parallel-size 4` and a comment 'start this command on each group of 4 GPUs'
    (nothing said which GPUs or which port)."""
    script = _export(cli, tmp_path, "dpa4", "vllm", "--nodes", "1", "--dp", "8", "--ep", "4")
    r, runs = _run(script, tmp_path, 0)
    assert r.returncode == 0, r.stderr
    assert [run[0] for run in runs] == ["0,1,2,3", "4,5,6,7"]
    servers = [_parsed("vllm", run[2:]) for run in runs]
    assert [int(ns.port) for ns in servers] == [8000, 8001]
    assert all(int(ns.data_parallel_size) == 4 and ns.enable_expert_parallel for ns in servers)
    assert {run[1] for run in runs} == {"unset"}  # co-located serving: no KV connector, no side channel
    assert "start this command on each group" not in script.read_text()


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_vllm_pool_servers_on_two_nodes_get_disjoint_gpus_ports_and_nixl_side_channels(cli, tmp_path: Path, phase):
    script = _export(cli, tmp_path, f"v{phase}", "vllm", "--nodes", "2", "--dp", "16", "--ep", "2", "--phase", phase)
    for node in (0, 1):
        r, runs = _run(script, tmp_path, node)
        assert r.returncode == 0, r.stderr
        gpus = [set(run[0].split(",")) for run in runs]
        assert len(runs) == 4 and set().union(*gpus) == {str(g) for g in range(8)}
        _disjoint(gpus)
        servers = [_parsed("vllm", run[2:]) for run in runs]
        ranks = [int(ns.data_parallel_size) for ns in servers]
        assert ranks == [2] * 4 and all(ns.kv_transfer_config for ns in servers)
        http = [{int(ns.port)} for ns in servers]
        nixl = [set(range(int(run[1]), int(run[1]) + k)) for run, k in zip(runs, ranks)]
        _disjoint(http + nixl)


def test_sglang_prefill_servers_on_one_node_get_disjoint_gpus_and_ports(cli, tmp_path: Path):
    """Before: every prefill server started its KV bootstrap server at 8998 (SGLang's default; its
    start_disagg_service warns that servers on one host need distinct ones), and nothing kept a server's
    gRPC port (--port + 10000) out of the others' ports."""
    script = _export(cli, tmp_path, "dpa2", "sglang", "--nodes", "1", "--dp", "8", "--ep", "2", "--phase", "prefill")
    r, runs = _run(script, tmp_path, 0)
    assert r.returncode == 0, r.stderr
    servers = [_parsed("sglang", run[2:]) for run in runs]
    assert [int(ns.base_gpu_id) for ns in servers] == [0, 2, 4, 6]
    assert all(int(ns.tp_size) == 2 and ns.gpu_id_step is None for ns in servers)  # GPUs base .. base + 1 each
    ports = [_sglang_ports(ns) for ns in servers]
    _disjoint(ports)
    assert max(max(p) for p in ports) <= 65535
    assert [int(ns.disaggregation_bootstrap_port) for ns in servers] == [8998, 8999, 9000, 9001]


def test_a_users_base_port_at_the_top_of_its_range_still_gives_disjoint_ports(cli, tmp_path: Path):
    script = _export(cli, tmp_path, "dpa2", "sglang", "--nodes", "1", "--dp", "8", "--ep", "2", "--phase", "prefill")
    r, runs = _run(script, tmp_path, 0, PORT="52535", BOOTSTRAP_PORT="20000")
    assert r.returncode == 0, r.stderr
    ports = [_sglang_ports(_parsed("sglang", run[2:])) for run in runs]
    _disjoint(ports)
    assert max(max(p) for p in ports) == 65535  # the last server's gRPC port


@pytest.mark.parametrize("target,args,env,says", [
    # 4 SGLang servers 1000 apart: the last one's gRPC port (PORT + 3000 + 10000) would pass 65535
    ("sglang", ("--phase", "prefill"), {"PORT": "52536"}, "set PORT from 1024 to 52535"),
    # the bootstrap ports 31000..31003 are server 1's --port onward; the check keeps 30000..43000 (the last
    # server's gRPC port) clear, 4 ports below or above it
    ("sglang", ("--phase", "prefill"), {"BOOTSTRAP_PORT": "31000"},
     "set BOOTSTRAP_PORT from 1024 to 29996 or from 43001 to 65532"),
    ("sglang", (), {"PORT": "30000x"}, "PORT=30000x is not a port number"),
    # vLLM: the side-channel ports 7998..8005 of the 8 DP ranks overlap the servers' 8000..8003
    ("vllm", ("--phase", "decode"), {"NIXL_PORT": "7998"}, "set NIXL_PORT from 1024 to 7992 or from 8004 to 65528"),
    ("vllm", (), {"PORT": "65533"}, "set PORT from 1024 to 65532"),
])
def test_a_port_value_that_would_collide_stops_the_script_with_one_line(cli, tmp_path: Path, target, args, env,
                                                                        says):
    script = _export(cli, tmp_path, "dpa2", target, "--nodes", "1", "--dp", "8", "--ep", "2", *args)
    r, runs = _run(script, tmp_path, 0, **env)
    assert r.returncode == 2 and runs == [], (r.returncode, r.stderr)
    assert len(r.stderr.splitlines()) == 1 and says in r.stderr, r.stderr


def test_many_sglang_servers_on_a_large_node_keep_their_blocks_below_the_grpc_ports():
    """A node of 72 GPUs holding 36 servers of 2: 1000 apart their --port would reach 65000 and server j's gRPC port
    (--port + 10000) would be server j + 10's --port; the step shrinks so that every block (--port to --port + 241,
    SGLang 0.5.23 PortArgs.init_new on its Rust path) fits below the first gRPC port. Blocks too wide to fit are
    refused."""
    from llmplan.errors import LlmplanError
    from llmplan.export.serve_nodes import sglang_stride
    stride = sglang_stride(36, 2, 72)
    blocks = [set(range(stride * j, stride * j + 240 + 2)) for j in range(36)]
    _disjoint(blocks + [{stride * j + 10000} for j in range(36)])
    with pytest.raises(LlmplanError, match="do not fit under the 10000 ports below their gRPC ports"):
        sglang_stride(36, 40, 72)
