"""A seeded fuzz test of the console entry point: generated flags and generated spec, hardware, plan and lock
files. Any exit other than 0 / 2 / 3 (1 for `check` and `lock` failing a check), any "internal error", or any
call over 10 s fails (issue "Every bad input gets a clear answer")."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PLANS = Path(__file__).resolve().parent / "data" / "plans"

NUMBERS = st.one_of(
    st.integers(-3, 20), st.sampled_from([0, 1, 2, 3, 4, 7, 8, 16, 64, 126, 4096, 10**9, 10**20, 10**40, -1]),
    st.sampled_from(["inf", "-inf", "nan", "1e400", "abc", "", "1.5", "0x10", "8GiB", "1e-300", "٣"]),
)
NAMES = st.one_of(st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b",
                                   "qwen3-30b-a3b", "llama-3.1-405b"]),
                  st.sampled_from(["nope", "", "../x.yaml", "dgx-h100"]))
SYSTEMS = st.one_of(st.sampled_from(["dgx-h100", "dgx-a100", "gb200-nvl72", "l40s-8", "dgx-h800"]),
                    st.sampled_from(["nope", "h100-sxm", ""]))
TRAIN_FLAGS = ["--tp", "--pp", "--dp", "--cp", "--ep", "--etp", "--vpp", "--zero", "--micro-batch", "--global-batch",
               "--seq-len", "--pp-first-layers", "--pp-last-layers", "--overhead-gib", "--fragmentation"]
INFER_FLAGS = ["--tp", "--pp", "--ep", "--input-len", "--output-len", "--ttft-slo", "--tpot-slo", "--prefix-hit-rate",
               "--gpu-memory-utilization", "--block-size", "--max-num-batched-tokens", "--overhead-gib"]
FLAGS_FOR = {"estimate": TRAIN_FLAGS, "search": TRAIN_FLAGS + ["--top", "--max-tp", "--max-pp", "--min-headroom",
                                                               "--batch-tokens", "--train-tokens"],
             "estimate-infer": INFER_FLAGS + ["--batch"], "search-infer": INFER_FLAGS + ["--top", "--max-batch"],
             "collective": ["--gpus", "--size", "--gpus-per-node"], "check": ["--min-headroom", "--tolerance"],
             "lock": ["--nodes", "--global-batch", "--seq-len"], "export": [], "models": [], "hardware": []}
FLAGS = ["--tp", "--pp", "--dp", "--cp", "--ep", "--etp", "--vpp", "--zero", "--micro-batch", "--global-batch",
         "--seq-len", "--nodes", "--gpus-per-node", "--pp-first-layers", "--pp-last-layers", "--overhead-gib",
         "--fragmentation", "--batch", "--input-len", "--output-len", "--ttft-slo", "--tpot-slo",
         "--prefix-hit-rate", "--gpu-memory-utilization", "--block-size", "--max-num-batched-tokens", "--top",
         "--max-tp", "--max-pp", "--min-headroom", "--size", "--gpus", "--batch-tokens", "--train-tokens"]
WORDS = st.sampled_from(["--recompute", "--dtype", "--mode", "--objective", "--axis-order", "--pp-layers", "--op",
                         "--algorithm", "--to", "--format", "--kv-dtype", "--grad-dtype"])
WORD_VALUES = st.sampled_from(["none", "full", "selective", "bf16", "fp8", "fp4", "infer", "train", "throughput",
                               "min-gpus", "tp-cp-ep-dp-pp", "pp-tp", "7,8,8,7", "0,32", "all-reduce", "x",
                               "megatron", "all", "json", "github", ""])
SWITCHES = st.sampled_from(["--sp", "--no-sp", "--json", "--explain", "--no-cp", "--tp-comm-overlap",
                            "--ep-comm-overlap", "--no-flash-attention", "--force", "--account-for-embedding-in-pipeline-split"])

KEYS = ["name", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "vocab_size", "max_position_embeddings", "num_experts", "num_experts_per_tok",
        "base", "gpu", "gpus_per_node", "nics_per_node", "nic_gbit_per_s", "hbm_gib", "tflops", "kind", "schema",
        "plan", "model", "hardware", "nodes", "predictions", "tp", "mode", "job"]
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.sampled_from([10**30, -5, 0]),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
DOCS = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                    st.dictionaries(st.sampled_from(KEYS), inner, max_size=6)),
                    max_leaves=20)


def plan_edits():
    """A valid plan file with one value replaced somewhere."""
    return st.tuples(st.sampled_from(sorted(p.name for p in PLANS.glob("*.json"))),
                     st.sampled_from(["plan", "model", "hardware", "predictions", "job", "nodes", "schema", "kind",
                                      "allowance", "axis_order"]),
                     st.one_of(LEAVES, DOCS))


@st.composite
def command_lines(draw, folder: Path):
    kind = draw(st.sampled_from(["estimate", "search", "estimate-infer", "search-infer", "export", "check", "lock",
                                 "collective", "models", "hardware"]))
    args: list[str] = []
    target = folder / f"f{draw(st.integers(0, 10**9))}"
    use_file = draw(st.sampled_from(["none", "spec", "hardware", "plan"]))
    if use_file == "plan":
        name, key, value = draw(plan_edits())
        doc = json.loads((PLANS / name).read_text())
        doc[key] = value
        path = target.with_suffix(".json")
        path.write_text(json.dumps(doc, allow_nan=True))
    elif use_file != "none":
        path = target.with_suffix(draw(st.sampled_from([".yaml", ".json"])))
        data = draw(DOCS)
        path.write_text(json.dumps(data, allow_nan=True) if path.suffix == ".json" else json.dumps(data))
    else:
        path = None
    if kind in ("estimate", "search", "estimate-infer", "search-infer"):
        args = [kind.split("-")[0], "--model", str(path) if use_file == "spec" else draw(NAMES),
                "--hardware", str(path) if use_file == "hardware" else draw(SYSTEMS)]
        if kind.endswith("infer"):
            args += ["--mode", "infer"]
        if kind.startswith("search"):
            args += ["--nodes", str(draw(st.sampled_from([1, 2, 4])))]
    elif kind == "export":
        args = ["export", str(path or PLANS / "dense_train.json"), "--to", draw(st.sampled_from(["megatron", "all",
                                                                                                   "vllm", "x"])),
                "-o", str(folder / "out")]
    elif kind == "check":
        args = ["check", str(path or PLANS), "--format", "json"]
    elif kind == "lock":
        args = ["lock", "--plans", str(folder / "locked")]
    elif kind == "collective":
        args = ["collective", "--hardware", draw(SYSTEMS)]
    else:
        args = [kind]
    for _ in range(draw(st.integers(0, 4))):
        choice = draw(st.integers(0, 5))
        if choice <= 2 and FLAGS_FOR[kind]:
            args += [draw(st.sampled_from(FLAGS_FOR[kind])), str(draw(NUMBERS))]
        elif choice == 3:
            args += [draw(st.sampled_from(FLAGS)), str(draw(NUMBERS))]
        elif choice == 4:
            args += [draw(WORDS), draw(WORD_VALUES)]
        else:
            args.append(draw(SWITCHES))
    return kind, args


def _alarm(signum, frame):
    raise TimeoutError("llmplan call over 10 s")


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_command_line_ends_cleanly(cli, tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("fuzz")
    kind, args = data.draw(command_lines(folder))
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(10)
    t0 = time.perf_counter()
    try:
        r = cli(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    allowed = {0, 2, 3} | ({1} if kind in ("check", "lock") else set())
    assert r.code in allowed, (args, r.code, r.err[-500:])
    assert "internal error" not in r.err + r.out, (args, r.err[-500:])
    assert time.perf_counter() - t0 < 10
    if "--json" in args and r.out.strip():
        json.loads(r.out)
