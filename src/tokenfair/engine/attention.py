"""Attention over a paged KV cache: the single entry point is ``paged_attention``.

A step's batch is *flattened*: the query tokens of all sequences are concatenated
(``num_tokens`` rows). Sequence ``s`` owns rows ``query_starts[s]:query_starts[s+1]``
and, after this step's K/V have been written, holds ``context_lens[s]`` tokens in the
cache, stored in the blocks ``block_tables[s, :ceil(context_lens[s]/block_size)]``.
Its queries are the LAST ``query_len`` tokens of that context, so query row ``i`` of
sequence ``s`` sits at position ``context_lens[s] - query_len + i`` and may attend to
cache positions ``<= `` its own (causal inside a prefill chunk, full over the past).

Decode groups may carry a ``DecodeStage``: contiguous copies of the group's K/V kept across
steps, so a steady decode batch appends one token per sequence and layer instead of
gathering every cached block in every layer (the gather was about half of attention's time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


class StageBuffers:
    """Flat buffers of dropped decode stages, kept for the next ones.

    Memory the process has not touched before costs a page fault per page on first write:
    filling 190 MB of fresh buffers (a 32-sequence stage over 30 layers) took 41-44 ms, of
    reused ones 14 ms, and real stage-building steps ran ~1.9x the profile's prediction.
    Keeps at most ``max_spare`` buffers (the largest: any of them can hold a smaller stage);
    ``take`` is O(spares)."""

    def __init__(self, max_spare: int) -> None:
        self.max_spare = max_spare
        self.spare: list[torch.Tensor] = []   # 1-D, ascending numel
        self._scratch: torch.Tensor | None = None

    def scratch(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A contiguous ``shape`` view of one persistent buffer (grown when too small; the
        same memory every call, so only one user at a time: a layer's refill)."""
        need = math.prod(shape)
        flat = self._scratch
        if flat is None or flat.numel() < need or flat.dtype != like.dtype or flat.device != like.device:
            flat = self._scratch = torch.empty(need + need // 2, dtype=like.dtype, device=like.device)
        return flat[:need].view(shape)

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A 1-D buffer of at least ``prod(shape)`` elements of ``like``'s dtype and device:
        the smallest spare that fits, else a new one.  Its contents are arbitrary."""
        need = math.prod(shape)
        for i, flat in enumerate(self.spare):
            if flat.numel() >= need and flat.dtype == like.dtype and flat.device == like.device:
                return self.spare.pop(i)
        return torch.empty(need, dtype=like.dtype, device=like.device)

    def give(self, flats: list[torch.Tensor]) -> None:
        self.spare = sorted(self.spare + flats, key=torch.Tensor.numel)[-self.max_spare:] if self.max_spare else []

    @property
    def num_bytes(self) -> int:
        return sum(f.numel() * f.element_size() for f in self.spare)


class DecodeStage:
    """Contiguous K/V of one decode group: per layer ``[2, S, kv_heads, capacity, head_dim]``
    (head-major, so each attention head reads one contiguous run of keys).

    Row ``i`` holds the first ``lens[i]`` tokens of ``seq_ids[i]`` (copies of the pool's
    blocks, bit for bit).  It stays valid while the same sequences, in the same order, each
    gain exactly one token per step within ``capacity``; the runner rebuilds it otherwise and
    drops it when any sequence is freed, recomputed or swapped.  A refill copies whole blocks
    and zeroes the rest of each row: slots past a row's length are masked out, but must be
    finite (0 * a stale NaN or inf would not be 0).
    """

    def __init__(self, seq_ids: tuple[str, ...], pool: torch.Tensor, capacity: int,
                 spares: StageBuffers | None = None) -> None:
        num_layers, _, _, _, num_kv_heads, head_dim = pool.shape
        self.seq_ids = seq_ids
        shape = (2, len(seq_ids), num_kv_heads, capacity, head_dim)
        spares = self.spares = spares if spares is not None else StageBuffers(0)
        # one buffer per layer, each filled by that layer's refill
        self._flat = [spares.take(shape, pool) for _ in range(num_layers)]
        numel = math.prod(shape)
        self.buf = [flat[:numel].view(shape) for flat in self._flat]
        self.lens: torch.Tensor | None = None  # tokens held per row after the last step (CPU)

    def release(self, spares: StageBuffers) -> None:
        """Hand the buffers to ``spares`` for a later stage; this stage must not be used again."""
        spares.give(self._flat)
        self._flat, self.buf = [], []

    @property
    def capacity(self) -> int:
        return self.buf[0].shape[3]

    def append_slots(self, context_lens: torch.Tensor) -> torch.Tensor:
        """Flat slots ``[S * kv_heads]`` of each row's newest token (position ``len - 1``)
        in one layer's K (or V) buffer viewed as ``[S * kv_heads * capacity, head_dim]``."""
        num_seqs, num_kv_heads = self.buf[0].shape[1], self.buf[0].shape[2]
        heads = torch.arange(num_seqs)[:, None] * num_kv_heads + torch.arange(num_kv_heads)[None, :]
        return (heads * self.capacity + (context_lens - 1)[:, None]).reshape(-1)

    def can_append(self, context_lens: torch.Tensor) -> bool:
        """Whether a step bringing every row to ``context_lens`` only appends one token each."""
        return (self.lens is not None and int(context_lens.max()) <= self.capacity
                and torch.equal(self.lens + 1, context_lens))


@dataclass(frozen=True)
class StagePlan:
    """How a decode group uses its stage this step: ``refill`` copies the group's blocks in
    (after this step's K/V were written to them); otherwise each row's new K/V is copied to
    ``append_slots`` (``DecodeStage.append_slots``).  Keys are attended exactly as on the
    gather path, so results are bit-identical."""

    stage: DecodeStage
    refill: bool
    append_slots: torch.Tensor  # [S * kv_heads] long

    def to(self, device: torch.device) -> "StagePlan":
        return StagePlan(self.stage, self.refill, self.append_slots.to(device))


@dataclass(frozen=True)
class AttentionGroup:
    """Index tensors for a padded sub-batch of sequences (built once per step).

    ``token_index[s, i]`` is the flattened row of query ``i`` of sequence ``s`` (padding
    rows point at row 0 and are masked out via ``query_valid``); ``mask`` is the additive
    ``[num_seqs, 1, max_query_len, max_context_len]`` float mask, 0 where attention is
    allowed and -inf elsewhere (SDPA would convert a boolean mask in every layer); keys are
    attended up to the group's longest context, not to its last block's end.
    ``valid_rows`` = ``token_index[query_valid]``.  ``dense_start >= 0`` says the group's
    queries are exactly rows ``dense_start .. dense_start + S*Q`` in order (no padding; e.g.
    a decode-only group), so they are sliced instead of gathered and scattered.
    ``causal``: dense rows of sequences whose queries are their whole, equal-length context
    (prompts' first chunks): their keys are this step's own K/V, and SDPA's causal mask
    replaces ``mask`` (then ``[1, 1, 0, 0]``), skipping the masked half.
    """

    token_index: torch.Tensor  # [S, Q] long
    query_valid: torch.Tensor  # [S, Q] bool
    block_tables: torch.Tensor  # [S, max_blocks] long
    mask: torch.Tensor  # [S, 1, Q, max context] float: 0 or -inf
    valid_rows: torch.Tensor  # [num valid queries] long
    dense_start: int = -1
    stage: StagePlan | None = None  # decode groups only
    causal: bool = False
    num_keys: int = 0  # keys attended: the group's longest context

    def to(self, device: torch.device) -> "AttentionGroup":
        tensors = (self.token_index, self.query_valid, self.block_tables, self.mask, self.valid_rows)
        stage = None if self.stage is None else self.stage.to(device)
        return AttentionGroup(*(t.to(device) for t in tensors), self.dense_start, stage, self.causal, self.num_keys)


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
    max_context = int(context_lens.max())
    offsets = torch.arange(max_query_len)
    query_valid = offsets[None, :] < query_lens[:, None]
    token_index = torch.where(query_valid, query_starts[:, None] + offsets[None, :], 0)
    valid_rows = token_index[query_valid]
    dense_start = -1
    if bool(query_valid.all()):
        start = int(token_index[0, 0])
        if torch.equal(valid_rows, torch.arange(start, start + valid_rows.numel())):
            dense_start = start
    if 1 < max_query_len == max_context and bool((context_lens == max_query_len).all()) and dense_start >= 0:
        return AttentionGroup(token_index, query_valid, block_tables, torch.zeros(1, 1, 0, 0), valid_rows,
                              dense_start, causal=True, num_keys=max_context)
    query_pos = (context_lens - query_lens)[:, None] + offsets[None, :]  # [S, Q]
    key_pos = torch.arange(max_context)
    mask = key_pos[None, None, :] <= query_pos[:, :, None]
    # Padding query rows attend to position 0 only so softmax stays finite; they are dropped.
    mask = torch.where(query_valid[:, :, None], mask, key_pos[None, None, :] == 0)
    return AttentionGroup(
        token_index=token_index,
        query_valid=query_valid,
        block_tables=block_tables,
        mask=torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))[:, None, :, :],
        valid_rows=valid_rows,
        dense_start=dense_start,
        num_keys=max_context,
    )


