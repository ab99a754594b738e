"""Serving exports of servers that span nodes (export.serve_nodes): one command per node with the launcher's own
multi-node flags, the head address a placeholder the script refuses to run without.

Golden texts written from the launchers' documented multi-node launches:
- vLLM DP over nodes: vllm-project/vllm @01e4fce0, docs/serving/data_parallel_deployment.md ("DP=4 with DP ranks 0
  and 1 on the head node and ranks 2 and 3 on the second node": --data-parallel-size 4 --data-parallel-size-local 2
  --data-parallel-address --data-parallel-rpc-port on both, --headless --data-parallel-start-rank 2 on node 1).
- vLLM one replica over nodes: vllm-project/vllm @096bd6a4, docs/serving/parallelism_scaling.md ("tp_size=8 and
  pp_size=2" on 2 nodes: --nnodes 2 --node-rank 0/1 --master-addr, --headless on node 1).
- SGLang one server over nodes: --nnodes, --node-rank, --dist-init-addr (python/sglang/srt/server_args.py); an even
  share of a node per server from --base-gpu-id (entrypoints/engine.py _launch_scheduler_processes).
Every node's command is parsed with the launchers' recorded parsers (tests/data/launchers, vLLM 0.33.0, SGLang
0.5.23). Exact text: only the per-node part (from `case` to `esac`), the rest is the one-node export's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.test_export import command_argv, recorded_parser

H100 = ("--hardware", "dgx-h100")
PROGRAM = {"vllm": "vllm serve", "sglang": "python -m sglang.launch_server"}


def _export(cli, tmp_path: Path, name: str, target: str, *args: str) -> str:
    plan, out = tmp_path / f"{name}.json", tmp_path / name
    r = cli("estimate", "--mode", "infer", *H100, *args, "--save", plan)
    assert r.code == 0, r.err
    r = cli("export", plan, "--to", target, "-o", out)
    assert r.code == 0, r.err
    return (out / f"{target}_serve.sh").read_text()


def _cases(script: str) -> str:
    return script[script.index('case "$NODE_RANK" in'):]


def _parsed(script: str, target: str, index: int):
    ap, rec = recorded_parser(target)
    if target == "vllm":
        ap.add_argument("model_tag", nargs="?")
    ns, unknown = ap.parse_known_args(command_argv(script, PROGRAM[target], index))
    assert not unknown, f"{rec['launcher']} {rec['version']} does not define {unknown}"
    return ns


VLLM_DP = '''case "$NODE_RANK" in
    0)
        vllm serve "$MODEL" "${ARGS[@]}" \\
            --data-parallel-size-local 2 \\
            --port "$PORT" \\
            --data-parallel-address "$HEAD_ADDR" \\
            --data-parallel-rpc-port "$RPC_PORT"
        ;;
    1)
        vllm serve "$MODEL" "${ARGS[@]}" \\
            --data-parallel-size-local 2 \\
            --data-parallel-start-rank 2 \\
            --headless \\
            --data-parallel-address "$HEAD_ADDR" \\
            --data-parallel-rpc-port "$RPC_PORT"
        ;;
    *) echo "NODE_RANK must be 0 to 1" >&2; exit 2 ;;
esac
'''


def test_vllm_dp_over_two_nodes_is_the_documented_four_rank_launch(cli, tmp_path: Path):
    """Before: one `vllm serve --tensor-parallel-size 4 --data-parallel-size 4` (16 GPUs on one 8-GPU node)."""
    s = _export(cli, tmp_path, "dp4", "vllm", "--model", "llama-3.1-70b", "--nodes", "2", "--tp", "4", "--dp", "4")
    assert _cases(s) == VLLM_DP
    assert "HEAD_ADDR=${HEAD_ADDR:?FILL IN the IP address of node 0}\n" in s
    assert "# FILL IN HEAD_ADDR" in s and "RPC_PORT=${RPC_PORT:-13345}\n" in s
    for k in (0, 1):
        ns = _parsed(s, "vllm", k)
        assert (int(ns.data_parallel_size), int(ns.tensor_parallel_size)) == (4, 4)
        assert int(ns.data_parallel_size_local) == 2 and ns.headless == (k == 1)
        assert (ns.data_parallel_start_rank is None) == (k == 0)


VLLM_PP = '''case "$NODE_RANK" in
    0)
        vllm serve "$MODEL" "${ARGS[@]}" \\
            --nnodes 2 \\
            --node-rank 0 \\
            --master-addr "$HEAD_ADDR" \\
            --master-port "$MASTER_PORT" \\
            --port "$PORT"
        ;;
    1)
        vllm serve "$MODEL" "${ARGS[@]}" \\
            --nnodes 2 \\
            --node-rank 1 \\
            --master-addr "$HEAD_ADDR" \\
            --master-port "$MASTER_PORT" \\
            --headless
        ;;
    *) echo "NODE_RANK must be 0 to 1" >&2; exit 2 ;;
esac
'''

SGLANG_PP = '''case "$NODE_RANK" in
    0)
        python -m sglang.launch_server --model-path "$MODEL" "${ARGS[@]}" \\
            --nnodes 2 \\
            --node-rank 0 \\
            --dist-init-addr "$HEAD_ADDR:$DIST_PORT" \\
            --port "$PORT"
        ;;
    1)
        python -m sglang.launch_server --model-path "$MODEL" "${ARGS[@]}" \\
            --nnodes 2 \\
            --node-rank 1 \\
            --dist-init-addr "$HEAD_ADDR:$DIST_PORT" \\
            --port "$PORT"
        ;;
    *) echo "NODE_RANK must be 0 to 1" >&2; exit 2 ;;
esac
'''


@pytest.mark.parametrize("target,golden", [("vllm", VLLM_PP), ("sglang", SGLANG_PP)])
def test_one_replica_of_tp8_pp2_over_two_nodes_runs_one_command_per_node(cli, tmp_path: Path, target, golden):
    """vLLM's documented tp 8 pp 2 launch on 2 nodes; SGLang the same server with --nnodes."""
    s = _export(cli, tmp_path, "pp2", target, "--model", "llama-3.1-70b", "--nodes", "2", "--tp", "8", "--pp", "2",
                "--engine", target)
    assert _cases(s) == golden
    for k in (0, 1):
        ns = _parsed(s, target, k)
        size = ns.tensor_parallel_size if target == "vllm" else ns.tp_size
        pp = ns.pipeline_parallel_size if target == "vllm" else ns.pp_size
        assert (int(size), int(pp), int(ns.nnodes), int(ns.node_rank)) == (8, 2, 2, k)
    assert ("--data-parallel-size" if target == "vllm" else "--dp-size") not in s


