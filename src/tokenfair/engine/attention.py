"""Attention over a paged KV cache: the single entry point is ``paged_attention``.

A step's batch is *flattened*: the query tokens of all sequences are concatenated
(``num_tokens`` rows). Sequence ``s`` owns rows ``query_starts[s]:query_starts[s+1]``
and, after this step's K/V have been written, holds ``context_lens[s]`` tokens in the
cache, stored in the blocks ``block_tables[s, :ceil(context_lens[s]/block_size)]``.
Its queries are the LAST ``query_len`` tokens of that context, so query row ``i`` of
sequence ``s`` sits at position ``context_lens[s] - query_len + i`` and may attend to
cache positions ``<= `` its own (causal inside a prefill chunk, full over the past).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AttentionGroup:
    """Index tensors for a padded sub-batch of sequences (built once per step).

    ``token_index[s, i]`` is the flattened row of query ``i`` of sequence ``s`` (padding
    rows point at row 0 and are masked out via ``query_valid``); ``mask`` is
    ``[num_seqs, 1, max_query_len, max_context_len]`` with True where attention is allowed.
    ``valid_rows`` = ``token_index[query_valid]``.  ``dense_start >= 0`` says the group's
    queries are exactly rows ``dense_start .. dense_start + S*Q`` in order (no padding; e.g.
    a decode-only group), so they are sliced instead of gathered and scattered.
    """

    token_index: torch.Tensor  # [S, Q] long
    query_valid: torch.Tensor  # [S, Q] bool
    block_tables: torch.Tensor  # [S, max_blocks] long
    mask: torch.Tensor  # [S, 1, Q, max_blocks * block_size] bool
    valid_rows: torch.Tensor  # [num valid queries] long
    dense_start: int = -1

    def to(self, device: torch.device) -> "AttentionGroup":
        tensors = (self.token_index, self.query_valid, self.block_tables, self.mask, self.valid_rows)
        return AttentionGroup(*(t.to(device) for t in tensors), self.dense_start)


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-step metadata shared by every layer.

    ``slot_mapping[t]`` is the flat cache slot (``block * block_size + offset``) the K/V of
    flattened token ``t`` are written to. ``groups`` partition the sequences (decode-only
    sequences and prefill sequences are padded separately so one long prefill does not
    pad every single-token decode); every flattened token belongs to exactly one group.
    """

    slot_mapping: torch.Tensor  # [T] long
    groups: tuple[AttentionGroup, ...]
    num_tokens: int


def build_attention_group(
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_starts: torch.Tensor,
    query_lens: torch.Tensor,
    block_size: int,
) -> AttentionGroup:
    """Vectorised construction of the padded index tensors for one group of sequences."""
    max_query_len = int(query_lens.max())
    max_context = block_tables.shape[1] * block_size
    offsets = torch.arange(max_query_len)
    query_valid = offsets[None, :] < query_lens[:, None]
    token_index = torch.where(query_valid, query_starts[:, None] + offsets[None, :], 0)
    query_pos = (context_lens - query_lens)[:, None] + offsets[None, :]  # [S, Q]
    key_pos = torch.arange(max_context)
    mask = key_pos[None, None, :] <= query_pos[:, :, None]
    # Padding query rows attend to position 0 only so softmax stays finite; they are dropped.
    mask = torch.where(query_valid[:, :, None], mask, key_pos[None, None, :] == 0)
    valid_rows = token_index[query_valid]
    dense_start = -1
    if bool(query_valid.all()):
        start = int(token_index[0, 0])
        if torch.equal(valid_rows, torch.arange(start, start + valid_rows.numel())):
            dense_start = start
    return AttentionGroup(
        token_index=token_index,
        query_valid=query_valid,
        block_tables=block_tables,
        mask=mask[:, None, :, :],
        valid_rows=valid_rows,
        dense_start=dense_start,
    )


def write_kv(
    kv_layer: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter this step's K/V ``[T, kv_heads, head_dim]`` into ``kv_layer`` [2, blocks, bs, kvh, d]."""
    num_kv_heads, head_dim = kv_layer.shape[-2], kv_layer.shape[-1]
    kv_layer[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(kv_layer.dtype))
    kv_layer[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(kv_layer.dtype))


def paged_attention(
    query: torch.Tensor,
    kv_layer: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Attention of flattened queries ``[T, num_heads, head_dim]`` over the paged cache.

    ``kv_layer`` is one layer of the pool, ``[2, num_blocks, block_size, kv_heads, head_dim]``,
    already containing this step's K/V. Returns ``[T, num_heads, head_dim]``.
    Implementation: gather each sequence's blocks, then one SDPA call per group.
    """
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = kv_layer.shape[-2]
    out = None
    for group in metadata.groups:
        num_seqs, max_blocks = group.block_tables.shape
        blocks = group.block_tables.reshape(-1)
        keys = kv_layer[0].index_select(0, blocks).view(num_seqs, -1, num_kv_heads, head_dim)
        values = kv_layer[1].index_select(0, blocks).view(num_seqs, -1, num_kv_heads, head_dim)
        start = group.dense_start
        num_queries = group.token_index.shape[1]
        if start >= 0:
            q = query[start:start + num_seqs * num_queries].view(num_seqs, num_queries, num_heads, head_dim)
        else:
            q = query[group.token_index]  # [S, Q, H, D]
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2).to(keys.dtype),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=group.mask,
            scale=scale,
            enable_gqa=num_heads != num_kv_heads,
        ).transpose(1, 2)  # [S, Q, H, D]
        if start == 0 and num_seqs * num_queries == num_tokens:
            return attended.reshape(num_tokens, num_heads, head_dim).to(query.dtype)  # one dense group
        if out is None:
            out = query.new_empty(num_tokens, num_heads, head_dim)
        if start >= 0:
            out[start:start + num_seqs * num_queries] = attended.reshape(-1, num_heads, head_dim).to(out.dtype)
        else:
            out[group.valid_rows] = attended[group.query_valid].to(out.dtype)
    return out