def write_kv(kv_layer: torch.Tensor, new_kv: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter this step's K/V ``new_kv`` ``[2, T, kv_heads, head_dim]`` into ``kv_layer``
    ``[2, blocks, block_size, kv_heads, head_dim]`` (one copy for both)."""
    num_kv_heads, head_dim = kv_layer.shape[-2], kv_layer.shape[-1]
    kv_layer.view(2, -1, num_kv_heads, head_dim).index_copy_(1, slot_mapping, new_kv.to(kv_layer.dtype))


def _group_kv(group: AttentionGroup, new_kv: torch.Tensor, kv_layer: torch.Tensor,
              layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The group's keys and values, ``[S, kv_heads, max context, head_dim]`` each (``new_kv``:
    this step's, ``[2, T, kv_heads, head_dim]``, already in ``kv_layer``)."""
    num_seqs, max_blocks = group.block_tables.shape
    _, _, block_size, num_kv_heads, head_dim = kv_layer.shape
    length, num_keys = max_blocks * block_size, group.num_keys
    plan = group.stage
    if group.causal:  # whole prompts: their keys are this step's
        start = group.dense_start
        rows = new_kv[:, start:start + num_seqs * num_keys].to(kv_layer.dtype)
        rows = rows.view(2, num_seqs, num_keys, num_kv_heads, head_dim)
        return rows[0].transpose(1, 2), rows[1].transpose(1, 2)
    if plan is None:
        blocks = group.block_tables.reshape(-1)
        return tuple(kv_layer[kv].index_select(0, blocks).view(num_seqs, length, num_kv_heads, head_dim)
                     [:, :num_keys].transpose(1, 2) for kv in (0, 1))
    buf = plan.stage.buf[layer]  # [2, S, kv_heads, capacity, head_dim]
    if plan.refill:
        blocked = buf.view(2, num_seqs, num_kv_heads, -1, block_size, head_dim)[:, :, :, :max_blocks]
        # gathered through a persistent scratch buffer: a fresh temporary would page-fault
        gathered = plan.stage.spares.scratch((2, num_seqs * max_blocks) + tuple(kv_layer.shape[2:]), kv_layer)
        torch.index_select(kv_layer, 1, group.block_tables.reshape(-1), out=gathered)
        blocked.copy_(gathered.view(2, num_seqs, max_blocks, block_size, num_kv_heads, head_dim)
                      .permute(0, 1, 4, 2, 3, 5))
        buf[:, :, :, length:].zero_()
    else:  # a decode group's rows are dense: rows dense_start .. dense_start + S
        new = new_kv[:, group.dense_start:group.dense_start + num_seqs].reshape(2, -1, head_dim)
        buf.view(2, -1, head_dim).index_copy_(1, plan.append_slots, new.to(buf.dtype))
    return buf[0, :, :, :num_keys], buf[1, :, :, :num_keys]


def paged_attention(
    query: torch.Tensor,
    new_kv: torch.Tensor,
    kv_layer: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    layer: int = 0,
) -> torch.Tensor:
    """Write this step's K/V, then attend: flattened queries ``[T, num_heads, head_dim]``
    over the paged cache.

    ``new_kv`` ``[2, T, kv_heads, head_dim]`` (this step's keys and values; may be a view)
    go to ``metadata.slot_mapping`` of
    ``kv_layer``, layer ``layer`` of the pool, ``[2, num_blocks, block_size, kv_heads,
    head_dim]`` (and to decode stages). Returns ``[T, num_heads, head_dim]``.
    Implementation: each group's keys and values (its gathered blocks, or its decode stage),
    then one SDPA call per group.
    """
    write_kv(kv_layer, new_kv, metadata.slot_mapping)
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = kv_layer.shape[-2]
    out = None
    for group in metadata.groups:
        num_seqs = group.block_tables.shape[0]
        keys, values = _group_kv(group, new_kv, kv_layer, layer)
        start = group.dense_start
        num_queries = group.token_index.shape[1]
        if start >= 0:
            q = query[start:start + num_seqs * num_queries].view(num_seqs, num_queries, num_heads, head_dim)
        else:
            q = query[group.token_index]  # [S, Q, H, D]
        mask = None if group.causal else group.mask.to(keys.dtype)  # .to: no copy when it already is
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2).to(keys.dtype),
            keys,
            values,
            attn_mask=mask,
            is_causal=group.causal,
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
