"""NeMo 24.07's pretraining rows (nemo2407) as benchmarks/accuracy.py reads their output layer: the Nemotron-4
rows untied (NEMO2407_NEMOTRON), checked against the parameter count the Nemotron-4 340B report publishes; the
GPT-3 rows tied and the Llama rows untied, as their launcher configs set them.

Sources: NVIDIA/NeMo-Framework-Launcher tag 24.07 (8325688d83) launcher_scripts/conf/training/nemotron/*.yaml
(share_embeddings_and_output_weights: false), gpt3/{5b,20b,175b}.yaml (unset: NeMo r2.0.0rc1's default True,
megatron_gpt_model.py cfg.get('share_embeddings_and_output_weights', True)), llama/*.yaml (false); Nemotron-4
340B Technical Report (arXiv:2406.11704), section 2.1: 9.4 billion embedding parameters and 331.6 billion
non-embedding parameters."""

from __future__ import annotations

from llmplan.cost.params import param_counts, rank_params

ROW_340B = "nemo2407-pretrain-nemotron-340b-128gpu-gbs32"


def test_nemotron_340b_counts_the_reports_embedding_and_other_parameters(acc, published_runs):
    # Tolerance: half a unit of the report's last digit (0.05B; the counts are rounded to 0.1B). The untied
    # input and output layers count 2 x 256,000 x 18,432 = 9.437B; tied, 4.72B would miss 9.4.
    m = acc.model_for(published_runs[ROW_340B], "nemo2407")
    pc = param_counts(m)
    assert not m.tie_word_embeddings
    assert abs((pc.embedding + pc.output) / 1e9 - 9.4) <= 0.05, pc.embedding + pc.output
    assert abs((pc.total - pc.embedding - pc.output) / 1e9 - 331.6) <= 0.05, pc.total


def test_nemotron_8b_last_rank_holds_its_output_layer_shard(acc, published_runs):
    # The 8B row at TP 2, PP 1: a rank holds 256,000 x 4,096 / 2 = 524,288,000 output-layer parameters beside
    # the same number of input-embedding ones (the vocabulary 256,000 divides by 128 x TP).
    rec = published_runs["nemo2407-pretrain-nemotron-8b-64gpu-gbs256"]
    m, _, plan = acc.record_setup(rec, "nemo2407", None)
    tied = m.model_copy(update={"tie_word_embeddings": True})
    assert plan.tp == 2 and plan.pp == 1
    assert float(rank_params(m, plan, 0).total - rank_params(tied, plan, 0).total) == 524_288_000


def test_nemo2407_tie_flags_follow_their_configs(acc, published_runs):
    for rid, rec in published_runs.items():
        if not rid.startswith("nemo2407-pretrain-") or not acc.described(rec):
            continue
        m = acc.model_for(rec, "nemo2407")
        assert m.tie_word_embeddings == ("-gpt3-" in rid), rid


def test_nemotron_22b_reads_its_launcher_config(acc, published_runs):
    # NeMo-Framework-Launcher tag 24.07 (8325688d83) conf/training/nemotron/nemotron_22b.yaml: num_layers 40,
    # hidden_size 6144, ffn_hidden_size 24576 (ungated squared ReLU), num_attention_heads 48, num_query_groups null,
    # bias false, share_embeddings_and_output_weights false, layernorm1p (weight and bias), rope (no position
    # table). By hand: 12 L h^2 (4h^2 attention + 2 x h x 4h MLP) + 2 V h (untied) + (4L + 2) h (two norms a
    # layer and the final one, 2h each) = 18,119,393,280 + 3,145,728,000 + 995,328 = 21,266,116,608.
    rec = published_runs["nemo2407-pretrain-nemotron-22b-64gpu-gbs256"]
    m = acc.model_for(rec, "nemo2407")
    assert (m.num_hidden_layers, m.hidden_size, m.intermediate_size, m.num_attention_heads) == (40, 6144, 24576, 48)
    assert m.num_key_value_heads in (None, 48)
    assert not (m.tie_word_embeddings or m.attention_bias or m.mlp_bias or m.gated_mlp)
    L, h, V = 40, 6144, 256_000
    assert float(param_counts(m).total) == 12 * L * h * h + 2 * V * h + (4 * L + 2) * h
    # scored now (it used to be skipped for want of dimensions)
    assert [k for k, *_ in acc.predict(rec, "nemo2407")] == ["model TFLOP/s", "fits"]
