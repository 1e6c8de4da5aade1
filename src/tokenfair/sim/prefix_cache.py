"""One replica's prefix cache: block hashes in LRU order, hit counts (simulation only).

A request carries ``prefix_hashes``: one hash per ``block_tokens``-token block of its prompt
from the start (Mooncake's ``hash_ids``, 512-token blocks; equal hashes = equal prefix).  On
the replica the request lands on, its *cached prefix* is the longest run of leading blocks
the cache holds; those blocks are touched (most recently used), the rest inserted, and the
least recently used blocks beyond ``capacity_blocks`` evicted.  A request's cached tokens
are ``min(hits x block_tokens, prompt_tokens - 1)``: at least one prompt token is computed,
so a first token can be sampled.

Model (stated, not measured): the cache is a store of its own, ``capacity_blocks`` blocks,
beside the KV pool the scheduler manages (a running request still holds KV blocks for its
whole prompt); a request's blocks enter the cache when it lands, not when its prefill ends.
The engine charges only the uncached prefill (``SimEngine.cached_tokens``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

MOONCAKE_BLOCK_TOKENS = 512


class PrefixCache:
    def __init__(self, capacity_blocks: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        if capacity_blocks < 0 or block_tokens < 1:
            raise ValueError(f"prefix cache: capacity_blocks >= 0 and block_tokens >= 1, got "
                             f"{capacity_blocks}, {block_tokens}")
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self._lru: OrderedDict[int, None] = OrderedDict()     # oldest first; len <= capacity
        self.num_lookups = 0            # requests that carried hashes
        self.num_blocks_asked = 0       # their blocks
        self.num_blocks_hit = 0         # of which cached
        self.num_tokens_hit = 0         # cached tokens charged as such
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._lru)

    def peek(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` held now (no change): what a prefix-aware router reads."""
        lru = self._lru
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def lookup_and_insert(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """The request lands here: count its cached prefix, touch and insert its blocks, evict
        beyond capacity; returns its cached tokens.  O(blocks)."""
        if not hashes:
            return 0
        hits = self.peek(hashes)
        lru = self._lru
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > self.capacity_blocks:
            lru.popitem(last=False)
            self.num_evicted += 1
        cached = min(hits * self.block_tokens, prompt_tokens - 1)
        self.num_lookups += 1
        self.num_blocks_asked += len(hashes)
        self.num_blocks_hit += hits
        self.num_tokens_hit += cached
        return cached

    @property
    def hit_rate(self) -> float | None:
        """Cached blocks / blocks asked (None: no request carried hashes)."""
        return self.num_blocks_hit / self.num_blocks_asked if self.num_blocks_asked else None

    def report(self) -> dict:
        return {"capacity_blocks": self.capacity_blocks, "block_tokens": self.block_tokens,
                "lookups": self.num_lookups, "blocks_asked": self.num_blocks_asked,
                "blocks_hit": self.num_blocks_hit, "tokens_hit": self.num_tokens_hit,
                "evicted_blocks": self.num_evicted, "hit_rate": self.hit_rate}
