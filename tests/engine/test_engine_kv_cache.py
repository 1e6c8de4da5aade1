"""Property tests for PagedKVCache: no block ever leaks, queries predict mutations, and
swap round-trips preserve the stored K/V bytes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tokenfair.engine.kv_cache import CacheFullError, PagedKVCache

SEQ_IDS = st.sampled_from([f"q{i}" for i in range(5)])


def _cache(num_blocks=12, block_size=4, num_host_blocks=6) -> PagedKVCache:
    return PagedKVCache(
        num_layers=2, num_kv_heads=1, head_dim=2, num_blocks=num_blocks,
        block_size=block_size, num_host_blocks=num_host_blocks,
    )


class CacheMachine(RuleBasedStateMachine):
    """Random allocate/append/fork/free/swap_out/swap_in; every token slot carries a
    unique marker value so the test also checks that contents survive swaps and forks."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = _cache()
        self.next_marker = 1.0
        self.contents: dict[str, list[float]] = {}  # expected marker per token

    def _write(self, seq_id: str, start: int, count: int) -> None:
        table = self.cache.block_table(seq_id)
        bs = self.cache.block_size
        for pos in range(start, start + count):
            self.cache.pool[:, :, table[pos // bs], pos % bs] = self.next_marker
            self.contents[seq_id].append(self.next_marker)
            self.next_marker += 1.0

    @rule(seq_id=SEQ_IDS, num_tokens=st.integers(0, 9))
    def allocate(self, seq_id, num_tokens):
        before_free = self.cache.num_free_blocks
        if self.cache.can_allocate(seq_id, num_tokens):
            start = self.cache.num_tokens(seq_id)
            self.cache.allocate(seq_id, num_tokens)
            self.contents.setdefault(seq_id, [])
            self._write(seq_id, start, num_tokens)
        else:
            with pytest.raises(CacheFullError):
                self.cache.allocate(seq_id, num_tokens)
            assert self.cache.num_free_blocks == before_free

    @rule(parent=SEQ_IDS, child=SEQ_IDS)
    def fork(self, parent, child):
        if self.cache.has_seq(parent) and not self.cache.has_seq(child) and not self.cache.is_swapped(child):
            self.cache.fork(parent, child)
            self.contents[child] = list(self.contents[parent])

    @rule(seq_id=SEQ_IDS)
    def free(self, seq_id):
        self.cache.free(seq_id)
        self.contents.pop(seq_id, None)

    @rule(seq_id=SEQ_IDS)
    def swap_out(self, seq_id):
        if self.cache.can_swap_out(seq_id):
            blocks = len(self.cache.block_table(seq_id))
            stats = self.cache.swap_out(seq_id)
            assert stats.bytes_moved == blocks * self.cache.bytes_per_block
            assert stats.seconds >= 0
            assert not self.cache.has_seq(seq_id) and self.cache.is_swapped(seq_id)
        elif self.cache.has_seq(seq_id):
            with pytest.raises(CacheFullError):
                self.cache.swap_out(seq_id)

    @rule(seq_id=SEQ_IDS)
    def swap_in(self, seq_id):
        if self.cache.can_swap_in(seq_id):
            # Scribble on free blocks: data must come back from the host pool.
            if self.cache.num_free_blocks:
                self.cache.pool[:, :, torch.tensor(self.cache.free_block_ids())] = -1.0
            self.cache.swap_in(seq_id)
            assert self.cache.has_seq(seq_id)
        elif self.cache.is_swapped(seq_id):
            with pytest.raises(CacheFullError):
                self.cache.swap_in(seq_id)

    @invariant()
    def no_leaks(self):
        self.cache.check_invariants()

    @invariant()
    def contents_preserved(self):
        bs = self.cache.block_size
        for seq_id, markers in self.contents.items():
            if not self.cache.has_seq(seq_id):
                continue
            table = self.cache.block_table(seq_id)
            for pos, marker in enumerate(markers):
                stored = self.cache.pool[:, :, table[pos // bs], pos % bs]
                assert torch.all(stored == marker), (seq_id, pos)


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@given(st.lists(st.tuples(SEQ_IDS, st.integers(1, 20)), max_size=30))
@settings(max_examples=100, deadline=None)
def test_free_everything_returns_all_blocks(ops):
    cache = _cache()
    for seq_id, num_tokens in ops:
        if cache.can_allocate(seq_id, num_tokens):
            cache.allocate(seq_id, num_tokens)
        cache.check_invariants()
    for seq_id, _ in ops:
        cache.free(seq_id)
    cache.check_invariants()
    assert cache.num_free_blocks == cache.num_blocks
    assert cache.num_free_host_blocks == cache.num_host_blocks


def test_blocks_are_ceil_of_tokens():
    cache = _cache(block_size=4)
    cache.allocate("a", 5)
    assert len(cache.block_table("a")) == 2
    cache.allocate("a", 3)
    assert len(cache.block_table("a")) == 2
    cache.allocate("a", 1)
    assert len(cache.block_table("a")) == 3


def test_fork_copy_on_write_tail():
    cache = _cache(block_size=4)
    cache.allocate("a", 6)
    cache.fork("a", "b")
    shared_tail = cache.block_table("a")[-1]
    cache.allocate("b", 1)
    assert cache.block_table("b")[0] == cache.block_table("a")[0]
    assert cache.block_table("b")[-1] != shared_tail
    cache.check_invariants()


def test_check_invariants_detects_leak():
    cache = _cache()
    cache.allocate("a", 5)
    cache._tables["a"].pop()  # simulate a lost block
    with pytest.raises(AssertionError):
        cache.check_invariants()


def test_a_pool_larger_than_memory_is_a_clear_error_before_any_allocation(monkeypatch):
    from tokenfair.engine import kv_cache
    with pytest.raises(ValueError, match=r"a KV cache of 16,000,000,000,000 tokens needs .* GB, more than the .* "
                                         r"GB of cpu memory here; lower the KV capacity \(--kv-tokens\)"):
        PagedKVCache(num_layers=30, num_kv_heads=3, head_dim=64, num_blocks=10 ** 12, block_size=16)
    monkeypatch.setattr(kv_cache, "device_memory_bytes", lambda device: 10 ** 6)    # a 1 MB machine
    with pytest.raises(ValueError, match="KV cache of 64 tokens"):
        PagedKVCache(num_layers=30, num_kv_heads=3, head_dim=64, num_blocks=4, block_size=16)