def test_sglang_dp_attention_server_over_two_nodes(cli, tmp_path: Path):
    s = _export(cli, tmp_path, "dpa16", "sglang", "--model", "qwen3-30b-a3b", "--nodes", "2", "--dp-attention",
                "--dp", "16", "--ep", "16", "--moe-dispatcher", "deepep", "--engine", "sglang")
    assert _cases(s) == SGLANG_PP
    assert "DIST_PORT=${DIST_PORT:-20000}\n" in s
    ns = _parsed(s, "sglang", 1)
    assert (int(ns.tp_size), int(ns.attn_dp_size), int(ns.ep_size)) == (16, 16, 16)
    assert ns.dist_init_addr == "$HEAD_ADDR:$DIST_PORT"


SGLANG_BASE = '''case "$NODE_RANK" in
    0)
        python -m sglang.launch_server --model-path "$MODEL" "${ARGS[@]}" \\
            --base-gpu-id 0 \\
            --port "$PORT" &
        python -m sglang.launch_server --model-path "$MODEL" "${ARGS[@]}" \\
            --base-gpu-id 4 \\
            --port "$((PORT+1000))" &
        for _ in 1 2; do
            wait -n || { s=$?; kill $(jobs -p) 2>/dev/null || true; exit "$s"; }
        done
        ;;
    *) echo "NODE_RANK must be 0 to 0" >&2; exit 2 ;;
esac
'''


