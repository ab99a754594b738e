"""GpuSpec.gemm_k_half against cuBLAS's published GEMM rate by reduction length (docs/validation.md#gemm-k-half).

Published points: OpenXLA's measured matmul table for sm_90 (H100), bf16 x bf16 -> bf16, FLOP/s per batched
GEMM of b x (m x n x k); tensorflow/tensorflow at 9bebee8e429eea3a9a0cfcbd989f1aa6a470c15d,
third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h (kDefaultMatmulPTable, key "sm_90").
The nine shapes with at least 8M outputs (b·m·n), each at k = 256, 512, 1024, 2048, 4096.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmplan.cost.gemm import gemm_shape_efficiency
from llmplan.specs.registry import builtin_systems

K = np.array([256.0, 512.0, 1024.0, 2048.0, 4096.0])
XLA_SM90_BF16 = {  # (b, m, n): FLOP/s at each K, as published
    (4, 4096, 4096): (505052598306679, 621648182949775, 722875922915088, 763755531195905, 794300190843863),
    (2, 4096, 4096): (464421204152249, 610080581818181, 695203511816121, 763142732054015, 810450034773430),
    (4, 4096, 2048): (459649753424657, 608352308215297, 694192224987877, 764165319129298, 809495348323011),
    (4, 2048, 4096): (455361248515691, 608524694814395, 689622237636480, 755491169041336, 801750947052183),
    (1, 4096, 4096): (393024093704246, 543391611336032, 681092181414525, 739873780534022, 786048187408492),
    (2, 4096, 2048): (394467973548861, 546433498218829, 681524483655982, 734559140755943, 782183080677472),
    (2, 2048, 4096): (391020329206118, 544217853015712, 677012499369483, 726360104177236, 778355798477709),
    (4, 2048, 2048): (392736585223116, 543942160081053, 680013821405953, 729568081535586, 781755969421186),
    (1, 4096, 2048): (308901560414269, 448139325542570, 590942115575123, 722571886944818, 764093096602028),
}


def _fit(shapes: list[tuple[int, int, int]]) -> tuple[float, float]:
    """Least squares over the published points of A_shape · K / (K + k0 + c / outputs): a per-tile half-length
    k0 (what gemm_k_half prices) and a fixed time per GEMM call, c in units of K at 16M outputs; each shape
    its own asymptote A (its tile and wave quantisation). Grid search: k0 step 1, c step 2."""
    best = (np.inf, 0.0, 0.0)
    for k0 in np.arange(50.0, 300.0, 1.0):
        c = np.arange(0.0, 400.0, 2.0)[:, None, None]
        sse = 0.0
        for shape in shapes:
            y = np.asarray(XLA_SM90_BF16[shape], dtype=float) / 1e12
            f = K / (K + k0 + c / (np.prod(shape) / 2**24))
            a = (f * y).sum(-1, keepdims=True) / (f * f).sum(-1, keepdims=True)
            sse = sse + ((a * f - y) ** 2).sum(-1)
        i = int(np.argmin(sse))
        if float(sse.ravel()[i]) < best[0]:
            best = (float(sse.ravel()[i]), float(k0), float(c.ravel()[i]))
    return best[1], best[2]


def test_h100_gemm_k_half_lies_within_cublas_published_per_tile_fit():
    # The shipped half-length (128) against the per-tile part of cuBLAS's published curve: 125, and 123-131
    # leaving out any one shape. A fitted value standing in for other costs (the lofo fits picked 256-1024)
    # would fall far outside.
    shipped = builtin_systems()["dgx-h100"].gpu.gemm_k_half
    k0, c = _fit(list(XLA_SM90_BF16))
    assert k0 == pytest.approx(125, abs=3)
    assert c == pytest.approx(160, abs=10)
    held_out = [_fit([s for s in XLA_SM90_BF16 if s != d])[0] for d in XLA_SM90_BF16]
    assert min(held_out) - 3 <= shipped <= max(held_out) + 3


def test_the_k_curve_reproduces_cublas_largest_published_shape():
    # b = 4, m = n = 4096 (64M outputs): llmplan's shape efficiency, scaled to the published rate at K = 4096,
    # reproduces the published rate at each shorter K within 9%: it runs fast by 8.1% at K = 256 and 5.4% at 512,
    # the per-call fixed time (about 40 K-units at this size) it leaves out, and within 1% from K = 1024.
    gpu = builtin_systems()["dgx-h100"].gpu
    y = np.asarray(XLA_SM90_BF16[(4, 4096, 4096)], dtype=float)
    eff = np.array([float(gemm_shape_efficiency(gpu, "bf16", 4 * 4096, 4096, k)) for k in K])
    pred = eff / eff[-1] * y[-1]
    assert np.all(np.abs(pred / y - 1) < 0.09)
    assert np.all(np.abs(pred[2:] / y[2:] - 1) < 0.01)
    assert np.all(pred >= y * 0.999)  # the left-out fixed time only ever makes the published rate lower
