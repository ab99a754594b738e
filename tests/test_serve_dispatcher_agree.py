"""`--moe-dispatcher` in serving: `estimate --mode infer` and the serving searches (co-located and
--disaggregated) read it alike. A MoE model: both accept deepep and price it (the search on its layouts with
EP); a dense model, whose layouts all have ep 1: both refuse with the same line, check_serve_plan's rule
moe_serving_needs_ep (before, the search refused the flag as a training option, exit 2, while estimate priced it)."""

from __future__ import annotations

from refusal import one_line

MOE = ("--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--input-len", "1024", "--output-len", "256")
DENSE = ("--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--input-len", "1024", "--output-len", "256")
RULE = ("--moe-dispatcher deepep, --two-batch-overlap and --redundant-experts act on the expert-parallel all-to-all "
        "and its ranks, but ep is 1")


def test_estimate_and_search_both_price_deepep_on_a_moe_model(cli):
    est = cli("estimate", "--mode", "infer", *MOE, "--tp", "8", "--ep", "8", "--batch", "16",
              "--moe-dispatcher", "deepep", "--json")
    assert est.code == 0, est.err
    assert est.json()["plan"]["moe_dispatcher"] == "deepep"
    s = cli("search", "--mode", "infer", *MOE, "--max-batch", "16", "--moe-dispatcher", "deepep", "--json")
    assert s.code == 0, s.err
    plans = [p["plan"] for p in s.json()["plans"]]
    with_ep = [p for p in plans if p["ep"] > 1]
    assert with_ep and all(p["moe_dispatcher"] == "deepep" for p in with_ep), plans
    assert all(p["moe_dispatcher"] == "alltoall" for p in plans if p["ep"] == 1), plans


def test_alltoall_given_keeps_the_wide_ep_layouts_off_deepep(cli):
    """Given, the dispatcher is honoured on every EP layout: the wide-EP layouts the search adds (DeepEP by
    default, search.serve.wide_ep_plans) take alltoall too."""
    s = cli("search", "--mode", "infer", *MOE, "--max-batch", "16", "--moe-dispatcher", "alltoall", "--top", "20",
            "--json")
    assert s.code == 0, s.err
    plans = [p["plan"] for p in s.json()["plans"]]
    assert any(p["dp_attention"] for p in plans) and all(p["moe_dispatcher"] == "alltoall" for p in plans), plans


def test_the_disaggregated_search_accepts_deepep(cli):
    s = cli("search", "--mode", "infer", "--disaggregated", *MOE, "--max-batch", "16", "--moe-dispatcher", "deepep",
            "--json")
    assert s.code in (0, 3), s.err
    assert "applies to training" not in s.err


def test_a_dense_model_is_refused_by_both_with_the_same_rule(cli):
    est = cli("estimate", "--mode", "infer", *DENSE, "--tp", "8", "--batch", "8", "--moe-dispatcher", "deepep")
    co = cli("search", "--mode", "infer", *DENSE, "--moe-dispatcher", "deepep")
    dis = cli("search", "--mode", "infer", "--disaggregated", *DENSE, "--moe-dispatcher", "deepep")
    lines = {one_line(r.err) for r in (est, co, dis)}
    assert [r.code for r in (est, co, dis)] == [2, 2, 2]
    assert len(lines) == 1 and RULE in lines.pop()


def test_alltoall_on_a_dense_model_is_accepted_by_both(cli):
    est = cli("estimate", "--mode", "infer", *DENSE, "--tp", "8", "--batch", "8", "--moe-dispatcher", "alltoall")
    co = cli("search", "--mode", "infer", *DENSE, "--moe-dispatcher", "alltoall")
    assert (est.code, co.code) == (0, 0), est.err + co.err


def test_the_dense_refusal_names_no_ep_to_raise(cli):
    """A dense model has no experts: the refusal says drop them, not raise --ep (stop 61 review)."""
    r = cli("search", "--mode", "infer", *DENSE, "--moe-dispatcher", "deepep")
    line = one_line(r.err)
    assert r.code == 2 and "llama-3.1-8b is dense" in line and "raise --ep" not in line, line


def test_ep_pinned_to_one_is_refused_as_estimate_refuses_it(cli):
    """--ep 1 pinned leaves every layout without EP, as on a dense model: the search refuses deepep with
    estimate's line (before, it priced every plan alltoall and exited 0)."""
    est = cli("estimate", "--mode", "infer", *MOE, "--tp", "8", "--ep", "1", "--batch", "8", "--moe-dispatcher", "deepep")
    co = cli("search", "--mode", "infer", *MOE, "--ep", "1", "--moe-dispatcher", "deepep")
    assert (est.code, co.code) == (2, 2), est.err + co.err
    assert one_line(est.err) == one_line(co.err) and RULE in one_line(co.err) and "raise --ep" in one_line(co.err)


def test_a_training_only_dispatcher_is_one_line_not_an_internal_error(cli):
    """allgather and flex are training dispatchers; a serving search on a dense model once met pydantic with
    them (internal error, exit 1): now the value is checked first, in the serving plan options' wording."""
    for extra in ((), ("--disaggregated",)):
        for value in ("allgather", "flex"):
            r = cli("search", "--mode", "infer", *extra, *DENSE, "--moe-dispatcher", value)
            line = one_line(r.err)
            assert r.code == 2 and "internal error" not in line and f"--moe-dispatcher {value}" in line, line
