"""Static description of a Llama-architecture decoder.

Invariants (checked in ``__post_init__``):
  * every size is a positive integer;
  * ``num_heads`` is a multiple of ``num_kv_heads`` (grouped-query attention);
  * ``head_dim`` is even (rotary embeddings rotate pairs of dimensions);
  * ``bos_token_id`` / ``eos_token_ids`` lie inside ``[0, vocab_size)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


class ConfigError(ValueError):
    """Raised when a model description is inconsistent or unsupported."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position: int = 2048
    tie_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ConfigError(f"rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ConfigError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        token_ids = list(self.eos_token_ids)
        if self.bos_token_id is not None:
            token_ids.append(self.bos_token_id)
        for token_id in token_ids:
            if not 0 <= token_id < self.vocab_size:
                raise ConfigError(f"special token id {token_id} outside vocab of {self.vocab_size}")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` of a Llama-family model.

        Only plain (unscaled) RoPE is supported; anything else raises ConfigError
        rather than silently producing wrong logits.
        """
        arch = raw.get("model_type", "llama")
        if arch not in ("llama", "mistral", "qwen2") and arch is not None:
            raise ConfigError(f"unsupported model_type {arch!r}")
        if raw.get("attention_bias") or raw.get("mlp_bias"):
            raise ConfigError("attention/mlp biases are not supported")
        rope = dict(raw.get("rope_parameters") or {})
        scaling = raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        if rope_type not in (None, "default"):
            raise ConfigError(f"unsupported rope scaling {rope_type!r}")
        rope_theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        hidden = int(raw["hidden_size"])
        num_heads = int(raw["num_attention_heads"])
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden // num_heads),
            rope_theta=float(rope_theta),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position=int(raw.get("max_position_embeddings", 2048)),
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
