"""One rank of `llmplan bench`, started by torchrun (one node: `llmplan bench` starts torchrun itself; many
nodes: run `torchrun ... -m llmplan.bench.worker CONFIG` under srun, see docs/bench.md).

Reads the JSON config, runs the requested components, and writes results-rank<N>.json and a progress file
(the phase it is in, so a hung rank can be named) into the config's output folder.

Fault injection for tests: LLMPLAN_BENCH_HANG_RANK / LLMPLAN_BENCH_FAIL_RANK make that rank hang in, or
fail at, its first collective.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path


def _progress(out: Path, rank: int, phase: str) -> None:
    (out / f"progress-rank{rank}.json").write_text(json.dumps({"rank": rank, "phase": phase, "time": time.time()}))


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_gemms(cfg: dict, device: str, out: Path, rank: int) -> list[dict]:
    import torch

    dtype = getattr(torch, cfg["gemm_dtype"])
    results = []
    for g in cfg["gemms"]:
        _progress(out, rank, f"gemm {g['name']} {g['m']}x{g['k']}x{g['n']}")
        a = torch.randn(g["m"], g["k"], dtype=dtype, device=device)
        b = torch.randn(g["k"], g["n"], dtype=dtype, device=device)
        for _ in range(cfg["warmup"]):
            a @ b
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(cfg["iters"]):
            a @ b
        _sync(device)
        seconds = (time.perf_counter() - t0) / cfg["iters"]
        results.append({**g, "seconds": seconds, "tflops": 2 * g["m"] * g["k"] * g["n"] / seconds / 1e12})
    return results


def run_collectives(cfg: dict, device: str, out: Path, rank: int, world: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    dtype = torch.float32 if cfg["backend"] == "gloo" else torch.bfloat16
    esize = torch.tensor([], dtype=dtype).element_size()
    results = []
    for op in cfg["collectives"]:
        for size in cfg["sizes"]:
            n = max(world, int(size) // esize // world * world)
            phase = f"collective {op} {int(size)} bytes"
            _progress(out, rank, phase)
            if os.environ.get("LLMPLAN_BENCH_HANG_RANK") == str(rank):
                time.sleep(3600)
            if os.environ.get("LLMPLAN_BENCH_FAIL_RANK") == str(rank):
                raise RuntimeError(f"injected failure on rank {rank} during {phase}")
            x = torch.ones(n, dtype=dtype, device=device)
            call = _collective(op, x, world, rank, dist)
            if call is None:
                continue
            for _ in range(cfg["warmup"]):
                call()
            _sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(cfg["iters"]):
                call()
            _sync(device)
            seconds = (time.perf_counter() - t0) / cfg["iters"]
            results.append({"op": op, "bytes": n * esize, "ranks": world, "seconds": seconds})
    return results


def _collective(op: str, x, world: int, rank: int, dist):
    """A zero-argument call that runs one collective of the full buffer x (nccl-tests convention)."""
    import torch

    if op == "all-reduce":
        return lambda: dist.all_reduce(x)
    if op == "all-gather":
        shard = x[: x.numel() // world].clone()
        return lambda: (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(x, shard)
    if op == "reduce-scatter":
        shard = torch.empty(x.numel() // world, dtype=x.dtype, device=x.device)
        return lambda: (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(shard, x)
    if op == "all-to-all":
        y = torch.empty_like(x)
        return lambda: dist.all_to_all_single(y, x)
    if op == "send-recv":
        if world < 2:
            return None
        peer = rank ^ 1
        if peer >= world:
            return lambda: None

        def exchange():
            if rank % 2 == 0:
                dist.send(x, peer)
                dist.recv(x, peer)
            else:
                dist.recv(x, peer)
                dist.send(x, peer)
        return exchange
    raise ValueError(f"unknown collective {op}")


def run_layers(cfg: dict, device: str, out: Path, rank: int, world: int) -> list[dict]:
    import torch

    from llmplan.bench.layer import LayerShape, measure

    dtype = getattr(torch, cfg["layer_dtype"])
    results = []
    for case in cfg["layer_cases"]:
        sp = bool(case["sp"]) and world > 1
        shape = LayerShape(**{**cfg["layer_shape"], "t": world, "sp": sp})
        _progress(out, rank, f"layer recompute={case['recompute']} sp={sp}")
        r = measure(shape, case["recompute"], dtype, device)
        results.append({"recompute": r.recompute, "sp": r.sp, "saved_bytes": r.saved_bytes,
                        "wire_bytes": r.wire_bytes, "calls": r.calls, "seconds": r.seconds,
                        "peak_allocated": r.peak_allocated, "mask_bytes": r.mask_bytes})
    return results


SDPA_BACKENDS = {"native": "CUDNN_ATTENTION", "flash2": "FLASH_ATTENTION"}


def run_attention(cfg: dict, device: str, out: Path, rank: int) -> list[dict]:
    """Causal attention forward + backward through PyTorch SDPA, each case under each requested kernel; a
    kernel this build or GPU cannot run for a shape is reported as that case's error, not a failed rank."""
    import contextlib

    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, cfg["attention_dtype"])
    results = []
    for kernel in cfg["attention_kernels"]:
        for c in cfg["attention"]:
            _progress(out, rank, f"attention {kernel} {c['name']}")
            q = torch.randn(c["b"], c["a"], c["s"], c["qk"], dtype=dtype, device=device, requires_grad=True)
            k = torch.randn(c["b"], c["kv"], c["s"], c["qk"], dtype=dtype, device=device, requires_grad=True)
            v = torch.randn(c["b"], c["kv"], c["s"], c["v"], dtype=dtype, device=device, requires_grad=True)
            grad = torch.randn(c["b"], c["a"], c["s"], c["v"], dtype=dtype, device=device)
            def ctx(kernel=kernel):
                if kernel not in SDPA_BACKENDS:
                    return contextlib.nullcontext()
                from torch.nn.attention import SDPBackend, sdpa_kernel
                return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[kernel])])

            def step(expand: bool, q=q, k=k, v=v, grad=grad, c=c):
                # a backend without grouped-query support gets K and V repeated to the query heads (same FLOPs)
                kk, vv = ((k.repeat_interleave(c["a"] // c["kv"], 1), v.repeat_interleave(c["a"] // c["kv"], 1))
                          if expand else (k, v))
                o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                   enable_gqa=not expand and c["kv"] != c["a"])
                o.backward(grad)

            error = None
            for expand in ((False, True) if c["kv"] != c["a"] else (False,)):
                try:
                    with ctx():
                        for _ in range(cfg["warmup"]):
                            step(expand)
                        _sync(device)
                        t0 = time.perf_counter()
                        for _ in range(cfg["iters"]):
                            step(expand)
                        _sync(device)
                    results.append({**c, "kernel": kernel, "kv_expanded": expand,
                                    "seconds": (time.perf_counter() - t0) / cfg["iters"]})
                    error = None
                    break
                except RuntimeError as e:  # e.g. no kernel of that backend for this head dim / dtype / GQA
                    error = str(e).splitlines()[0] if str(e) else type(e).__name__
            if error:
                results.append({**c, "kernel": kernel, "error": error})
    return results


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    cfg = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    out = Path(cfg["out_dir"])
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = f"cuda:{local}" if cfg["backend"] == "nccl" else "cpu"
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
    torch.set_num_threads(max(1, int(cfg.get("threads", 1))))
    try:
        _progress(out, rank, "init_process_group")
        dist.init_process_group(cfg["backend"])
        result: dict = {"rank": rank, "world": world, "device": device,
                        "device_name": torch.cuda.get_device_name(local) if device.startswith("cuda") else "cpu",
                        "torch": torch.__version__, "host": os.uname().nodename}
        if "gemm" in cfg["components"]:
            result["gemm"] = run_gemms(cfg, device, out, rank)
        if "collectives" in cfg["components"]:
            result["collectives"] = run_collectives(cfg, device, out, rank, world)
        if "layer" in cfg["components"]:
            result["layer"] = run_layers(cfg, device, out, rank, world)
        if "attention" in cfg["components"]:
            result["attention"] = run_attention(cfg, device, out, rank)
        _progress(out, rank, "done")
        (out / f"results-rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except Exception as e:  # reported by the parent with the rank and phase
        (out / f"error-rank{rank}.json").write_text(json.dumps({"rank": rank, "error": f"{type(e).__name__}: {e}",
                                                                "traceback": traceback.format_exc()}))
        return 1


if __name__ == "__main__":
    sys.exit(main())
