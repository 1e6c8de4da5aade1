"""Paged KV cache: a block pool on the compute device plus a host-side swap pool.

Device pool tensor: ``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]``.
Host pool tensor: the same layout with ``num_host_blocks`` blocks, on the CPU.

Invariants (``check_invariants`` asserts all of them):
  * every device block is either free (on the free list exactly once, refcount 0) or
    owned (refcount > 0, not on the free list) -- no leaks, no double frees;
  * a device block's refcount equals the number of block-table entries naming it
    (``fork`` shares blocks; a write into a shared block copies it first);
  * a sequence holding ``n`` tokens has exactly ``ceil(n / block_size)`` blocks;
  * a sequence lives in at most one of the two pools; host blocks are never shared.
Queries (``can_*``) never mutate; mutations raise ``CacheFullError`` when the matching
query would have said no, leaving the cache unchanged.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch


class CacheFullError(RuntimeError):
    """Not enough free blocks for the requested mutation (nothing was changed)."""


@dataclass(frozen=True)
class TransferStats:
    """Outcome of a swap: ``bytes_moved`` and measured wall ``seconds`` of the copy."""

    bytes_moved: int
    seconds: float


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def device_memory_bytes(device: torch.device) -> int:
    """The memory a KV pool on ``device`` can take at most: the GPU's, or the machine's."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(num_bytes: int, num_tokens: int, device: torch.device) -> None:
    """A ValueError naming the capacity when a KV pool of ``num_bytes`` cannot fit ``device``
    (before torch tries, and fails with a traceback, or the block lists take the memory)."""
    have = device_memory_bytes(device)
    if num_bytes > have:
        raise ValueError(f"a KV cache of {num_tokens:,} tokens needs {num_bytes / 1e9:,.1f} GB, more than the "
                         f"{have / 1e9:,.1f} GB of {device.type} memory here; lower the KV capacity (--kv-tokens)")


class PagedKVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int = 16,
        num_host_blocks: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        check_fits(num_layers * 2 * num_blocks * block_size * num_kv_heads * head_dim * dtype.itemsize,
                   num_blocks * block_size, torch.device(device))
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_host_blocks = num_blocks if num_host_blocks is None else num_host_blocks
        self.device = torch.device(device)
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
        self.pool = torch.zeros(shape, dtype=dtype, device=self.device)
        host_shape = (num_layers, 2, self.num_host_blocks, block_size, num_kv_heads, head_dim)
        # torch.empty: untouched host pages cost no resident memory until a swap uses them.
        self.host_pool = torch.empty(
            host_shape, dtype=dtype, device="cpu", pin_memory=self.device.type == "cuda"
        )
        self.bytes_per_block = self.pool[:, :, 0].numel() * self.pool.element_size()
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() yields 0, 1, 2...
        self._refcount = [0] * num_blocks
        self._tables: dict[str, list[int]] = {}
        self._num_tokens: dict[str, int] = {}
        self._host_free: list[int] = list(range(self.num_host_blocks - 1, -1, -1))
        self._host_tables: dict[str, list[int]] = {}
        self._host_num_tokens: dict[str, int] = {}

    # ----------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_free_host_blocks(self) -> int:
        return len(self._host_free)

    def has_seq(self, seq_id: str) -> bool:
        return seq_id in self._tables

    def is_swapped(self, seq_id: str) -> bool:
        return seq_id in self._host_tables

    def num_tokens(self, seq_id: str) -> int:
        """Tokens stored on the device for ``seq_id`` (0 when unknown)."""
        return self._num_tokens.get(seq_id, 0)

    def block_table(self, seq_id: str) -> list[int]:
        return list(self._tables.get(seq_id, ()))

    def free_block_ids(self) -> list[int]:
        return list(self._free)

    def blocks_needed(self, seq_id: str, num_tokens: int) -> int:
        """Free blocks that ``allocate(seq_id, num_tokens)`` would take (incl. copy-on-write)."""
        held = self._num_tokens.get(seq_id, 0)
        table = self._tables.get(seq_id, [])
        needed = _blocks_for(held + num_tokens, self.block_size) - len(table)
        writes_into_shared_tail = (
            num_tokens > 0 and held % self.block_size != 0 and self._refcount[table[-1]] > 1
        )
        return needed + int(writes_into_shared_tail)

    def can_allocate(self, seq_id: str, num_tokens: int) -> bool:
        """Whether ``allocate(seq_id, num_tokens)`` would succeed."""
        if seq_id in self._host_tables or num_tokens < 0:
            return False
        return self.blocks_needed(seq_id, num_tokens) <= len(self._free)

    def can_swap_out(self, seq_id: str) -> bool:
        return seq_id in self._tables and len(self._tables[seq_id]) <= len(self._host_free)

    def can_swap_in(self, seq_id: str) -> bool:
        return seq_id in self._host_tables and len(self._host_tables[seq_id]) <= len(self._free)

    # --------------------------------------------------------------- mutations
    def allocate(self, seq_id: str, num_tokens: int) -> None:
        """Reserve room for ``num_tokens`` more tokens of ``seq_id`` (new or existing).

        Copy-on-write: if the partially filled tail block is shared, it is copied first.
        """
        if not self.can_allocate(seq_id, num_tokens):
            raise CacheFullError(f"cannot allocate {num_tokens} tokens for {seq_id!r}")
        table = self._tables.setdefault(seq_id, [])
        held = self._num_tokens.get(seq_id, 0)
        if num_tokens > 0 and held % self.block_size != 0 and self._refcount[table[-1]] > 1:
            shared = table[-1]
            private = self._take_block()
            self.pool[:, :, private] = self.pool[:, :, shared]
            self._refcount[shared] -= 1
            table[-1] = private
        for _ in range(_blocks_for(held + num_tokens, self.block_size) - len(table)):
            table.append(self._take_block())
        self._num_tokens[seq_id] = held + num_tokens

    def fork(self, parent_id: str, child_id: str) -> None:
        """Make ``child_id`` share all of ``parent_id``'s blocks (refcounts +1)."""
        if parent_id not in self._tables or child_id in self._tables or child_id in self._host_tables:
            raise KeyError(f"cannot fork {parent_id!r} into {child_id!r}")
        table = list(self._tables[parent_id])
        for block in table:
            self._refcount[block] += 1
        self._tables[child_id] = table
        self._num_tokens[child_id] = self._num_tokens[parent_id]

    def free(self, seq_id: str) -> None:
        """Release everything ``seq_id`` holds in either pool (no-op when unknown)."""
        for block in self._tables.pop(seq_id, []):
            self._release_block(block)
        self._num_tokens.pop(seq_id, None)
        self._host_free.extend(reversed(self._host_tables.pop(seq_id, [])))
        self._host_num_tokens.pop(seq_id, None)

    def truncate(self, seq_id: str, num_tokens: int | None) -> None:
        """Undo allocations: keep only the first ``num_tokens`` tokens of ``seq_id`` on the
        device (``None``: the sequence held nothing before, drop it).  Never grows a
        sequence; a swapped-out or unknown sequence is left alone."""
        table = self._tables.get(seq_id)
        if table is None:
            return
        if num_tokens is None:
            for block in self._tables.pop(seq_id):
                self._release_block(block)
            self._num_tokens.pop(seq_id, None)
            return
        if num_tokens >= self._num_tokens[seq_id]:
            return
        keep = _blocks_for(num_tokens, self.block_size)
        for block in table[keep:]:
            self._release_block(block)
        del table[keep:]
        self._num_tokens[seq_id] = num_tokens

    def swap_out(self, seq_id: str) -> TransferStats:
        """Copy ``seq_id``'s blocks to the host pool and release its device blocks."""
        if not self.can_swap_out(seq_id):
            raise CacheFullError(f"cannot swap out {seq_id!r}")
        device_blocks = self._tables[seq_id]
        host_blocks = [self._host_free.pop() for _ in device_blocks]
        started = time.perf_counter()
        if device_blocks:
            src = torch.tensor(device_blocks, device=self.device)
            dst = torch.tensor(host_blocks)
            self.host_pool.index_copy_(2, dst, self.pool.index_select(2, src).to("cpu"))
            self._synchronize()
        seconds = time.perf_counter() - started
        self._host_tables[seq_id] = host_blocks
        self._host_num_tokens[seq_id] = self._num_tokens[seq_id]
        for block in self._tables.pop(seq_id):
            self._release_block(block)
        self._num_tokens.pop(seq_id)
        return TransferStats(len(host_blocks) * self.bytes_per_block, seconds)

    def swap_in(self, seq_id: str) -> TransferStats:
        """Copy ``seq_id``'s blocks back from the host pool into fresh device blocks."""
        if not self.can_swap_in(seq_id):
            raise CacheFullError(f"cannot swap in {seq_id!r}")
        host_blocks = self._host_tables.pop(seq_id)
        device_blocks = [self._take_block() for _ in host_blocks]
        started = time.perf_counter()
        if host_blocks:
            src = torch.tensor(host_blocks)
            dst = torch.tensor(device_blocks, device=self.device)
            self.pool.index_copy_(2, dst, self.host_pool.index_select(2, src).to(self.device))
            self._synchronize()
        seconds = time.perf_counter() - started
        self._host_free.extend(reversed(host_blocks))
        self._tables[seq_id] = device_blocks
        self._num_tokens[seq_id] = self._host_num_tokens.pop(seq_id)
        return TransferStats(len(device_blocks) * self.bytes_per_block, seconds)

    # ----------------------------------------------------------------- helpers
    def _take_block(self) -> int:
        block = self._free.pop()
        self._refcount[block] = 1
        return block

    def _release_block(self, block: int) -> None:
        self._refcount[block] -= 1
        if self._refcount[block] == 0:
            self._free.append(block)

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def check_invariants(self) -> None:
        """Raise AssertionError if any invariant in the module docstring is broken."""
        free = set(self._free)
        assert len(free) == len(self._free), "device free list has duplicates"
        counted = [0] * self.num_blocks
        for seq_id, table in self._tables.items():
            assert seq_id not in self._host_tables, f"{seq_id} is in both pools"
            expected = _blocks_for(self._num_tokens[seq_id], self.block_size)
            assert len(table) == expected, f"{seq_id}: {len(table)} blocks for {self._num_tokens[seq_id]} tokens"
            for block in table:
                counted[block] += 1
        for block in range(self.num_blocks):
            assert counted[block] == self._refcount[block], f"block {block} refcount mismatch"
            assert (block in free) == (self._refcount[block] == 0), f"block {block} neither free nor owned"
        assert set(self._tables) == set(self._num_tokens)
        assert set(self._host_tables) == set(self._host_num_tokens)
        host_free = set(self._host_free)
        assert len(host_free) == len(self._host_free), "host free list has duplicates"
        host_owned = [b for table in self._host_tables.values() for b in table]
        assert len(set(host_owned)) == len(host_owned), "host block shared"
        assert not host_free & set(host_owned), "host block both free and owned"
        assert len(host_free) + len(host_owned) == self.num_host_blocks, "host block leaked"
        for seq_id, table in self._host_tables.items():
            assert len(table) == _blocks_for(self._host_num_tokens[seq_id], self.block_size)
