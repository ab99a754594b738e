"""The serving report's load curve (serving.load_curve) prices each concurrency c as a server set up for c runs it:
SGLang cuts its CUDA-graph capture list to the server's --max-running-requests (docs/validation.md#sglang-cut), so
a point off the list's alignment runs eager, as estimate_serving of the job at batch c prices it (job_for_plan at
c), not at the capture list of the job the report was saved with."""

from __future__ import annotations

import contextlib
import io

import pytest

from llmplan.cli import main
from llmplan.planfile import load_plan
from llmplan.serving import estimate_serving, job_for_plan, load_curve, loaded_model


@pytest.fixture(scope="module")
def qwen_sglang(tmp_path_factory):
    """Qwen3-30B-A3B served by SGLang at tp 8, ep 8 with DeepEP on one DGX H100 (job batch 64)."""
    path = tmp_path_factory.mktemp("curve") / "plan.json"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(["estimate", "--mode", "infer", "--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--nodes", "1",
                  "--tp", "8", "--ep", "8", "--moe-dispatcher", "deepep", "--engine", "sglang", "--save", str(path),
                  "--json"])
        except SystemExit as e:
            assert not e.code
    pf = load_plan(path)
    return pf, estimate_serving(pf.model, pf.cluster, pf.plan, pf.serve_job, pf.allowance)


def test_each_point_as_its_own_server_runs_it(qwen_sglang):
    pf, se = qwen_sglang
    lm = loaded_model(pf.model, se.job)
    # the server set up for 20 captures up to 16 (20 eager); the one for 24 captures 24; the job's list has 24
    assert 24 in se.job.cuda_graph_batch_sizes and se.job.batch == 64
    for b, captured in ((20, False), (24, True)):
        assert (b in job_for_plan(lm, se.job, se.plan, se.cluster.system, b).cuda_graph_batch_sizes) is captured
    curve = {p.concurrency: p for p in load_curve(se)}
    eager = [c for c in curve if c not in (job_for_plan(lm, se.job, se.plan, se.cluster.system, c).cuda_graph_batch_sizes
                                           or ())]
    assert 21 in eager and 25 in eager  # points of the curve off the cut list's alignment
    for c in (1, 14, 21, 25, 34, 64):
        at = estimate_serving(pf.model, pf.cluster, pf.plan, pf.serve_job.model_copy(update={"batch": c}), pf.allowance)
        assert curve[c].tpot_s == pytest.approx(float(at.timing.tpot), rel=1e-9), c
        assert curve[c].ttft_s == pytest.approx(float(at.timing.ttft), rel=1e-9), c
