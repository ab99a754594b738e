"""Bad input, mend round (branch bi-mend), each case through the real CLI (or the exported script under bash),
checking the exact line and the exit code:

- a spec file's bad key of a mapping whose keys are an enum (GpuSpec.tflops: bf16, fp8, ...;
  attention_release_efficiency: cudnn-9.x) names the mapping and the key to rename (before: field
  'gpu.tflops.bf17.[key]' ... set [key]: bf16);
- a value outside an enum is shown so that it reads: quoted where empty, blank at an end or holding a control
  character (a line break split the one line), a cut marked '...', and the fix found ignoring case and blanks;
- the SGLang router's ROUTER_PORT / PROMETHEUS_PORT avoid every server's derived ports (--port + 240 + ranks - 1,
  PortArgs.init_new, see serve_nodes.SGLANG_PORT) and the prefill servers' bootstrap ports;
- search's --seq-len / --global-batch bound errors name the flag, as estimate's;
- a saved serving plan whose engine is a list or a mapping is one line, exit 2 (before: TypeError, exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from serve_scripts import export_serving, run_with_stand_ins

ROOT = Path(__file__).resolve().parents[1]
DPA = ("--model", "qwen3-30b-a3b", "--dp-attention", "--moe-dispatcher", "deepep")
STAND_IN = '#!/bin/bash\nf=$(mktemp "$RECORDS/run.XXXXXX")\nprintf \'%s\\0\' "$@" > "$f"\n'
TFLOPS = "fp32, tf32, bf16, fp16, fp8, mxfp8, fp4, mxfp4"


def _line(r) -> str:
    """The one line of a bad-input exit (code 2, no traceback)."""
    assert r.code == 2, (r.code, r.err[-600:])
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.err, r.err
    return lines[0]


# ---- a bad key of an enum-keyed mapping

@pytest.mark.parametrize("gpu,line", [
    ("tflops: {bf17: 900}", f"field 'gpu.tflops': bf17 is not allowed: it must be one of {TFLOPS}; rename key "
                            "bf17 to bf16"),
    ("attention_release_efficiency: {cudnn-9.9: 0.5}",
     "field 'gpu.attention_release_efficiency': cudnn-9.9 is not allowed: it must be one of cudnn-9.1, cudnn-9.4, "
     "cudnn-9.19; rename key cudnn-9.9 to cudnn-9.19"),
    ("tflops: {zzzz: 900}", f"field 'gpu.tflops': zzzz is not allowed: it must be one of {TFLOPS}; rename key "
                            "zzzz to one of them"),
])
def test_a_bad_key_of_a_profile_mapping_is_renamed(cli, tmp_path: Path, gpu: str, line: str):
    prof = tmp_path / "s.yaml"
    prof.write_text(f"base: dgx-h100\ngpu:\n  {gpu}\n")
    assert _line(cli("estimate", "-m", "llama-3.1-8b", "--hardware", prof)) == f"error: {prof}: {line}"


# ---- an enum value shown so that it reads

@pytest.mark.parametrize("value,shown,fix", [
    ("rms\nnorm", r"'rms\nnorm'", "rmsnorm"),
    ("", "''", "one of them"),
    ("rmsnorm ", "'rmsnorm '", "rmsnorm"),
    ("RMSNorm", "RMSNorm", "rmsnorm"),
    (" LayerNorm", "' LayerNorm'", "layernorm"),
    ("x" * 200, "x" * 57 + "...", "one of them"),
])
def test_a_bad_enum_value_reads_on_one_line(cli, tmp_path: Path, value: str, shown: str, fix: str):
    spec = yaml.safe_load((ROOT / "model_specs" / "llama-3.1-8b.yaml").read_text())
    spec["norm_type"] = value
    path = tmp_path / "m.json"
    path.write_text(json.dumps(spec))
    line = _line(cli("estimate", "-m", path, "--hardware", "dgx-h100"))
    assert line == (f"error: {path}: field 'norm_type': {shown} is not allowed: it must be one of rmsnorm, "
                    f"layernorm; set norm_type: {fix}")


def test_an_enum_flag_in_another_case_gets_the_value_to_give(cli):
    line = _line(cli("estimate", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--mode", "INFER"))
    assert line == "error: --mode INFER: it must be one of train, infer; give --mode infer"


# ---- the router's ports against the servers' derived and bootstrap ports

def _router(folder: Path, tmp_path: Path, **env: str):
    return run_with_stand_ins(folder / "sglang_router.sh", tmp_path, STAND_IN, {"MODEL": "m", **env})


@pytest.fixture
def co_located(cli, tmp_path: Path) -> Path:
    """4 SGLang DP-attention servers of 4 ranks, 2 a node: --port 30000 and 31000, each deriving ports to
    --port + 240 + 4 - 1 (31243 the last)."""
    return export_serving(cli, tmp_path, "co", "sglang", *DPA, "--nodes", "2", "--dp", "16", "--ep", "4")


@pytest.mark.parametrize("var", ["PROMETHEUS_PORT", "ROUTER_PORT"])
@pytest.mark.parametrize("port,ok", [("31234", False), ("31243", False), ("31244", True), ("29999", True)])
def test_the_routers_ports_avoid_the_servers_derived_ports(co_located: Path, tmp_path: Path, var, port, ok):
    r, records = _router(co_located, tmp_path, NODE_ADDRS="10.0.1.1 10.0.1.2", **{var: port})
    if ok:
        assert r.returncode == 0 and len(list(records.iterdir())) == 1, r.stderr
        return
    assert r.returncode == 2 and list(records.iterdir()) == [], r.stderr
    what = ("the router's metrics port must differ from ROUTER_PORT=8080 and from" if var == "PROMETHEUS_PORT"
            else "the router must not take")
    assert r.stderr.splitlines() == [f"{var}={port}: {what} a server's port (30000 to 31243 on a node) and its gRPC "
                                     f"ports at --port+10000 (40000 to 41000); set {var} from 1024 to 65535 outside "
                                     "those"]


@pytest.fixture
def prefill(cli, tmp_path: Path) -> Path:
    """A prefill pool of 4 SGLang DP-attention servers of 2 ranks on one node: --port 30000 + 1000 j, bootstrap
    ports 8998 to 9001."""
    return export_serving(cli, tmp_path, "pre", "sglang", *DPA, "--nodes", "1", "--dp", "8", "--ep", "2",
                          "--phase", "prefill")


@pytest.mark.parametrize("var", ["PROMETHEUS_PORT", "ROUTER_PORT"])
@pytest.mark.parametrize("port", ["8998", "9001"])
def test_the_routers_ports_avoid_the_bootstrap_ports(prefill: Path, tmp_path: Path, var, port):
    r, records = _router(prefill, tmp_path, NODE_ADDRS="10.0.1.1", OTHER_POOL="--decode http://d:1", **{var: port})
    assert r.returncode == 2 and list(records.iterdir()) == [], r.stderr
    what = ("the router's metrics port must differ from ROUTER_PORT=8080 and from" if var == "PROMETHEUS_PORT"
            else "the router must not take")
    assert r.stderr.splitlines() == [f"{var}={port}: {what} a server's port (30000 to 33241 on a node), its gRPC "
                                     "ports at --port+10000 (40000 to 43000) and a bootstrap port (8998 to 9001); "
                                     f"set {var} from 1024 to 65535 outside those"]


def test_a_router_port_beside_the_bootstrap_ports_runs(prefill: Path, tmp_path: Path):
    r, records = _router(prefill, tmp_path, NODE_ADDRS="10.0.1.1", OTHER_POOL="--decode http://d:1",
                         PROMETHEUS_PORT="9002")
    assert r.returncode == 0 and len(list(records.iterdir())) == 1, r.stderr


# ---- search's plan flags named in bound errors

@pytest.mark.parametrize("flag", ["--seq-len", "--global-batch"])
def test_search_names_the_flag_of_a_value_over_its_bound(cli, flag: str):
    line = _line(cli("search", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", flag, "100000000000"))
    assert line == (f"error: workload options: {flag} 100000000000: Input should be less than or equal to "
                    f"1073741824; give {flag} 1073741824 or less")


# ---- a saved serving plan's engine of the wrong type

@pytest.mark.parametrize("engine,shown,fix", [(["vllm"], "['vllm']", "vllm"), ({"a": 1}, "{'a': 1}", "one of them")])
def test_a_plan_files_engine_of_the_wrong_type_is_one_line(cli, tmp_path: Path, engine, shown: str, fix: str):
    plan = tmp_path / "p.json"
    assert cli("estimate", "--mode", "infer", "-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--save",
               plan).code == 0
    doc = json.loads(plan.read_text())
    doc["job"]["engine"] = engine
    plan.write_text(json.dumps(doc))
    line = _line(cli("export", plan, "--to", "vllm", "-o", tmp_path / "out"))
    assert line == (f"error: {plan} (job): field 'engine': {shown} is not allowed: it must be one of vllm, trtllm, "
                    f"sglang; set engine: {fix}")
