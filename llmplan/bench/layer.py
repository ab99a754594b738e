"""A reference transformer layer in torch with Megatron-style tensor parallelism, instrumented to count
what the memory and communication formulas predict: bytes saved for backward and bytes each collective
moves. This module imports torch; nothing outside llmplan.bench does.

Column-parallel linears split their output over the TP group, row-parallel linears their input. Without
sequence parallelism (SP) the layer input is replicated: an identity forward / all-reduce backward before
each column-parallel linear, an all-reduce after each row-parallel one. With SP the layer input is split
along the sequence: all-gather before the column-parallel linear (which keeps only the local shard for
backward and all-gathers it again to compute the weight gradient) and reduce-scatter after the row-parallel
one. Attention is the unfused kind (scores, softmax, dropout) so the s^2 terms of Korthikanti's Table 2
are there to count; GQA, gated (SwiGLU) or GELU MLPs follow the model spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


@dataclass
class CommLog:
    """Every collective the layer issued on this rank: (op, bytes of the full buffer, group size)."""

    calls: list[tuple[str, int, int]] = field(default_factory=list)

    def add(self, op: str, nbytes: int, n: int) -> None:
        self.calls.append((op, nbytes, n))

    def wire_bytes(self) -> float:
        """Bytes this rank sends: ring all-reduce 2(n-1)/n·S, all-gather / reduce-scatter (n-1)/n·S."""
        factor = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n,
                  "reduce-scatter": lambda n: (n - 1) / n}
        return sum(factor[op](n) * s for op, s, n in self.calls if n > 1)


LOG = CommLog()


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _world() > 1:
        LOG.add("all-reduce", x.numel() * x.element_size(), _world())
        x = x.contiguous()
        dist.all_reduce(x)
    return x


def _all_gather_seq(x: torch.Tensor) -> torch.Tensor:
    """Gather sequence shards [s/t, b, h] -> [s, b, h]."""
    n = _world()
    if n == 1:
        return x
    out = torch.empty((x.shape[0] * n, *x.shape[1:]), dtype=x.dtype)
    LOG.add("all-gather", out.numel() * out.element_size(), n)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x.contiguous())
    return out


def _reduce_scatter_seq(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks and keep this rank's sequence shard: [s, b, h] -> [s/t, b, h]."""
    n = _world()
    if n == 1:
        return x
    out = torch.empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype)
    LOG.add("reduce-scatter", x.numel() * x.element_size(), n)
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, x.contiguous())
    return out


class _CopyToTP(torch.autograd.Function):
    """Identity forward, all-reduce of the gradient backward (input replicated over TP, no SP)."""

    @staticmethod
    def forward(ctx, x):  # noqa: D401
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g.clone())


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward, identity backward (after a row-parallel linear, no SP)."""

    @staticmethod
    def forward(ctx, x):
        return _all_reduce(x.clone())

    @staticmethod
    def backward(ctx, g):
        return g


class _ReduceScatterFromTP(torch.autograd.Function):
    """Reduce-scatter forward, all-gather backward (after a row-parallel linear, SP)."""

    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter_seq(x)

    @staticmethod
    def backward(ctx, g):
        return _all_gather_seq(g)


class _GatherLinear(torch.autograd.Function):
    """SP column-parallel linear: all-gather the sequence shard, multiply; keep only the shard for backward,
    all-gather it again there for the weight gradient, reduce-scatter the input gradient."""

    @staticmethod
    def forward(ctx, x_shard, weight):
        ctx.save_for_backward(x_shard, weight)
        return _all_gather_seq(x_shard) @ weight.t()

    @staticmethod
    def backward(ctx, g):
        x_shard, weight = ctx.saved_tensors
        x = _all_gather_seq(x_shard)
        grad_w = g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return _reduce_scatter_seq(g @ weight), grad_w


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up that keeps only its input (the fc1 output) for backward, as Megatron-LM's fused
    bias-SwiGLU does, and recomputes silu there."""

    @staticmethod
    def forward(ctx, up):
        ctx.save_for_backward(up)
        gate, lin = up.chunk(2, dim=-1)
        return F.silu(gate) * lin

    @staticmethod
    def backward(ctx, g):
        (up,) = ctx.saved_tensors
        gate, lin = up.float().chunk(2, dim=-1)
        sig = torch.sigmoid(gate)
        silu = gate * sig
        d_gate = g.float() * lin * (sig * (1 + gate * (1 - sig)))
        return torch.cat([d_gate, g.float() * silu], dim=-1).to(up.dtype)


@dataclass(frozen=True)
class LayerShape:
    """Per-rank shape of the reference layer."""

    s: int
    b: int
    h: int
    a: int
    kv: int
    d: int
    f: int
    t: int
    gated: bool
    sp: bool
    dropout: float = 0.1


