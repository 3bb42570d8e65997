"""Model shapes and presets."""

import pytest

from tinyllama.config import PRESETS, ModelConfig, get_preset, make_config
from tinyllama.models import build


def test_medium_is_the_shape_measured_in_the_brief():
    preset = get_preset("medium")
    m = preset.model
    assert (m.vocab_size, m.hidden_dim, m.num_layers, m.num_heads, m.num_kv_heads, m.intermediate_dim) == (
        1000, 1024, 12, 8, 4, 4096)
    assert (preset.batch_size, preset.seq_len) == (16, 512)


def test_every_preset_has_a_valid_shape_and_its_sequence_fits():
    assert {"ci", "tiny", "small", "medium", "large"} <= set(PRESETS)
    for name, preset in PRESETS.items():
        assert preset.seq_len <= preset.model.max_seq_len, name
        assert preset.model.head_dim * preset.model.num_heads == preset.model.hidden_dim


@pytest.mark.parametrize("name", ["ci", "tiny", "small"])
def test_parameter_count_formula_matches_the_built_model(name):
    config = get_preset(name).model
    model = build("v1", config)
    assert sum(p.numel() for p in model.parameters()) == config.num_parameters()


def test_hidden_not_divisible_by_heads_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        ModelConfig(hidden_dim=100, num_heads=8)


def test_heads_not_divisible_by_kv_heads_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="not divisible by num_kv_heads"):
        ModelConfig(hidden_dim=96, num_heads=6, num_kv_heads=4)


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="choose one of ci, tiny"):
        get_preset("huge")


def test_overrides_replace_fields_and_none_keeps_the_preset():
    config = make_config("tiny", hidden_dim=512, num_layers=None)
    assert config.hidden_dim == 512 and config.num_layers == get_preset("tiny").model.num_layers
    with pytest.raises(ValueError, match="unknown model settings"):
        make_config("tiny", hiden_dim=3)
