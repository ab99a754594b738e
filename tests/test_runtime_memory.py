"""Runtime memory outside the tensors (docs/formulas.md#mem.runtime): CUDA context, cuBLAS workspace, NCCL
buffers, priced per plan and shown as parts of `other`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmplan.cost.memory import training_memory
from llmplan.cost.runtime_memory import (
    CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_EAGER_BYTES, CUDA_CONTEXT_LAZY_BYTES, NCCL_CONNECTION_BYTES,
    nccl_communicators, runtime_bytes,
)
from llmplan.specs.plan import MemoryAllowance, ParallelPlan
from llmplan.specs.registry import builtin_models
from llmplan.units import GIB

MIB = 2**20


def test_nccl_connection_is_nccl_s_three_protocol_buffers() -> None:
    # NVIDIA/nccl src/init.cc: DEFAULT_BUFFSIZE 1 << 22 ("4MiB"); LL128 120 elems x 640 threads x 8 steps x 8 B
    # = 4,915,200 B; LL 8 lines x 512 threads x 8 steps x 16 B = 524,288 B (512 KiB).
    assert NCCL_CONNECTION_BYTES == 4 * MIB + 4_915_200 + 512 * 1024


def test_context_sizes_are_the_measured_ones() -> None:
    # pytorch/pytorch PR #86509: cudaMemGetInfo shows 287,047,680 bytes used with CUDA_MODULE_LOADING=LAZY and
    # 666,632,192 with DEFAULT (eager) after one small tensor; PyTorch's default cuBLAS workspace config
    # ":4096:2:16:8" is 2 x 4 MiB + 8 x 16 KiB (CublasHandlePool.cpp).
    assert (CUDA_CONTEXT_LAZY_BYTES, CUDA_CONTEXT_EAGER_BYTES) == (287_047_680, 666_632_192)
    assert CUBLAS_WORKSPACE_BYTES == 8 * MIB + 128 * 1024


def _plan(**kw: object) -> ParallelPlan:
    base = dict(tp=8, pp=4, pp_first=20, pp_last=20, dp=2, micro_batch=1, global_batch=64, seq_len=4096)
    base.update(kw)
    return ParallelPlan(**base)  # type: ignore[arg-type]


def test_communicators_counted_per_group() -> None:
    plan = _plan()
    # first stage: TP, DP, one pipeline neighbour, the embedding group, the model-parallel (TP x PP) group
    assert int(nccl_communicators(plan, 0)) == 5
    # a middle stage: TP, DP, two neighbours, model-parallel group; no embedding group
    assert int(nccl_communicators(plan, 1)) == 5
    assert int(nccl_communicators(_plan(tp=1, pp=1, pp_first=0, pp_last=0, dp=64), 0)) == 1
    assert int(nccl_communicators(_plan(tp=1, pp=1, pp_first=0, pp_last=0, dp=1), 0)) == 0


def test_nccl_bytes_hand_computed() -> None:
    # 16 channels x (1 ring + 2 tree connections) x 9,633,792 B, per communicator: 441 MiB
    r = runtime_bytes(_plan(tp=8, pp=1, pp_first=0, pp_last=0, dp=1), 0, 16, True)
    assert float(r.nccl) == 16 * 3 * NCCL_CONNECTION_BYTES
    assert abs(float(r.nccl) / MIB - 441.0) < 0.1


@settings(max_examples=60, deadline=None, derandomize=True)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 8]),
       channels=st.integers(1, 64), lazy=st.booleans(), stage=st.integers(0, 3))
def test_runtime_parts_sum_and_grow_with_channels(tp: int, pp: int, dp: int, channels: int, lazy: bool,
                                                  stage: int) -> None:
    plan = _plan(tp=tp, pp=pp, pp_first=0, pp_last=0, dp=dp)
    s = min(stage, pp - 1)
    r = runtime_bytes(plan, s, channels, lazy)
    assert float(r.total) == float(r.context + r.cublas + r.nccl)
    assert float(runtime_bytes(plan, s, channels + 1, lazy).nccl) >= float(r.nccl)
    assert float(runtime_bytes(plan, s, channels, False).total) > float(runtime_bytes(plan, s, channels, True).total)


def test_runtime_is_inside_other_and_a_stated_allowance_replaces_it() -> None:
    m = builtin_models()["llama-3.1-70b"]
    plan = _plan()
    priced = training_memory(m, plan, 80 * GIB, MemoryAllowance(), nccl_channels=16)
    assert priced.runtime is not None
    frag = MemoryAllowance().fragmentation
    churned = priced.activations + priced.fresh_grad  # the held model states carry none (mem.fragmentation)
    assert np.isclose(float(priced.other), float(priced.runtime.total + frag * churned))
    stated = training_memory(m, plan, 80 * GIB, MemoryAllowance(fixed_gib=1.5), nccl_channels=16)
    assert stated.runtime is None
    assert np.isclose(float(stated.other - priced.other), 1.5 * GIB - float(priced.runtime.total))


def test_cli_json_shows_runtime_parts(cli) -> None:
    out = cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "8", "--pp",
              "2", "--dp", "2", "--json")  # in-process through the real entry point (the conftest's cli)
    assert out.code in (0, 1), out.err
    mem = json.loads(out.out)["memory"]
    parts = mem["runtime_parts"]
    assert parts["nccl_communicators"] == 5
    assert parts["context"] + parts["cublas"] + parts["nccl"] < mem["other"]


def test_userbuffers_are_transformer_engine_s_twelve_buffers() -> None:
    # NVIDIA/TransformerEngine pytorch/module/base.py initialize_ub (d0067d0): 8 all-gather overlaps
    # (layers_all_gather_overlap: qkv/fc1 fprop, qkv/proj/fc1/fc2 dgrad, proj/fc2 wgrad) and 4 reduce-scatter ones
    # (proj/fc2 fprop, qkv/fc1 wgrad), each a buffer of the shape Megatron passes (megatron/training/
    # initialize.py _initialize_tp_communicators: (seq x micro-batch / cp, hidden)), bf16, the all-gather ones
    # uint8 in fp8. Llama 3.1 70B, s 4096, b 1: 12 x 4096 x 8192 x 2 B = 768 MiB; fp8: (8 x 1 + 4 x 2) B per
    # element = 512 MiB; CP 2 halves the rows.
    from llmplan.cost.runtime_memory import UB_ALL_GATHER_BUFFERS, UB_REDUCE_SCATTER_BUFFERS, userbuffer_bytes
    assert (UB_ALL_GATHER_BUFFERS, UB_REDUCE_SCATTER_BUFFERS) == (8, 4)
    h = builtin_models()["llama-3.1-70b"].hidden_size
    p = _plan(tp=4, pp=2, pp_first=0, pp_last=0, dp=8, sp=True, tp_comm_overlap=True)
    assert float(userbuffer_bytes(h, p)) == 768 * MIB
    assert float(userbuffer_bytes(h, p.model_copy(update={"dtype": "fp8"}))) == 512 * MIB
    assert float(userbuffer_bytes(h, p.model_copy(update={"dtype": "fp8"}), 2)) == (512 + 768) * MIB
    assert float(userbuffer_bytes(h, p.model_copy(update={"cp": 2, "dp": 4}))) == 384 * MIB
    assert float(userbuffer_bytes(h, p.model_copy(update={"tp_comm_overlap": False}))) == 0.0
    assert float(userbuffer_bytes(h, p.model_copy(update={"tp_impl": "dtensor"}))) == 0.0  # torchtitan: none


def test_userbuffers_sit_in_other_and_the_json(cli) -> None:
    m = builtin_models()["llama-3.1-70b"]
    on = _plan(tp=4, pp=2, pp_first=0, pp_last=0, dp=8, sp=True, tp_comm_overlap=True)
    a = training_memory(m, on, 80 * GIB, MemoryAllowance(), nccl_channels=16)
    b = training_memory(m, on.model_copy(update={"tp_comm_overlap": False}), 80 * GIB, MemoryAllowance(),
                        nccl_channels=16)
    assert a.runtime is not None and float(a.runtime.userbuffers) == 768 * MIB
    # and Transformer Engine's workspace, which initialize_ub triples: 3 x 4 MiB on a GPU of unknown capability
    assert float(a.total - b.total) == pytest.approx(768 * MIB + 3 * 4 * MIB)
    out = cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--tp", "4", "--pp",
              "2", "--tp-comm-overlap", "--json")
    assert out.code == 0, out.err
    assert json.loads(out.out)["memory"]["runtime_parts"]["userbuffers"] == 768 * MIB


def test_cublas_workspace_by_compute_capability() -> None:
    # pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize: default_size = use32mb ?
    # 4096 * 8 * 1024 : 4096 * 1024 * 2 + 16 * 1024 * 8; use32mb = major == 9 at 26a39059, major 9, 10 or 12 after
    # pull request 175344 (2026-02-19), 11 too after pull request 189312 (2026-07); one workspace per (handle,
    # stream), the compute stream's here.
    from llmplan.cost.runtime_memory import cublas_workspace_bytes
    assert cublas_workspace_bytes(9.0) == 32 * MIB  # H100 / H200 / H800 / H20
    assert cublas_workspace_bytes(8.0) == 8 * MIB + 128 * 1024  # A100
    assert cublas_workspace_bytes(10.0) == 32 * MIB  # B200 / GB200 (current PyTorch)
    assert cublas_workspace_bytes(10.3) == 32 * MIB  # B300 / GB300
    assert cublas_workspace_bytes(12.0) == 32 * MIB  # RTX Blackwell
    assert cublas_workspace_bytes(None) == 8 * MIB + 128 * 1024


def test_te_workspace_under_userbuffers_by_compute_capability() -> None:
    # NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py @fecb10bdf13c26a213807bc310b0ec438462614e:
    # get_cublas_workspace_size_bytes 33,554,432 B on major >= 9, else 4,194,304 B; initialize_ub repeats the
    # workspace _NUM_MAX_UB_STREAMS = 3 times. PyTorch's: two (handle, stream) pairs, the forward thread's and
    # autograd's device thread's (CUBLAS_TRAINING_HANDLES, tests/test_memory_edges.py).
    plain = _plan(tp=8, pp=1, pp_first=0, pp_last=0, dp=1, sp=True)
    overlap = _plan(tp=8, pp=1, pp_first=0, pp_last=0, dp=1, sp=True, tp_comm_overlap=True)
    cublas = {(name, cc): float(runtime_bytes(p, 0, 16, True, 0.0, cc).cublas)
              for name, p in (("plain", plain), ("overlap", overlap)) for cc in (8.0, 9.0, 10.0)}
    assert cublas[("plain", 9.0)] == 2 * 32 * MIB and cublas[("plain", 10.0)] == 2 * 32 * MIB
    assert cublas[("overlap", 9.0)] == 2 * 32 * MIB + 3 * 32 * MIB
    assert cublas[("overlap", 10.0)] == 2 * 32 * MIB + 3 * 32 * MIB
    assert cublas[("overlap", 8.0)] == 2 * (8 * MIB + 128 * 1024) + 3 * 4 * MIB
    # the workspaces reach the plan's memory: an H100 rank holds 2 x 24 MiB more than one of unknown capability
    m = builtin_models()["llama-3.1-70b"]
    h100 = training_memory(m, plain, 80 * GIB, MemoryAllowance(), nccl_channels=16, compute_capability=9.0)
    unknown = training_memory(m, plain, 80 * GIB, MemoryAllowance(), nccl_channels=16)
    assert float(h100.total) - float(unknown.total) == pytest.approx(48 * MIB, rel=0.02)
