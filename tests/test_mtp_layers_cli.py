"""--mtp-layers N (ParallelPlan.mtp_layers): training a model with fewer of its multi-token-prediction modules
than num_nextn_predict_layers, 0 = none (issue 40: Qwen3-Next trained with its MTP module always). Megatron-LM
builds --mtp-num-layers modules (TransformerConfig.mtp_num_layers, None without the flag) and Megatron-Bridge's
Qwen3-Next provider leaves mtp_num_layers None (NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/models/qwen/
qwen_provider.py @fb8a4d6bffdc62ddcd78fc520a4304353d52aca1, Qwen3NextModelProvider80B_A3B).
docs/formulas.md#mixers.mtp."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
QWEN = ["-m", "qwen3-next-80b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--tp", "2", "--pp", "1", "--ep", "8",
        "--etp", "1", "--global-batch", "256"]


def _est(cli, *args: str) -> dict:
    r = cli("estimate", *args, "--json")
    assert r.code == 0, r.err
    return r.json()


def _numbers(d: dict) -> tuple:
    return (d["params"]["per_gpu"], d["memory"]["total"], d["time"]["step_s"], d["stage_layers"])


def test_mtp_layers_0_prices_as_the_spec_copy_without_mtp(cli, tmp_path):
    # The workaround (a spec copy with num_nextn_predict_layers 0) and the switch price the same plan.
    spec = yaml.safe_load((REPO / "model_specs" / "qwen3-next-80b-a3b.yaml").read_text())
    spec.update(name="qwen3-next-no-mtp", num_nextn_predict_layers=0)
    copy = tmp_path / "qwen3-next-no-mtp.yaml"
    copy.write_text(yaml.safe_dump(spec))
    off = _est(cli, *QWEN, "--mtp-layers", "0")
    workaround = _est(cli, *[copy.as_posix() if a == "qwen3-next-80b-a3b" else a for a in QWEN])
    assert _numbers(off) == _numbers(workaround)
    assert off["plan"]["mtp_layers"] == 0
    # with its module (the default, or --mtp-layers 1): more parameters, memory and time on the one stage
    full, one = _est(cli, *QWEN), _est(cli, *QWEN, "--mtp-layers", "1")
    assert _numbers(full) == _numbers(one) and full["plan"]["mtp_layers"] is None
    assert full["params"]["per_gpu"] > off["params"]["per_gpu"]
    assert full["memory"]["total"] > off["memory"]["total"] and full["time"]["step_s"] > off["time"]["step_s"]


def test_bad_mtp_layers_is_one_line_exit_2(cli):
    for args, words in (([*QWEN, "--mtp-layers", "2"], ("mtp_layers 2", "qwen3-next-80b-a3b", "--mtp-layers 0 to 1")),
                        (["-m", "llama-3.1-8b", "--hardware", "dgx-h100", "--mtp-layers", "1"],
                         ("mtp_layers 1", "llama-3.1-8b", "--mtp-layers 0 or drop it")),
                        ([*QWEN, "--mtp-layers", "-1"], ("--mtp-layers",))):
        line = cli("estimate", *args).refusal()
        assert all(w in line for w in words), line
    line = cli("search", "-m", "qwen3-next-80b-a3b", "--hardware", "dgx-h100", "--nodes", "2", "--mtp-layers",
               "3").refusal()
    assert "mtp_layers 3" in line  # --mode infer: tests/test_bad_input_values.py


def _export(cli, plan: Path, target: str, out: Path) -> str:
    r = cli("export", str(plan), "--to", target, "-o", str(out))
    assert r.code == 0, r.err
    return "\n".join(f.read_text() for f in sorted(out.rglob("*")) if f.is_file())


def test_exports_turn_mtp_off_when_off(cli, tmp_path):
    base = ["-m", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "128", "--tp", "2", "--pp", "16", "--ep", "64",
            "--etp", "1", "--global-batch", "4096", "--pp-layout", "balanced"]
    texts = {}
    for label, extra in (("off", ["--mtp-layers", "0"]), ("on", [])):
        plan = tmp_path / f"{label}.json"
        r = cli("estimate", *base, *extra, "--save", str(plan))
        assert r.code == 0, r.err
        texts[label] = {t: _export(cli, plan, t, tmp_path / f"{label}-{t}") for t in ("megatron", "megatron-bridge")}
    # Megatron-LM: --mtp-num-layers and the layout's m (validate_layer_layout wants them to agree)
    assert "--mtp-num-layers 1" in texts["on"]["megatron"] and "ttmL" in texts["on"]["megatron"]
    assert "--mtp-num-layers" not in texts["off"]["megatron"] and "ttmL" not in texts["off"]["megatron"]
    assert "ttL" in texts["off"]["megatron"]
    # Megatron-Bridge: model.mtp_num_layers and its layout
    assert "mtp_num_layers=1" in texts["on"]["megatron-bridge"] and "ttmL" in texts["on"]["megatron-bridge"]
    # off: the recipe's own MTP turned off (Bridge's deepseek_v3_pretrain_config sets mtp_num_layers 1)
    assert "model.mtp_num_layers=null" in texts["off"]["megatron-bridge"]
    assert "ttmL" not in texts["off"]["megatron-bridge"]


def test_saved_plan_keeps_the_switch_and_check_sees_no_spec_change(cli, tmp_path):
    plan = tmp_path / "q.json"
    r = cli("search", "-m", "qwen3-next-80b-a3b", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "2", "--pp", "2",
            "--ep", "8", "--global-batch", "512", "--mtp-layers", "0", "--top", "1", "--save", str(plan))
    assert r.code == 0, r.err
    saved = yaml.safe_load(plan.read_text())
    assert saved["plan"]["mtp_layers"] == 0 and saved["model"]["num_nextn_predict_layers"] == 0  # the trained model
    r = cli("check", str(plan))
    assert r.code == 0 and "spec changes" not in r.out, r.out
    again = cli("estimate", "--plan", str(plan), "--json")
    assert again.code == 0, again.err
    assert again.json()["plan"]["mtp_layers"] == 0


def test_a_layout_with_m_is_refused_without_mtp(cli):
    # Megatron-LM validate_layer_layout: the layout's m count must equal mtp_num_layers (none without the flag)
    r = cli("estimate", "--model", "deepseek-v3", "--hardware", "dgx-h100", "--nodes", "128", "--tp", "2", "--pp",
            "8", "--ep", "64", "--etp", "1", "--global-batch", "8192", "--zero", "1", "--recompute", "full",
            "--pp-layout", "Et|(tt|)*30mL", "--vpp", "4", "--mtp-layers", "0")
    assert r.code == 2 and "holds 1 MTP layers (m) but deepseek-v3 trains 0" in r.err \
        and "drop the m symbols" in r.err, r.err
