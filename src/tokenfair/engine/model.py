"""Llama-architecture decoder (GQA, RoPE, RMSNorm, SwiGLU) over a flattened batch.

Parameter names mirror Hugging Face's ``LlamaForCausalLM`` minus the ``model.`` prefix
(``embed_tokens.weight``, ``layers.{i}.self_attn.q_proj.weight``, ..., ``norm.weight``,
``lm_head.weight``), so an HF state dict maps onto it by stripping that prefix.

Invariants of ``forward``: the input holds ``T`` tokens of ``S`` sequences; K/V of all
``T`` tokens are written to the cache slots in ``metadata.slot_mapping`` before attention
reads them; the output holds logits for the rows in ``logits_indices`` only (``[S, vocab]``).
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from .attention import AttentionMetadata, paged_attention, write_kv
from .config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """HF ``rotate_half`` convention: dims ``[0, d/2)`` pair with ``[d/2, d)``."""

    def __init__(self, head_dim: int, theta: float, max_position: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` of shape ``[T, heads, head_dim]`` by per-token ``positions`` ``[T]``."""
        cos = self.cos[positions][:, None, :].to(x.dtype)
        sin = self.sin[positions][:, None, :].to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        self.q_proj = nn.Linear(config.hidden_size, config.num_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.hidden_size, bias=False)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        kv_layer: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q = rope(self.q_proj(hidden).view(num_tokens, self.num_heads, self.head_dim), positions)
        k = rope(self.k_proj(hidden).view(num_tokens, self.num_kv_heads, self.head_dim), positions)
        v = self.v_proj(hidden).view(num_tokens, self.num_kv_heads, self.head_dim)
        write_kv(kv_layer, k, v, metadata.slot_mapping)
        attended = paged_attention(q, kv_layer, metadata, self.scale)
        return self.o_proj(attended.reshape(num_tokens, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, hidden, positions, rope, kv_layer, metadata):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), positions, rope, kv_layer, metadata)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaDecoder(nn.Module):
    """The full decoder. ``kv_cache`` is the pool ``[layers, 2, blocks, block_size, kv_heads, head_dim]``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position)
        if config.tie_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """``token_ids``/``positions``: ``[T]`` long. Returns float32 logits ``[len(logits_indices), vocab]``."""
        hidden = self.embed_tokens(token_ids)
        for layer_index, layer in enumerate(self.layers):
            hidden = layer(hidden, positions, self.rope, kv_cache[layer_index], metadata)
        last = self.norm(hidden[logits_indices])
        return F.linear(last, self.output_weight()).float()
