"""How a step's rows are grouped into attention calls: attention pads each group to its
longest query and context, so rows are bucketed to keep the padding small."""

from __future__ import annotations

import torch

# a prefill row joins the current group while that pads at most this many query-key pairs
# (an extra attention call costs about what ~2,000 padded pairs do)
MAX_PREFILL_PAD_PAIRS = 64 * 64
DECODE_BLOCKS_SLACK = 8     # a decode bucket spans contexts within 2x, or this many blocks


def decode_buckets(context_lens: torch.Tensor, is_decode: torch.Tensor, block_size: int) -> list[torch.Tensor]:
    """Split the single-token rows (a prefix sorted by context) into buckets whose
    contexts are within 2x of each other: attention pads each bucket to its longest
    context, so one long sequence no longer pads every short one."""
    num = int(is_decode.sum())
    if num == 0:
        return []
    blocks = ((context_lens[:num] + block_size - 1) // block_size).tolist()
    buckets, start = [], 0
    for i in range(1, num):
        if blocks[i] > max(2 * blocks[start], blocks[start] + DECODE_BLOCKS_SLACK):
            buckets.append(torch.arange(start, i))
            start = i
    buckets.append(torch.arange(start, num))
    return buckets


def prefill_buckets(query_lens: torch.Tensor, context_lens: torch.Tensor,
                    is_decode: torch.Tensor) -> list[torch.Tensor]:
    """Group the multi-token rows so padding stays small: attention pads a group to
    ``S x longest query x longest context``, so a 6-token prompt beside a 713-token one
    was attended as a second 713 x 713 (a step with prompts of [514, 713, 105, 6] tokens
    took 2.54 s as one group, 1.74 s bucketed).  Longest context first; a row joins the
    current group while that pads at most ``MAX_PREFILL_PAD_PAIRS`` query-key pairs, so only
    tiny or equal prompts share a call.  O(P log P) for P prefill rows."""
    rows = (~is_decode).nonzero().flatten().tolist()
    q, k = query_lens.tolist(), context_lens.tolist()
    rows.sort(key=lambda i: (-k[i], -q[i], i))
    buckets: list[list[int]] = []
    max_q = own = 0  # the current group's longest query and its rows' sum of q x k
    for i in rows:
        if buckets and (len(buckets[-1]) + 1) * max(max_q, q[i]) * k[buckets[-1][0]] - (own + q[i] * k[i]) \
                <= MAX_PREFILL_PAD_PAIRS:
            buckets[-1].append(i)
            max_q, own = max(max_q, q[i]), own + q[i] * k[i]
        else:
            buckets.append([i])
            max_q, own = q[i], q[i] * k[i]
    return [torch.tensor(sorted(b), dtype=torch.long) for b in buckets]