def test_sglang_dp_attention_servers_smaller_than_a_node_get_their_own_gpus_and_port(cli, tmp_path: Path):
    """Before: one command and 'start this command on each group of 4 GPUs' (nothing said which)."""
    s = _export(cli, tmp_path, "dpa4", "sglang", "--model", "qwen3-30b-a3b", "--nodes", "1", "--dp-attention",
                "--dp", "8", "--ep", "4", "--moe-dispatcher", "deepep", "--engine", "sglang")
    assert _cases(s) == SGLANG_BASE
    assert "NODE_RANK=${NODE_RANK:-0}\n" in s and "HEAD_ADDR" not in s
    assert [int(_parsed(s, "sglang", j).base_gpu_id) for j in (0, 1)] == [0, 4]


def test_sglang_servers_on_one_node_bind_disjoint_ports(cli, tmp_path: Path):
    """Before: --port 30000 and 30001, so server 0's tokenizer port (30234) was server 1's dist-init port. The
    script is run with stand-ins and each server's ports checked (tests/test_serve_dpa_ports.py)."""
    from tests.test_serve_dpa_ports import _disjoint, _parsed as _recorded, _run, _sglang_ports
    s = _export(cli, tmp_path, "dpa2", "sglang", "--model", "qwen3-30b-a3b", "--nodes", "1", "--dp-attention",
                "--dp", "8", "--ep", "2", "--moe-dispatcher", "deepep", "--engine", "sglang")
    script = tmp_path / "dpa2.sh"
    script.write_text(s)
    r, runs = _run(script, tmp_path, 0)
    assert r.returncode == 0, r.stderr
    servers = [_recorded("sglang", run[2:]) for run in runs]
    assert [int(ns.base_gpu_id) for ns in servers] == [0, 2, 4, 6]
    _disjoint([_sglang_ports(ns) for ns in servers])


def test_sglang_replicas_over_nodes_run_one_server_a_node(cli, tmp_path: Path):
    """Before: --tp-size 4 --dp-size 4 in one command on one 8-GPU node. SGLang refuses --dp-size > 1 with
    --nnodes > 1 without DP attention (server_args.py: "multi-node data parallel is not supported unless dp
    attention!"), so each node runs its own server of 2 replicas."""
    s = _export(cli, tmp_path, "dp4", "sglang", "--model", "llama-3.1-70b", "--nodes", "2", "--tp", "4", "--dp", "4",
                "--engine", "sglang")
    for k in (0, 1):
        ns = _parsed(s, "sglang", k)
        assert (int(ns.tp_size), int(ns.dp_size), ns.nnodes) == (4, 2, None)
    assert "HEAD_ADDR" not in s and "one SGLang server a node" in s


def test_a_one_node_plan_keeps_its_single_command(cli, tmp_path: Path):
    for target in ("vllm", "sglang"):
        s = _export(cli, tmp_path, f"one-{target}", target, "--model", "llama-3.1-70b", "--nodes", "1", "--tp", "4",
                    "--dp", "2")
        assert "NODE_RANK" not in s and "ARGS=(" not in s
        assert sum(ln.startswith(PROGRAM[target]) for ln in s.splitlines()) == 1