class ReferenceLayer(torch.nn.Module):
    mask: torch.Tensor
    """The causal mask, a non-persistent buffer (register_buffer), typed for the checker."""

    def __init__(self, shape: LayerShape, dtype: torch.dtype) -> None:
        super().__init__()
        c = shape
        self.c = c
        heads, kvh = c.a // c.t, max(c.kv // c.t, 1)
        init = lambda *size: torch.nn.Parameter(torch.randn(*size, dtype=dtype) * 0.02)  # noqa: E731
        self.ln1 = torch.nn.LayerNorm(c.h, dtype=dtype)
        self.ln2 = torch.nn.LayerNorm(c.h, dtype=dtype)
        self.w_qkv = init((heads + 2 * kvh) * c.d, c.h)
        self.w_proj = init(c.h, heads * c.d)
        self.w_fc1 = init((2 if c.gated else 1) * (c.f // c.t), c.h)
        self.w_fc2 = init(c.h, c.f // c.t)
        self.heads, self.kvh = heads, kvh
        mask = torch.full((c.s, c.s), float("-inf"), dtype=dtype).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def column(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.c.sp and self.c.t > 1:
            return _GatherLinear.apply(x, weight)
        return _CopyToTP.apply(x) @ weight.t() if self.c.t > 1 else x @ weight.t()

    def row(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = x @ weight.t()
        if self.c.t == 1:
            return y
        return _ReduceScatterFromTP.apply(y) if self.c.sp else _ReduceFromTP.apply(y)

    def core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Scores, causal softmax, dropout, attention over V: [b, heads, s, d] -> [s, b, heads*d]."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.c.d))
        probs = F.dropout(torch.softmax(scores + self.mask, dim=-1), p=self.c.dropout, training=True)
        ctx = torch.matmul(probs, v)
        return ctx.permute(2, 0, 1, 3).reshape(self.c.s, self.c.b, self.heads * self.c.d)

    def forward(self, x: torch.Tensor, selective: bool = False) -> torch.Tensor:
        c = self.c
        qkv = self.column(self.ln1(x), self.w_qkv)  # [s, b, (heads + 2 kvh) d]
        q, k, v = qkv.split([self.heads * c.d, self.kvh * c.d, self.kvh * c.d], dim=-1)
        # Head-major copies, as the unfused attention of Megatron-LM makes them, so what is saved does not
        # depend on whether a reshape happens to be a view (it is when b = 1).
        q = q.reshape(c.s, c.b, self.heads, c.d).permute(1, 2, 0, 3).contiguous()
        rep = self.heads // self.kvh
        k = k.reshape(c.s, c.b, self.kvh, c.d).permute(1, 2, 0, 3).contiguous()
        v = v.reshape(c.s, c.b, self.kvh, c.d).permute(1, 2, 0, 3).contiguous()
        if rep > 1:  # unfused GQA attention expands K and V to the query heads (copies)
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if selective:
            ctx = checkpoint(self.core_attention, q, k, v, use_reentrant=True)
        else:
            ctx = self.core_attention(q, k, v)
        x = x + F.dropout(self.row(ctx, self.w_proj), p=c.dropout, training=True)
        up = self.column(self.ln2(x), self.w_fc1)
        act = _SwiGLU.apply(up) if c.gated else F.gelu(up)
        return x + F.dropout(self.row(act, self.w_fc2), p=c.dropout, training=True)


def dropout_mask_bytes(dtype: torch.dtype, device: str) -> int:
    """Bytes per element of the mask torch keeps for dropout's backward here (1 where it is a bool mask,
    as on CUDA; the activation dtype's size where it is not, as on CPU)."""
    found: list[int] = []
    x = torch.ones(8, dtype=dtype, device=device, requires_grad=True)

    def pack(t: torch.Tensor) -> torch.Tensor:
        found.append(t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.dropout(x * 1, p=0.5, training=True)
    return min(found) if found else 1


@dataclass(frozen=True)
class LayerMeasurement:
    recompute: str
    sp: bool
    saved_bytes: int
    """Bytes saved for backward, each storage counted once, parameters and constant buffers excluded."""
    wire_bytes: float
    """Bytes this rank sent in the layer's collectives, forward and backward."""
    calls: dict[str, int]
    seconds: float
    peak_allocated: int | None
    mask_bytes: int
    """Bytes per dropout-mask element on this device (Korthikanti counts 1)."""


def measure(shape: LayerShape, recompute: str, dtype: torch.dtype, device: str = "cpu") -> LayerMeasurement:
    """Run one forward and backward of the reference layer and count saved bytes and collective bytes."""
    import time

    torch.manual_seed(0)
    layer = ReferenceLayer(shape, dtype).to(device)
    excluded = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    excluded |= {b.untyped_storage().data_ptr() for b in layer.buffers()}
    s_local = shape.s // shape.t if (shape.sp and shape.t > 1) else shape.s
    x = torch.randn(s_local, shape.b, shape.h, dtype=dtype, device=device, requires_grad=True)
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> Any:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in excluded:
            seen.setdefault(ptr, storage.nbytes())
        return t

    LOG.calls.clear()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if recompute == "full":
            y = checkpoint(layer, x, use_reentrant=True)
        else:
            y = layer(x, selective=recompute == "selective")
    saved = sum(seen.values())
    y.float().sum().backward()
    seconds = time.perf_counter() - t0
    calls: dict[str, int] = {}
    for op, _, _ in LOG.calls:
        calls[op] = calls.get(op, 0) + 1
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    return LayerMeasurement(recompute, shape.sp, saved, LOG.wire_bytes(), calls, seconds, peak,
                            dropout_mask_bytes(dtype, device))
