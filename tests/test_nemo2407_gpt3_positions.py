"""NeMo 24.07's GPT-3 pretraining rows as benchmarks/accuracy.py reads them (NEMO2407_GPT3): learned absolute
position embeddings, a table of the configs' 2,048 positions, and no rotary passes.

Source: NVIDIA/NeMo-Framework-Launcher tag 24.07 (8325688d83) launcher_scripts/conf/training/gpt3/{5b,20b,175b}.yaml
(no position_embedding_type; encoder_seq_length and max_position_embeddings 2048), while its llama/*.yaml and
nemotron/*.yaml set `position_embedding_type: rope`; NVIDIA/NeMo r2.0.0rc1 (579983fbfc)
nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py builds the Megatron-Core GPT with
position_embedding_type=self.cfg.get('position_embedding_type', 'learned_absolute'). docs/validation.md#fit-stability"""

from __future__ import annotations

import pytest

from llmplan.cost.params import param_counts

GPT3 = ["nemo2407-pretrain-gpt3-5b-64gpu-gbs2048", "nemo2407-pretrain-gpt3-20b-64gpu-gbs256",
        "nemo2407-pretrain-gpt3-175b-128gpu-gbs256", "nemo2407-pretrain-gpt3-175b-512gpu-gbs2048"]
ROPE = ["nemo2407-pretrain-llama2-7b-8gpu-gbs128", "nemo2407-pretrain-llama3-70b-64gpu-gbs128",
        "nemo2407-pretrain-nemotron-8b-64gpu-gbs256"]


@pytest.mark.parametrize("rid", GPT3)
def test_nemo2407_gpt3_rows_read_learned_absolute_positions(acc, published_runs, rid):
    m = acc.model_for(published_runs[rid], "nemo2407")
    assert m.learned_position_embeddings and m.max_position_embeddings == 2048


@pytest.mark.parametrize("rid", ROPE)
def test_nemo2407_llama_and_nemotron_rows_keep_rotary(acc, published_runs, rid):
    assert not acc.model_for(published_runs[rid], "nemo2407").learned_position_embeddings


def test_the_20b_embedding_holds_the_position_table(acc, published_runs):
    # By hand from the 20b.yaml shape: a tied 50,304 x 6,144 word table plus 2,048 x 6,144 positions.
    m = acc.model_for(published_runs["nemo2407-pretrain-gpt3-20b-64gpu-gbs256"], "nemo2407")
    assert int(param_counts(m).embedding) == 50304 * 6144 + 2048 * 6144