def test_the_head_address_placeholder_stops_the_script(cli, tmp_path: Path):
    s = _export(cli, tmp_path, "dp4", "vllm", "--model", "llama-3.1-70b", "--nodes", "2", "--tp", "4", "--dp", "4")
    path = tmp_path / "run.sh"
    path.write_text(s)
    r = subprocess.run(["bash", str(path)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "HEAD_ADDR: FILL IN the IP address of node 0" in r.stderr


def test_refused_where_the_launcher_cannot_start_it(cli, tmp_path: Path):
    # vLLM: DP ranks sharing experts whose TP group spans nodes need its Ray backend
    plan = tmp_path / "ep.json"
    assert cli("estimate", "--mode", "infer", *H100, "--model", "qwen3-30b-a3b", "--nodes", "4", "--tp", "16",
               "--dp", "2", "--ep", "32", "--engine", "vllm", "--save", plan).code == 0
    r = cli("export", plan, "--to", "vllm", "-o", tmp_path / "ep")
    assert r.code == 2 and "Traceback" not in r.err
    assert "spans nodes only with its Ray backend" in r.err and "re-plan with tp x pp at most 8" in r.err
    # a replica of 12 GPUs on nodes of 8: part of a node (SGLang: tp-size / nnodes ranks on each node)
    plan = tmp_path / "pp3.json"
    assert cli("estimate", "--mode", "infer", *H100, "--model", "qwen3-30b-a3b", "--nodes", "3", "--tp", "4",
               "--pp", "3", "--dp", "2", "--engine", "sglang", "--save", plan).code == 0
    r = cli("export", plan, "--to", "sglang", "-o", tmp_path / "pp3")
    assert r.code == 2 and "a replica (tp x pp) of 12 GPUs over nodes of 8 would take part of a node" in r.err
    assert "_calculate_rank_ranges" in r.err


# --- DP-attention servers smaller than a node in the search (search.serve.wide_ep_sizes) ------------------------

QWEN_DPA = ("search", "--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "1",
            "--dp-attention", "--engine", "sglang")


def test_the_search_tries_dp_attention_servers_of_half_and_a_quarter_of_a_node(cli, tmp_path: Path):
    """Before: one DGX H100 tried only dpa8 (whole nodes, doubling); now also dpa4 x2 and dpa2 x4, each server's
    EP group inside one node's NVLink (placed by hand: 4 consecutive GPUs of 8, no NIC), and the export of the
    saved plan starts each server on its own GPUs (--base-gpu-id)."""
    r = cli(*QWEN_DPA, "--json", "--top", "10")
    assert r.code == 0, r.err
    sizes = sorted((p["plan"]["ep"], p["plan"]["dp"]) for p in r.json()["plans"])
    assert sizes == [(2, 8), (4, 8), (8, 8)], sizes
    from llmplan.specs.plan import ClusterSpec
    from llmplan.specs.serve import ServePlan
    from llmplan.specs.registry import builtin_systems
    from llmplan.topology.placement import place
    span = place(ServePlan(tp=1, dp=8, ep=4, dp_attention=True).degrees,
                 ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=1))["ep"]
    assert (span.nodes, span.per_node, span.uses_nic) == (1, 4, False)
    plan = tmp_path / "best.json"
    assert cli(*QWEN_DPA, "--ep", "4", "--save", plan).code == 0
    out = tmp_path / "out"
    assert cli("export", plan, "--to", "sglang", "-o", out).code == 0
    assert _cases((out / "sglang_serve.sh").read_text()) == SGLANG_BASE


def test_a_one_node_disaggregated_search_has_dp_attention_instances(cli):
    """Before: no DP-attention instance on one node (dpa8 leaves the other phase no GPU); now dpa2 and dpa4 per
    phase (4 layouts priced) and splits such as prefill dpa4 + decode dpa4 on 4:4 GPUs."""
    r = cli(*QWEN_DPA, "--disaggregated", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["considered"] == 4, doc["considered"]
    assert {(x["prefill"]["gpus_per_instance"], x["decode"]["gpus_per_instance"]) for x in doc["plans"]} == \
        {(2, 4), (4, 4), (2, 2), (4, 2)}


# --- TensorRT-LLM: DP-attention servers over node boundaries (specs.check.dp_attention_server_nodes_ok) ----------

DSV3 = ("estimate", "--mode", "infer", "--model", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "9",
        "--dp", "72", "--dp-attention", "--moe-dispatcher", "deepep", "--redundant-experts", "32", "--engine", "trtllm")


def test_trtllm_refuses_a_dp_attention_server_that_starts_part_way_into_a_node(cli):
    """Before: accepted (serve-dpa3 refused it under SGLang only). Two servers of 36 GPUs on 9 nodes of 8: the
    second starts at GPU 4 of node 4, so its ranks 4-7 sit on node 5 while TensorRT-LLM's Mapping (one MPI world a
    server) puts them on its node 0 (node_rank = rank // gpus_per_node, tensorrt_llm/mapping.py @b35ac1b6)."""
    r = cli(*DSV3, "--ep", "36")
    assert r.code == 2 and "Traceback" not in r.err
    assert "--dp-attention under trtllm" in r.err and "(server 2 takes GPUs 36-71)" in r.err, r.err
    assert "Mapping puts rank r of a server on node r // gpus_per_node" in r.err
    assert "use --ep 2, 4, 8, 24, 72 on these 72 GPUs" in r.err, r.err
    for ep in ("72", "24", "8", "4"):  # whole nodes, or an even share of one
        assert cli(*DSV3, "--ep", ep).code == 0, ep


def test_trtllm_refusal_words_its_own_rule():
    """Before: 'a server must be whole nodes or an even share of one' under TensorRT-LLM too, though its Mapping
    (node_rank = rank // gpus_per_node, tensorrt_llm/mapping.py @b35ac1b6) starts a server that spans nodes from a
    node boundary (straddling_server); the --ep list is the ep values that predicate accepts."""
    from llmplan.specs.check import dp_attention_nodes_message
    from llmplan.specs.cluster import ClusterSpec
    from llmplan.specs.serve import ServePlan
    from llmplan.specs.registry import builtin_systems

    cluster = ClusterSpec(system=builtin_systems()["dgx-h100"], num_nodes=9)
    plan = ServePlan(tp=1, pp=1, dp=72, ep=36, dp_attention=True)
    msg = dp_attention_nodes_message(plan, cluster, "trtllm")
    assert "each server that spans nodes must start at a node boundary" in msg, msg
    assert "even share of one" not in msg and "use --ep 2, 4, 8, 24, 72 on these 72 GPUs" in msg, msg
    sglang = dp_attention_nodes_message(plan, cluster, "sglang")
    assert "whole nodes (ep a multiple of 8) or an even share of one (ep dividing 8)" in sglang
    assert "start at a node boundary" not in sglang


def _notes(script: str) -> str:
    """The script's comment lines, each note on one line (the export wraps them with '#   ')."""
    return re.sub(r"\n#   ", " ", script)


DPA = ("--model", "qwen3-30b-a3b", "--dp-attention", "--moe-dispatcher", "deepep")


@pytest.mark.parametrize("target,nodes,dp,ep,groups", [("vllm", "4", "32", "16", 2), ("sglang", "4", "32", "16", 2),
                                                        ("sglang", "1", "8", "4", 1)])
def test_several_servers_notes_say_one_head_address_a_group(cli, tmp_path: Path, target, nodes, dp, ep, groups):
    """Before: the per-node script laid out the servers and the one-command note still said 'start this command on
    each group of N GPUs'; with several servers over nodes, the node note said 'HEAD_ADDR the same on all'."""
    s = _notes(_export(cli, tmp_path, f"{target}{nodes}", target, *DPA, "--nodes", nodes, "--dp", dp, "--ep", ep,
                       "--engine", target))
    assert "start this command on each group" not in s and "HEAD_ADDR the same on all" not in s, s
    if groups > 1:
        assert (f"# {groups} DP-attention servers of {ep} GPUs (2 nodes each), independent servers as priced: start "
                "this script on each group of nodes, HEAD_ADDR that group's node 0,") in s, s
        assert "HEAD_ADDR that server's node 0 on all" in s, s
    else:
        assert "# 2 DP-attention servers of 4 GPUs, 2 on a node: each command is one server" in s, s


def test_a_server_that_dies_ends_the_node_script_with_its_status(cli, tmp_path: Path):
    """Before: the servers of a node ended in a plain `wait`, which returns 0 however they exited. A stand-in for
    python on PATH: the server at --base-gpu-id 4 exits 3 at once, the other after a moment with 0."""
    s = _export(cli, tmp_path, "dpa4", "sglang", *DPA, "--nodes", "1", "--dp", "8", "--ep", "4", "--engine", "sglang")
    script, bin_dir = tmp_path / "run.sh", tmp_path / "bin"
    script.write_text(s)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/bin/bash\ncase " $* " in *" --base-gpu-id 4 "*) exit 3 ;; esac\nsleep 0.5\n')
    (bin_dir / "python").chmod(0o755)
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.returncode == 3, (r.returncode, r.stderr)


def test_every_node_script_parses(cli, tmp_path: Path):
    for target, args in (("vllm", ("--nodes", "4", "--dp", "32", "--ep", "16")),
                         ("sglang", ("--nodes", "4", "--dp", "32", "--ep", "16")),
                         ("sglang", ("--nodes", "1", "--dp", "8", "--ep", "2"))):
        script = tmp_path / f"{target}.sh"
        script.write_text(_export(cli, tmp_path, f"{target}{args[3]}", target, *DPA, *args, "--engine", target))
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
