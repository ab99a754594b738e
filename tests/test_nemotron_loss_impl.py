"""benchmarks/accuracy.py bridge_loss_impl on the Nemotron-3 rows (docs/validation.md#nemotron3).

NVIDIA-NeMo/Megatron-Bridge v0.6.0 src/megatron/bridge/perf_recipes/nemotronh/common.py: only
_apply_nemotron_3_ultra_perf_defaults calls _benchmark_common(cfg, cross_entropy_impl="native"); the Super
defaults call _benchmark_common(cfg), whose default is "te" (perf_recipes/_common.py), and the releases before
ran scripts/performance/utils/overrides.py (_set_common_perf_overrides: cross_entropy_fusion_impl = "te")."""

from __future__ import annotations

import accuracy as A  # benchmarks/ is on the path (conftest)
import pytest

ROWS = {
    "mbridge-26.08-pretrain-nemotron-3-ultra-dgx-gb200-256gpu-mxfp8-tp2pp1cp1ep64vpnagbs256mbs1": "native",
    "mbridge-26.08-pretrain-nemotron-3-super-dgx-gb200-64gpu-mxfp8-tp2pp1cp1ep64vpnagbs512mbs1": "te",
    "mbridge-26.04-pretrain-nemotron-3-super-dgx-b200-64gpu-nvfp4-tp2pp1cp1ep64vpnagbs512mbs1": "te",
}


@pytest.mark.parametrize("rid,impl", sorted(ROWS.items()))
def test_loss_impl_as_the_recipe_sets_it(published_runs, rid, impl):
    rec = published_runs[rid]
    assert A.bridge_loss_impl(rec, A.family(rid)) == impl


def test_nano_and_lightning_rows_read_te(published_runs):
    rows = [r for r in published_runs if r.startswith("mbridge-") and
            ("nemotron-3-nano" in r or "nemotron-3-5-lightning" in r)]
    assert len(rows) >= 20
    assert {A.bridge_loss_impl(published_runs[r], A.family(r)) for r in rows} == {"te"}
