"""The whole command's fast paths give the slow paths' answers (speed itself is measured by
``tokenfair bench``, never here)."""

from __future__ import annotations

import gc

import pytest

from tokenfair.workloads.gc_pause import gc_paused, with_gc_paused
from tokenfair.workloads.traces import scale_rate, spread_tenants, tile
from tokenfair.workloads.workload import TraceRow, Workload


def test_gc_paused_restores_the_collector():
    assert gc.isenabled()
    seen = []
    with_gc_paused(lambda: seen.append(gc.isenabled()))()
    assert seen == [False] and gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        with gc_paused():
            1 / 0
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()           # left as it was: off
    finally:
        gc.enable()


def test_transforms_with_the_collector_paused_give_the_same_rows():
    rows = tuple(TraceRow(f"r{i}", i * 0.5, "t", 10 + i, 3 + i % 4, klass="k" if i % 2 else None,
                          prefix_hashes=(i,)) for i in range(30))
    wl = Workload("w", rows)
    out = scale_rate(spread_tenants(tile(wl, 100), 7, seed=3), 4.0)
    period = 14.5 + 14.5 / 30
    expected = [(f"r{i % 30}#{i // 30}" if i >= 30 else f"r{i}", (i % 30 * 0.5 + i // 30 * period) / 4.0)
                for i in range(120)]
    assert [(r.request_id, r.arrival_s) for r in out.rows] == expected
    assert [(r.prompt_tokens, r.klass, r.prefix_hashes) for r in out.rows] == \
        [(rows[i % 30].prompt_tokens, rows[i % 30].klass, rows[i % 30].prefix_hashes) for i in range(120)]
    assert gc.isenabled()
