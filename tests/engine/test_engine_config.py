from __future__ import annotations

import pytest

from tokenfair.engine.config import ConfigError, ModelConfig

BASE = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)


def test_valid_config():
    config = ModelConfig(**BASE, eos_token_ids=[2])
    assert config.num_queries_per_kv == 2 and config.eos_token_ids == (2,)


@pytest.mark.parametrize(
    "override",
    [{"num_kv_heads": 3}, {"head_dim": 15}, {"vocab_size": 0}, {"rope_theta": 0.0}, {"bos_token_id": 100}, {"num_layers": 1.5}],
)
def test_invalid_config(override):
    with pytest.raises(ConfigError):
        ModelConfig(**{**BASE, **override})


def test_rope_scaling_rejected():
    raw = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "vocab_size": 100, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    with pytest.raises(ConfigError):
        ModelConfig.from_hf_dict(raw)
    raw.pop("rope_scaling")
    assert ModelConfig.from_hf_dict(raw).num_kv_heads == 4
