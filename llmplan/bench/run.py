"""`llmplan bench`: build the benchmark from a plan, start torchrun for one node, watch the ranks, and hold
what they measured against llmplan's predictions. This side does not import torch (the workers do)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypedDict

from llmplan.cost.compute import attention_head_dims
from llmplan.errors import LlmplanError
from llmplan.specs.model import ModelSpec
from llmplan.specs.plan import ClusterSpec, ParallelPlan
from llmplan.units import GIB

COMPONENTS = ("gemm", "collectives", "layer", "attention")
OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")



def require_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        raise LlmplanError("llmplan bench needs torch, which is not installed: pip install 'llmplan[bench]'")


@dataclass(frozen=True)
class BenchConfig:
    model: ModelSpec
    plan: ParallelPlan
    cluster: ClusterSpec
    nproc: int
    backend: str
    components: tuple[str, ...]
    sizes: tuple[int, ...]
    timeout_s: float
    gemm_tokens: int | None = None


class LayerDims(TypedDict):
    """The reference layer's shape as the bench report writes it (layer_shape): sequence and micro-batch per
    rank, width, heads, KV heads, head dimension, FFN width, and whether the MLP is gated."""

    s: int
    b: int
    h: int
    a: int
    kv: int
    d: int
    f: int
    gated: bool


def layer_shape(cfg: BenchConfig) -> LayerDims:
    m, p = cfg.model, cfg.plan
    return {"s": p.seq_len // p.cp, "b": p.micro_batch, "h": m.hidden_size, "a": m.num_attention_heads,
            "kv": m.kv_heads, "d": m.d_head, "f": m.intermediate_size if m.num_dense_layers else m.expert_ffn,
            "gated": m.gated_mlp}


def gemm_shapes(cfg: BenchConfig) -> list[dict[str, Any]]:
    """The matmuls of one rank at the plan's shapes: M tokens x K reduction x N outputs."""
    m, p = cfg.model, cfg.plan
    t = p.tp
    T = p.seq_len // p.cp * p.micro_batch
    if cfg.gemm_tokens:
        T = min(T, cfg.gemm_tokens)
    heads, kvh = m.num_attention_heads // t, max(m.kv_heads // t, 1)
    f = m.intermediate_size if m.num_dense_layers else m.expert_ffn
    c = 2 if m.gated_mlp else 1
    out = [
        {"name": "qkv", "m": T, "k": m.hidden_size, "n": (heads + 2 * kvh) * m.d_head},
        {"name": "attention-out", "m": T, "k": heads * m.d_head, "n": m.hidden_size},
        {"name": "mlp-up", "m": T, "k": m.hidden_size, "n": c * f // t},
        {"name": "mlp-down", "m": T, "k": f // t, "n": m.hidden_size},
        {"name": "logits", "m": T, "k": m.hidden_size, "n": -(-m.vocab_size // t)},
    ]
    if m.is_moe:
        rows = max(1, T * m.num_experts_per_tok * p.ep // m.num_experts)
        out.append({"name": "expert-up", "m": rows, "k": m.hidden_size, "n": c * m.expert_ffn // p.etp_resolved})
    return out


ATTENTION_KERNELS = {"nccl": ("native", "flash2"), "gloo": ("default",)}
"""The fused kernels timed on GPUs (PyTorch SDPA's cuDNN backend = llmplan's native kernel on Hopper and
later, its flash backend = FlashAttention-2); on CPU whatever SDPA picks, for the plumbing only."""


def attention_cases(cfg: BenchConfig) -> list[dict[str, Any]]:
    """One rank's causal attention at the plan's shape (heads / tp, tokens / cp, the micro-batch) and the model's
    head dimensions, plus the same heads x head-dim width at head dim 128 (64 where the model has 128): the
    pair measures the kernel's head-dimension curve (cost.attention_rate.head_dim_attention_ratio)."""
    m, p = cfg.model, cfg.plan
    qk, v = attention_head_dims(m)
    a, kv = max(m.num_attention_heads // p.tp, 1), max(m.kv_heads // p.tp, 1)
    s, b = p.seq_len // p.cp, p.micro_batch
    ref = 64 if (qk, v) == (128, 128) else 128
    width = a * (qk + v) // 2
    a_ref = max(width // ref, 1)
    kv_ref = max(a_ref * kv // a, 1) if a_ref % max(a_ref * kv // a, 1) == 0 else a_ref
    return [{"name": "model", "b": b, "a": a, "kv": kv, "s": s, "qk": qk, "v": v},
            {"name": f"head dim {ref}", "b": b, "a": a_ref, "kv": kv_ref, "s": s, "qk": ref, "v": ref}]


def attention_flops(case: dict[str, Any]) -> float:
    """Forward FLOPs of one causal attention case as llmplan counts them (QK^T and AV, no causal halving)."""
    return 2.0 * case["b"] * case["s"] ** 2 * case["a"] * (case["qk"] + case["v"])


def worker_config(cfg: BenchConfig, out_dir: Path) -> dict[str, Any]:
    gpu = cfg.backend == "nccl"
    return {
        "out_dir": str(out_dir), "backend": cfg.backend, "components": list(cfg.components),
        "gemms": gemm_shapes(cfg), "gemm_dtype": "bfloat16" if gpu else "float32",
        "collectives": list(OPS), "sizes": list(cfg.sizes), "warmup": 1 if not gpu else 3,
        "iters": 3 if not gpu else 10,
        "layer_shape": layer_shape(cfg), "layer_dtype": "bfloat16",
        "layer_cases": [{"recompute": r, "sp": sp} for r in ("none", "selective", "full")
                        for sp in ((False, True) if cfg.nproc > 1 else (False,))],
        "threads": max(1, (os.cpu_count() or 1) // cfg.nproc),
        "attention": attention_cases(cfg), "attention_kernels": list(ATTENTION_KERNELS[cfg.backend]),
        "attention_dtype": "bfloat16" if gpu else "float32",
    }


@dataclass
class RankFailure:
    rank: int
    phase: str
    error: str


@dataclass
class BenchRun:
    ranks: list[dict[str, Any]]
    failures: list[RankFailure] = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0
    startup_s: float | None = None
    """Seconds from launch until every rank had passed init_process_group (None: not all did): the part of
    `seconds` that --timeout does not count (STARTUP_TIMEOUT_S bounds it)."""


STARTUP_TIMEOUT_S = 120.0
"""Seconds the ranks may take to start (torchrun, torch's import, init_process_group on every rank) before the
run is stopped, or --timeout where that is longer. Start-up is slow on a busy machine and is not a hang of a
benchmark; --timeout counts from the end of it, as seconds without progress (no rank entering its next phase)."""


MAX_NPROC = 64
"""Most processes one bench starts (one node: GPUs per node, or CPU cores for gloo)."""
MAX_TIMEOUT_S = 7 * 86400.0
"""Longest --timeout (a week; a bench takes minutes)."""


def check_run_options(nproc: int, timeout_s: float) -> None:
    """A timeout that is a positive number of seconds, and one node's worth of processes."""
    if not math.isfinite(timeout_s) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise LlmplanError(f"--timeout {timeout_s:g}: give seconds above 0 and at most {MAX_TIMEOUT_S:.0f} "
                           "(a week), e.g. --timeout 300")
    if not 1 <= nproc <= MAX_NPROC:
        raise LlmplanError(f"--nproc {nproc}: bench runs on one node, 1 to {MAX_NPROC} processes")


def check_machine(backend: str, nproc: int) -> None:
    """Refuse what would not run here before torchrun starts: more processes than this machine has cores
    (gloo) or GPUs (nccl), nccl without CUDA."""
    if backend == "gloo":
        cores = _cpu_count()
        if nproc > max(cores, 2):
            raise LlmplanError(f"--nproc {nproc}: gloo runs one process per CPU core and this machine has {cores}; "
                               f"use --nproc {max(cores, 2)} or fewer")
        return
    gpus, why = _cuda_gpus()
    if why:
        raise LlmplanError(f"--backend nccl needs CUDA GPUs and a torch build with NCCL: {why}; run on a GPU node, "
                           "or use --backend gloo to run on CPUs")
    if nproc > gpus:
        raise LlmplanError(f"--nproc {nproc}: nccl runs one process per GPU and torch sees {gpus} here; use "
                           f"--nproc {gpus} or fewer")


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cuda_gpus() -> tuple[int, str]:
    """(GPUs torch sees, why nccl cannot run or ''), asked of a child Python so this side never imports torch."""
    probe = ("import torch, torch.distributed as d; print(torch.__version__, int(torch.cuda.is_available()), "
             "torch.cuda.device_count(), int(d.is_available() and d.is_nccl_available()))")
    try:
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        version, cuda, count, nccl = r.stdout.split()
    except (subprocess.TimeoutExpired, OSError, ValueError):
        return 0, "torch could not be asked about CUDA"
    if cuda != "1" or int(count) < 1:
        return 0, f"torch {version} sees no CUDA GPU"
    if nccl != "1":
        return int(count), f"torch {version} was built without NCCL"
    return int(count), ""


def launch(cfg: BenchConfig, progress: Callable[[str, float], None] | None = None) -> BenchRun:
    """Start torchrun for one node, wait up to the timeout, and collect every rank's results. A rank that
    fails or hangs stops the run: the whole process group is killed, and the report names the rank and the
    phase it was in. The run's temporary folder is removed, also on an error, Ctrl-C or kill."""
    with tempfile.TemporaryDirectory(prefix="llmplan-bench-", ignore_cleanup_errors=True) as tmp:
        return _launch_in(cfg, Path(tmp), progress or (lambda _msg, _frac: None))


def _launch_in(cfg: BenchConfig, out: Path, say: Callable[[str, float], None]) -> BenchRun:
    (out / "config.json").write_text(json.dumps(worker_config(cfg, out)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", str(cfg.nproc), "-m", "llmplan.bench.worker", str(out / "config.json")]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // cfg.nproc))}
    t0 = time.perf_counter()
    with open(out / "torchrun.log", "wb") as log_file:  # a file, not a pipe: a chatty run cannot fill it and hang
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    timed_out, started, last = False, None, t0
    seen: dict[int, str] = {}
    startup_limit = max(cfg.timeout_s, STARTUP_TIMEOUT_S)
    try:
        while proc.poll() is None:
            now, phases = time.perf_counter(), _phases(out)
            if phases != seen:  # a rank entered its next phase: the heartbeat the timeout waits on
                last, seen = now, phases
            if started is None and len(phases) >= cfg.nproc and "init_process_group" not in phases.values():
                started = now
            stalled = now - t0 > startup_limit if started is None else now - last > cfg.timeout_s
            if stalled:
                timed_out = True
                break
            say(", ".join(f"rank {r}: {p}" for r, p in sorted(phases.items())) or "starting",
                (now - t0) / startup_limit if started is None else min(1.0, (now - last) / cfg.timeout_s))
            time.sleep(0.2)
    finally:
        _kill(proc)  # also on Ctrl-C: no worker outlives the command
    log = (out / "torchrun.log").read_bytes()[-8000:].decode(errors="replace")
    ranks = [r for r in map(_read_json, sorted(out.glob("results-rank*.json"))) if "rank" in r]
    failures = [RankFailure(e["rank"], _phases(out).get(e["rank"], "?"), str(e.get("error")))
                for e in map(_read_json, sorted(out.glob("error-rank*.json"))) if "rank" in e]
    if timed_out:
        done = {r["rank"] for r in ranks}
        why = (f"no progress for {cfg.timeout_s:g} s after start-up (the --timeout)" if started is not None else
               f"the ranks had not all started after {startup_limit:g} s (start-up timeout: the longer of "
               f"--timeout and {STARTUP_TIMEOUT_S:g} s)")
        failures += [RankFailure(r, p, why) for r, p in sorted(_phases(out).items()) if r not in done and p != "done"]
    if timed_out and not ranks and not failures:
        failures.append(RankFailure(-1, "starting", f"no rank started before the {startup_limit:g} s start-up "
                                                    "timeout"))
    if not ranks and not failures:
        failures.append(RankFailure(-1, "launch", f"torchrun exited with {proc.returncode}: {log[-2000:]}"))
    return BenchRun(ranks, failures, timed_out, time.perf_counter() - t0, None if started is None else started - t0)


def _read_json(path: Path) -> dict[str, Any]:
    """A rank's file ({} when a killed rank left it half written)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _phases(out: Path) -> dict[int, str]:
    phases = {}
    for p in out.glob("progress-rank*.json"):
        try:
            d = json.loads(p.read_text())
            phases[int(d["rank"])] = d["phase"]
        except (ValueError, KeyError):
            continue
    return phases


def _kill(proc: subprocess.Popen) -> None:
    """Stop torchrun and every worker it started (they share its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    except ProcessLookupError:
        pass


def bench_notes(cfg: "BenchConfig") -> list[str]:
    """What the bench does differently from the plan, said up front; refuses a layer that would not fit in
    this machine's memory (about 60 bytes per token and hidden unit, plus 30 per attention score, per process)."""
    m, p = cfg.model, cfg.plan
    notes = [f"the layer benchmark runs 1 of the {m.num_hidden_layers} layers of {m.name} (shape per layer "
             f"unchanged: s {p.seq_len // p.cp}, micro-batch {p.micro_batch}) with tp = nproc = {cfg.nproc}"]
    if p.tp != cfg.nproc:
        notes.append(f"the plan has tp {p.tp}; the layer and collectives run over the {cfg.nproc} processes here")
    if cfg.backend == "gloo":
        notes.append("CPU run: times are not comparable with the GPU profile; saved bytes and bytes sent are "
                     "the same on any backend and are checked as on GPUs")
    sh = layer_shape(cfg)
    per_proc = 60 * sh["s"] * sh["b"] * sh["h"] + 30 * sh["a"] * sh["s"] ** 2 * sh["b"] / cfg.nproc
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = None
    if ram and per_proc * cfg.nproc > 0.5 * ram:
        raise LlmplanError(f"one layer of {m.name} at seq {sh['s']} x micro-batch {sh['b']} needs about "
                           f"{per_proc / GIB:.1f} GiB per process; this machine has {ram / GIB:.0f} GiB: lower "
                           "--seq-len or --micro-batch, or run on GPUs")
    return notes


_MOVED = ("LAYER_TOLERANCE", "Row", "attention_rows", "bench_model", "compare", "expected_saved_bytes",
          "expected_wire_bytes")


def __getattr__(name: str) -> Any:
    """The comparison of measured against predicted moved to bench/compare.py; `from llmplan.bench.run import
    compare` (and the other names of _MOVED) still works, read from there when first asked for."""
    if name in _MOVED:
        from llmplan.bench import compare as _compare
        return getattr(_compare, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
