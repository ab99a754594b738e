"""Bad input, polish round (branch bad-input): a spec file's bad enum value in llmplan's words, the --help hint of
an option given no value naming its command, the serving router script's metrics port and address count, the
SGLang Rust-server path (no longer refused, bi-mend), and plan flags named in bound errors. Each case runs the
real CLI (or the exported script under bash) and checks the exact line and exit code 2.

Launcher facts the tests check, from the launchers' sources:
- SGLang's router takes --prometheus-port, default 29000 (sgl-project/sglang @083d6013,
  sgl-router/py_src/sglang_router/router_args.py, add_cli_args).
- SGLang, DP attention over nodes: port_base = dist-init port + 1 and, on the Rust-server path
  (SGLANG_RUST_SERVER), DP rank r's scheduler-input port port_base + 6 + r (python/sglang/srt/server_args.py,
  PortArgs.init_new); the DP handshake at the dist-init port + 13 (DP_ATTENTION_HANDSHAKE_PORT_DELTA,
  managers/data_parallel_controller.py), but its REP socket is closed in a `finally:` before the schedulers
  spawn (_broadcast_ports_as_server), and the Rust path has no DP controller (PortArgs.init_new): the two never
  hold one port at once, so the script does not refuse the Rust path (bi-mend)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from serve_scripts import export_serving, run_with_stand_ins

ROOT = Path(__file__).resolve().parents[1]
DPA = ("--model", "qwen3-30b-a3b", "--dp-attention", "--moe-dispatcher", "deepep")
STAND_IN = '#!/bin/bash\nf=$(mktemp "$RECORDS/run.XXXXXX")\nprintf \'%s\\0\' "$@" > "$f"\n'


def _one_line(r, needle: str) -> None:
    assert r.code == 2, (r.code, r.err[-600:])
    assert "Traceback" not in r.err and "internal error" not in r.err, r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.err


def _edited(tmp_path: Path, src: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text
    out = tmp_path / src.name
    out.write_text(text.replace(old, new, 1))
    return out


# ---- (1) a spec file's enum field: field, value, the values allowed, the line to write (before: pydantic's
# "Input should be 'rmsnorm' or 'layernorm'")

def test_a_model_spec_with_a_misspelt_norm_type_names_the_values_and_the_fix(cli, tmp_path: Path):
    spec = _edited(tmp_path, ROOT / "model_specs" / "llama-3.1-8b.yaml", "model_type: llama",
                   "model_type: llama\nnorm_type: rmsnrm")
    r = cli("estimate", "-m", spec, "--hardware", "dgx-h100")
    _one_line(r, f"{spec}: field 'norm_type': rmsnrm is not allowed: it must be one of rmsnorm, layernorm; "
                 "set norm_type: rmsnorm")


@pytest.mark.parametrize("profile,line", [
    # an unknown fabric lists the fabrics
    ("intra_node_fabric: zzz", "field 'intra_node_fabric': zzz is not allowed: it must be one of nvswitch, "
                               "nvlink-mesh, infinity-fabric, pcie; set intra_node_fabric: one of them"),
    # a bad item of a list field is replaced, not set
    ("gpu:\n  kernels: [flash_atention, mla]", "field 'gpu.kernels.0': flash_atention is not allowed: it must be one "
                                              "of flash_attention, mla, grouped_gemm, fp8_gemm, fp4_gemm, "
                                              "fused_norm, fused_rope; replace it with flash_attention"),
], ids=["unknown-fabric", "bad-list-item"])
def test_a_system_profiles_bad_value_names_the_values_and_the_fix(cli, tmp_path: Path, profile: str, line: str):
    prof = tmp_path / "s.yaml"
    prof.write_text(f"base: dgx-h100\n{profile}\n")
    r = cli("estimate", "-m", "llama-3.1-8b", "--hardware", prof)
    _one_line(r, f"{prof}: {line}")


def test_a_saved_plan_with_a_bad_grad_reduce_says_which_to_write(cli, tmp_path: Path):
    plan = tmp_path / "p.yaml"
    assert cli("estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", plan).code == 0
    (tmp_path / "edited").mkdir()
    bad = _edited(tmp_path / "edited", plan, "grad_reduce: reduce-scatter", "grad_reduce: reduce_scatter")
    r = cli("estimate", "--plan", bad)
    _one_line(r, "field 'grad_reduce': reduce_scatter is not allowed: it must be one of reduce-scatter, all-reduce; "
                 "set grad_reduce: reduce-scatter")


# ---- (2) an option given no value: the hint names the command's --help

@pytest.mark.parametrize("command,flag", [("search", "--model"), ("estimate", "--tp"), ("export", "--to")])
def test_an_option_without_its_value_points_at_the_commands_help(cli, command, flag):
    r = cli(command, flag)
    _one_line(r, f"Option '{flag}' requires an argument; 'llmplan {command} --help' lists the commands and options")


def test_an_unknown_command_still_points_at_the_top_help(cli):
    _one_line(cli("nosuch", "--model"), "No such command 'nosuch'; 'llmplan --help' lists")


# ---- (3) serving scripts: the router's metrics port, the address count, SGLang's Rust-server path

def _run(script: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    r, records = run_with_stand_ins(script, tmp_path, STAND_IN, {"HEAD_ADDR": "10.0.0.1", "MODEL": "m", **env})
    return r, [f.read_bytes().decode().split("\0")[:-1] for f in records.iterdir()]


@pytest.fixture
def co_located(cli, tmp_path: Path) -> Path:
    """4 SGLang DP-attention servers of 4 GPUs, 2 on each of 2 nodes: --port PORT and PORT + 1000 (the
    servers' step) on a node, and a router script."""
    return export_serving(cli, tmp_path, "co", "sglang", *DPA, "--nodes", "2", "--dp", "16", "--ep", "4")


def test_the_router_gives_its_metrics_port_sglangs_default(co_located: Path, tmp_path: Path):
    r, runs = _run(co_located / "sglang_router.sh", tmp_path, NODE_ADDRS="10.0.1.1 10.0.1.2")
    assert r.returncode == 0 and len(runs) == 1, r.stderr
    argv = runs[0]
    assert argv[argv.index("--prometheus-port") + 1] == "29000"


@pytest.mark.parametrize("env,line", [
    ({"PROMETHEUS_PORT": "8080"}, "PROMETHEUS_PORT=8080: the router's metrics port must differ from ROUTER_PORT=8080"
                                  " and from a server's port (30000 to 31243 on a node) and its gRPC ports at "
                                  "--port+10000 (40000 to 41000); set PROMETHEUS_PORT from 1024 to 65535 outside "
                                  "those"),
    ({"PROMETHEUS_PORT": "30500"}, "PROMETHEUS_PORT=30500: the router's metrics port must differ from "
                                   "ROUTER_PORT=8080 and from a server's port (30000 to 31243 on a node)"),
    ({"PROMETHEUS_PORT": "29000", "ROUTER_PORT": "29000"}, "PROMETHEUS_PORT=29000: the router's metrics port must "
                                                           "differ from ROUTER_PORT=29000"),
    ({"PROMETHEUS_PORT": "70000"}, "PROMETHEUS_PORT=70000: the router's metrics port"),
    ({"PROMETHEUS_PORT": "029000"}, "PROMETHEUS_PORT=029000 is not a port number (1 to 5 digits, no leading 0)"),
])
def test_the_routers_metrics_port_is_checked_against_the_other_ports(co_located: Path, tmp_path: Path, env, line):
    r, runs = _run(co_located / "sglang_router.sh", tmp_path, NODE_ADDRS="10.0.1.1 10.0.1.2", **env)
    assert r.returncode == 2 and runs == [] and len(r.stderr.splitlines()) == 1, r.stderr
    assert line in r.stderr, r.stderr


def test_one_address_given_is_one_address_not_1_addresses(co_located: Path, tmp_path: Path):
    r, runs = _run(co_located / "sglang_router.sh", tmp_path, NODE_ADDRS="10.0.1.1")
    assert r.returncode == 2 and runs == [], r.stderr
    assert r.stderr.splitlines() == ["NODE_ADDRS names 1 address; give the 2 addresses of each node the serve "
                                     "script runs on, in NODE_RANK order"]


def test_a_router_of_servers_on_one_node_asks_for_the_one_address(cli, tmp_path: Path):
    out = export_serving(cli, tmp_path, "one", "sglang", *DPA, "--nodes", "1", "--dp", "8", "--ep", "4")
    r, runs = _run(out / "sglang_router.sh", tmp_path, NODE_ADDRS="10.0.1.1 10.0.1.2")
    assert r.returncode == 2 and runs == [], r.stderr
    assert r.stderr.splitlines()[0].startswith("NODE_ADDRS names 2 addresses; give the one address of ")


@pytest.fixture
def over_nodes(cli, tmp_path: Path) -> Path:
    """One SGLang DP-attention server of 16 DP ranks over 2 nodes (--dist-init-addr HEAD:DIST_PORT)."""
    return export_serving(cli, tmp_path, "dist", "sglang", *DPA, "--nodes", "2", "--dp", "16", "--ep", "16")


@pytest.mark.parametrize("env", [{}, {"SGLANG_RUST_SERVER": "0"}, {"SGLANG_RUST_SERVER": "1"},
                                 {"SGLANG_RUST_SERVER": "TRUE"}, {"SGLANG_RUST_SERVER": "yes"}])
def test_the_rust_server_path_is_not_refused(over_nodes: Path, tmp_path: Path, env):
    """16 DP ranks over nodes start whatever SGLANG_RUST_SERVER says: the DP handshake's REP socket at the
    dist-init port + 13 is closed in a `finally:` before the schedulers start
    (DataParallelController._broadcast_ports_as_server), so a DP rank's port reaching + 13 takes a free port;
    on the Rust path there is no DP controller at all (PortArgs.init_new). Before (bi-mend) the script
    stopped with exit 2 for 7 or more ranks."""
    script = over_nodes / "sglang_serve.sh"
    assert "RUST_SERVER" not in script.read_text()
    r, runs = _run(script, tmp_path, NODE_RANK="0", **env)
    assert r.returncode == 0 and len(runs) == 1, r.stderr


# ---- (4) malformed inputs of the polish round

@pytest.mark.parametrize("args,line", [
    (("--gpus-per-node", "16"), "cluster options: gpus_per_node (16) exceeds the 8 GPUs of a dgx-h100 node; use 8 or "
                                "fewer GPUs per node"),
    (("--seq-len", "100000000000"), "plan options: --seq-len 100000000000: Input should be less than or equal to "
                                    "1073741824; give --seq-len 1073741824 or less"),
    (("--tp", "100000000"), "plan options: --tp 100000000: Input should be less than or equal to 65536; give --tp "
                            "65536 or less"),
    (("--global-batch", "100000000000"), "plan options: --global-batch 100000000000: Input should be less than or "
                                         "equal to 1073741824; give --global-batch 1073741824 or less"),
])
def test_a_plan_flag_past_its_bound_is_named_with_its_fix(cli, args, line):
    r = cli("estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", *args)
    assert r.code == 2 and r.err.strip().splitlines() == [f"error: {line}"], r.err


def test_a_derived_global_batch_is_not_blamed_on_its_flag(cli):
    r = cli("estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--micro-batch", "100000000000")
    assert r.code == 2 and "--micro-batch 100000000000" in r.err and "--global-batch" not in r.err, r.err


def test_an_output_folder_that_cannot_be_made_says_the_fix(cli, tmp_path: Path):
    plan = tmp_path / "p.json"
    assert cli("estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", plan).code == 0
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = cli("export", plan, "--to", "torchrun", "-o", blocker / "sub")
    _one_line(r, f"cannot create folder {blocker / 'sub'}: Not a directory; give an output folder in a place you "
                 "can write to")


@pytest.mark.parametrize("content,needle", [
    (b"", "is empty: llmplan reads a YAML mapping"),
    (b"\xff\xfe\x00bad", "is not UTF-8 text (byte 0xff at offset 0); save it as UTF-8 JSON or YAML"),
    (b"- a\n- b\n", "expected a mapping of keys to values at the top level, got a list"),
    (b"name: x\n\thidden: 3\n", "not valid YAML"),
])
@pytest.mark.parametrize("command", ["estimate-model", "estimate-plan", "export", "search-hardware"])
def test_malformed_files_on_every_command_are_one_line(cli, tmp_path: Path, content, needle, command):
    f = tmp_path / "bad.yaml"
    f.write_bytes(content)
    args = {"estimate-model": ("estimate", "-m", f, "--hardware", "dgx-h100"),
            "estimate-plan": ("estimate", "--plan", f),
            "export": ("export", f, "--to", "vllm", "-o", tmp_path / "out"),
            "search-hardware": ("search", "-m", "llama-3.1-8b", "--hardware", f, "--mode", "infer")}[command]
    _one_line(cli(*args), needle)


def test_a_folder_given_as_a_plan_is_one_line(cli, tmp_path: Path):
    d = tmp_path / "plan.yaml"
    d.mkdir()
    _one_line(cli("estimate", "--plan", d), "is a folder, not a regular file; give a spec, profile or plan file")


@pytest.mark.parametrize("flag", ["--input-len", "--output-len"])
def test_a_request_length_past_its_bound_names_its_flag(cli, flag):
    r = cli("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", flag, "99999999999")
    _one_line(r, f"inference workload options: {flag} 99999999999: Input should be less than or equal to 1073741824; "
                 f"give {flag} 1073741824 or less")


def test_an_empty_length_distribution_is_not_read_as_the_current_folder(cli):
    """Before: Path("") is ".", which exists, so the empty value was read as a histogram file: ". is a folder"."""
    r = cli("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--input-len-dist", "")
    _one_line(r, "--input-len-dist '': not lognormal:mean=M,sigma=S, a trace shape")


def test_an_empty_plan_path_says_it_named_the_current_folder(cli, tmp_path: Path):
    _one_line(cli("export", "", "--to", "vllm", "-o", tmp_path / "o"),
              "'.' (the current folder; an empty path '' names it too) is a folder, not a regular file")


@pytest.mark.parametrize("size,line", [
    ("1e400", "--size '1e400' is beyond anything llmplan plans for (below 1e+18 bytes); give a smaller size, e.g. "
              "1TiB"),
    ("-5", "--size '-5' is not a positive size; write e.g. 1GiB, 256MiB, 64KB or 4e9 (bytes)"),
])
def test_a_collective_size_error_names_the_flag(cli, size, line):
    _one_line(cli("collective", "--op", "all-reduce", "--hardware", "dgx-h100", "--size", size), line)
