"""`llmplan report`: one self-contained HTML page whose figures plot the plan's own predictions (issue 16)."""

import json
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

pytest.importorskip("matplotlib")


class Figures(HTMLParser):
    """The figures of the page: id -> (data-values, number of <svg> inside), and any external reference."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, list] = {}
        self.current: str | None = None
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure":
            self.current = a["id"]
            self.figures[self.current] = [json.loads(a["data-values"]), 0]
        elif tag == "svg" and self.current:
            self.figures[self.current][1] += 1
        for key in ("src", "href"):
            if a.get(key, "").startswith(("http:", "https:", "//")) and tag in ("script", "link", "img"):
                self.external.append(a[key])

    def handle_endtag(self, tag):
        if tag == "figure":
            self.current = None


def parse(path) -> Figures:
    f = Figures()
    f.feed(path.read_text())
    return f


def test_training_report_plots_the_saved_predictions(cli, tmp_path):
    plan = tmp_path / "plan.json"
    r = cli("search", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--save", plan, "--json")
    assert r.code == 0
    saved = json.loads(plan.read_text())
    pred = saved["predictions"]
    out = tmp_path / "report.html"
    r = cli("report", plan, "-o", out, "--json")
    assert r.code == 0, r.err
    assert r.json()["figures"] == 6
    page = parse(out)
    assert set(page.figures) == {"memory", "schedule", "step", "comm", "goodput", "pareto"}
    assert all(n == 1 for _, n in page.figures.values())  # one inline SVG per figure
    assert not page.external  # self-contained: nothing fetched from the network
    memory = page.figures["memory"][0]
    assert len(memory["stages"]) == saved["plan"]["pp"]
    assert max(s["total"] for s in memory["stages"]) == pytest.approx(pred["memory"]["total"], rel=1e-9)
    for s in memory["stages"]:  # stacked parts add up to each stage's total
        assert sum(s[k] for k in ("weights", "gradients", "optimizer", "activations", "other")) == pytest.approx(s["total"])
    step = page.figures["step"][0]
    assert step["step_s"] == pytest.approx(pred["time"]["step_s"], rel=1e-9)
    assert sum(step["parts_s"].values()) == pytest.approx(pred["time"]["step_s"], rel=1e-9)
    comm = page.figures["comm"][0]["axes"]
    assert {k: v["bytes"] for k, v in comm.items()} == pytest.approx({k: v["bytes"] for k, v in pred["comm"].items()})
    best = page.figures["pareto"][0]["best"]
    assert best["tokens_per_s"] == pytest.approx(pred["throughput"]["tokens_per_s"], rel=1e-9)
    scale = page.figures["goodput"][0]  # goodput against GPU count: the plan's own point is its prediction
    here = next(p for p in scale["points"] if p["gpus"] == scale["plan_gpus"] == pred["gpus"])
    assert here["goodput"] == pytest.approx(pred["goodput"]["goodput"], rel=1e-9)
    assert len(scale["points"]) >= 3
    assert [p["goodput"] for p in scale["points"]] == sorted((p["goodput"] for p in scale["points"]), reverse=True)
    sched = page.figures["schedule"][0]
    assert sched["vpp"] == saved["plan"]["vpp"] and 0 < sched["microbatches_shown"] <= sched["microbatches"]


def test_uneven_stages_and_serving_plans_have_reports(cli, tmp_path):
    plan = tmp_path / "ds.json"
    r = cli("estimate", "--model", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "32", "--tp", "2", "--pp", "16",
            "--ep", "8", "--etp", "1", "--pp-first-layers", "3", "--pp-last-layers", "2", "--recompute", "full",
            "--global-batch", "256", "--save", plan, "--json")
    assert r.code == 0, r.err
    out = tmp_path / "ds.html"
    assert cli("report", plan, "-o", out).code == 0
    stages = parse(out).figures["memory"][0]["stages"]
    assert [s["layers"] for s in stages] == [3] + [4] * 14 + [2]
    serve = tmp_path / "serve.json"
    assert cli("search", "--mode", "infer", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", serve,
               "--json").code == 0
    out = tmp_path / "serve.html"
    assert cli("report", serve, "-o", out).code == 0
    figures = parse(out).figures
    assert set(figures) == {"memory", "latency", "load"}
    pred = json.loads(serve.read_text())["predictions"]
    assert figures["memory"][0]["total"] == pytest.approx(pred["memory"]["total"], rel=1e-9)
    assert figures["latency"][0]["tpot_s"] == pytest.approx(pred["tpot_s"], rel=1e-9)


def test_serving_report_plots_throughput_per_gpu_against_concurrency_and_tpot(cli, tmp_path):
    # issue 39: the curve a serving engineer reads, with the SLO lines. Every point is the plan's own timing at
    # that concurrency: the plan's batch is its saved prediction, the last point what the KV cache admits, and
    # the points that meet the SLOs are exactly those up to the SLOs' largest concurrency the plan reports.
    serve = tmp_path / "serve.json"
    r = cli("estimate", "--mode", "infer", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--tp", "4",
            "--batch", "16", "--tpot-slo", "0.03", "--ttft-slo", "0.1", "--save", serve, "--json")
    assert r.code == 0, r.err
    pred = json.loads(serve.read_text())["predictions"]
    out = tmp_path / "serve.html"
    r = cli("report", serve, "-o", out, "--json")
    assert r.code == 0 and r.json()["figures"] == 3, r.err
    load, svgs = parse(out).figures["load"]
    assert svgs == 1
    points = load["points"]
    here = next(p for p in points if p["concurrency"] == 16)
    assert here["tokens_per_s_per_gpu"] == pytest.approx(pred["throughput"]["tokens_per_s_per_gpu"], rel=1e-9)
    assert here["tpot_s"] == pytest.approx(pred["tpot_s"], rel=1e-9)
    assert here["ttft_s"] == pytest.approx(pred["ttft_s"], rel=1e-9)
    assert points[0]["concurrency"] == 1 and points[-1]["concurrency"] == pred["max_concurrent_seqs"]
    limit = pred["slo"]["max_batch"]
    assert 16 < limit < pred["max_concurrent_seqs"] and load["slo_batch"] == limit
    assert [p["meets_slos"] for p in points] == [p["concurrency"] <= limit for p in points]
    for p in points:  # the SLO flag is the SLOs applied to the point's own latencies
        assert p["meets_slos"] == (p["tpot_s"] <= 0.03 and p["ttft_s"] <= 0.1)
    assert (load["tpot_slo_s"], load["ttft_slo_s"]) == (0.03, 0.1)
    per_gpu = [p["tokens_per_s_per_gpu"] for p in points]
    assert per_gpu == sorted(per_gpu) and per_gpu[-1] > 2 * here["tokens_per_s_per_gpu"]
    page = out.read_text()
    figure = page[page.index('<figure id="load"'):]
    figure = figure[:figure.index("</figure>")]
    assert f"SLO limit ({limit})" in figure and "TPOT SLO" in figure and "TPOT, ms" in figure  # the lines, labelled


def test_report_never_overwrites_without_force(cli, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", plan, "--json").code == 0
    out = tmp_path / "report.html"
    out.write_text("mine")
    r = cli("report", plan, "-o", out)
    assert r.code == 2 and "already exists; pass --force" in r.err
    assert out.read_text() == "mine"
    assert cli("report", plan, "-o", out, "--force").code == 0 and out.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.skipif(not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")),
                    reason="no headless Chromium on this machine to render the page")
def test_report_renders_non_blank(cli, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli("search", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--save", plan, "--json").code == 0
    out = tmp_path / "report.html"
    assert cli("report", plan, "-o", out).code == 0
    browser = next(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b))
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                    "--window-size=1200,2400", out.as_uri()], check=True, timeout=120, capture_output=True)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(set(data[100:20000])) > 16  # not a blank page


def test_report_prices_goodput_with_the_saved_checkpoint_policy(cli, tmp_path):
    plan = tmp_path / "plan.json"
    assert cli("estimate", "--model", "llama-3.1-70b", "--hardware", "dgx-h100", "--nodes", "8", "--tp", "8",
               "--zero", "1", "--global-batch", "64", "--checkpoint", "async", "--failure-rate", "1e-3",
               "--save", plan, "--json").code == 0
    saved = json.loads(plan.read_text())
    assert saved["checkpoint"]["mode"] == "async"
    out = tmp_path / "report.html"
    assert cli("report", plan, "-o", out).code == 0
    scale = parse(out).figures["goodput"][0]
    here = next(p for p in scale["points"] if p["gpus"] == scale["plan_gpus"])
    assert here["goodput"] == pytest.approx(saved["predictions"]["goodput"]["goodput"], rel=1e-9)
    assert here["goodput"] < 0.99  # priced at the saved 1e-3 failures per GPU-hour, not the profile's rate


def test_training_report_names_the_optimizer_with_the_plans_switches(cli, tmp_path):
    # A Muon plan is priced with Muon's memory and step (docs/formulas.md#optim.muon_memory); its page named
    # only the degrees, ZeRO, recompute and micro-batch, the same heading as the Adam plan's.
    heads = {}
    for opt in ("adam", "muon"):
        plan = tmp_path / f"{opt}.json"
        assert cli("estimate", "--model", "llama-3.1-8b", "--hardware", "dgx-h100", "--global-batch", "64",
                   "--zero", "1", "--optimizer", opt, "--save", plan, "--json").code == 0
        out = tmp_path / f"{opt}.html"
        assert cli("report", plan, "-o", out).code == 0
        page = out.read_text()
        heads[opt] = page[page.index("<h1>"):page.index("</h1>")]
        assert f"<title>{heads[opt][4:]}</title>" in page
    # one node of 8 H100s, dp 8 (the default degrees), ZeRO 1, no recompute, micro-batch 1
    assert heads["muon"].endswith(": tp1 pp1 dp8 zero1 none mb1 optimizer muon")
    assert heads["adam"].endswith(": tp1 pp1 dp8 zero1 none mb1 optimizer adam")
