"""Llama-architecture decoder (GQA, RoPE, RMSNorm, SwiGLU) over a flattened batch.

Parameter names mirror Hugging Face's ``LlamaForCausalLM`` minus the ``model.`` prefix
(``embed_tokens.weight``, ``layers.{i}.self_attn.q_proj.weight``, ..., ``norm.weight``,
``lm_head.weight``), so an HF state dict maps onto it by stripping that prefix.

Invariants of ``forward``: the input holds ``T`` tokens of ``S`` sequences; K/V of all
``T`` tokens are written to the cache slots in ``metadata.slot_mapping`` before attention
reads them; the output holds logits for the rows in ``logits_indices`` only (``[S, vocab]``).

``LlamaDecoder.optimize_for_inference()`` (called by ``ModelRunner``) fuses q/k/v and
gate/up into single matmuls and, in float32, stores every projection weight transposed
(``[in, out]`` contiguous), which CPU GEMM runs up to 2x faster at decode batch sizes.
The math is unchanged; the HF-named parameters are replaced by the fused buffers.
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

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) for ``positions`` ``[T]``, shaped ``[T, 1, head_dim]`` (once per step)."""
        return (self.cos.index_select(0, positions)[:, None, :].to(dtype),
                self.sin.index_select(0, positions)[:, None, :].to(dtype))

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` of shape ``[T, heads, head_dim]`` by per-token ``positions`` ``[T]``."""
        return self.apply(x, *self.tables(positions, x.dtype))


class PackedLinear(nn.Module):
    """``y = x @ W^T`` for a frozen weight ``W`` [out, in], stored as ``W^T`` contiguous when
    ``transposed`` (faster float32 GEMM on CPU) or as ``W`` otherwise."""

    def __init__(self, weight: torch.Tensor, transposed: bool) -> None:
        super().__init__()
        self.transposed = transposed
        w = weight.detach()
        self.register_buffer("packed", (w.t() if transposed else w).contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.packed if self.transposed else F.linear(x, self.packed)


def _pack(linears: list[nn.Linear], transposed: bool) -> PackedLinear:
    return PackedLinear(torch.cat([m.weight for m in linears]) if len(linears) > 1 else linears[0].weight, transposed)


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
        self.qkv: PackedLinear | None = None
        self.qkv_sizes = (config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim,
                          config.num_kv_heads * config.head_dim)

    def pack(self, transposed: bool) -> None:
        self.qkv = _pack([self.q_proj, self.k_proj, self.v_proj], transposed)
        self.o_proj = _pack([self.o_proj], transposed)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(
        self,
        hidden: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        kv_layer: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        cos, sin = rope_tables
        if self.qkv is not None:  # q and k heads are adjacent: rotate them in one go
            qkv = self.qkv(hidden)
            qk_width = self.qkv_sizes[0] + self.qkv_sizes[1]
            qk = RotaryEmbedding.apply(
                qkv[:, :qk_width].reshape(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim), cos, sin)
            q, k = qk[:, :self.num_heads], qk[:, self.num_heads:]
            v = qkv[:, qk_width:].reshape(num_tokens, self.num_kv_heads, self.head_dim)
        else:
            q = RotaryEmbedding.apply(self.q_proj(hidden).view(num_tokens, self.num_heads, self.head_dim), cos, sin)
            k = RotaryEmbedding.apply(self.k_proj(hidden).view(num_tokens, self.num_kv_heads, self.head_dim), cos, sin)
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
        self.gate_up: PackedLinear | None = None

    def pack(self, transposed: bool) -> None:
        self.gate_up = _pack([self.gate_proj, self.up_proj], transposed)
        self.down_proj = _pack([self.down_proj], transposed)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, hidden, rope_tables, kv_layer, metadata):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rope_tables, kv_layer, metadata)
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
        self.output_packed: PackedLinear | None = None

    def output_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def optimize_for_inference(self) -> "LlamaDecoder":
        """Fuse q/k/v and gate/up; in float32 also store weights transposed. Idempotent."""
        if getattr(self, "_packed", False):
            return self
        transposed = self.embed_tokens.weight.dtype == torch.float32
        for layer in self.layers:
            layer.self_attn.pack(transposed)
            layer.mlp.pack(transposed)
        if transposed:  # a transposed copy of the output matrix (tied embeddings stay for lookup)
            self.output_packed = PackedLinear(self.output_weight(), True)
        self._packed = True
        return self

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
        rope_tables = self.rope.tables(positions, hidden.dtype)
        for layer_index, layer in enumerate(self.layers):
            hidden = layer(hidden, rope_tables, kv_cache[layer_index], metadata)
        last = self.norm(hidden[logits_indices])
        if self.output_packed is not None:
            return self.output_packed(last).float()
        return F.linear(last, self.output_weight()).float()
