"""The loop-lag probe (serve/loop_lag.py) and the frozen start-up heap (serve/heap.py)."""

from __future__ import annotations

import asyncio
import gc
import json
import time

from tokenfair.serve.heap import freeze_startup_heap
from tokenfair.serve.loop_lag import LoopLagProbe, probe_from_env

BLOCK_S = 0.3


def busy_block_with_a_full_collection() -> None:
    gc.collect()
    end = time.perf_counter() + BLOCK_S
    while time.perf_counter() < end:
        pass


def test_the_probe_reports_a_blocked_loop_with_its_threads_collections_and_stack(tmp_path):
    out = tmp_path / "lag.jsonl"
    probe = LoopLagProbe(0.05, str(out))

    async def scenario():
        task = asyncio.ensure_future(probe.run())
        await asyncio.sleep(0.05)
        busy_block_with_a_full_collection()
        await asyncio.sleep(0.05)
        probe.stop()
        await task

    asyncio.run(scenario())
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    late = [d for d in lines if d["lag_ms"] >= 1000 * BLOCK_S * 0.9]
    assert probe.num_late >= 1 and len(late) == 1
    loop = [t for t in late[0]["threads"] if t["thread"] == "loop"]
    assert loop and loop[0]["cpu_ms"] + loop[0]["wait_ms"] >= 1000 * BLOCK_S * 0.5   # ran, or queued to run
    assert any(c[0] == 2 for c in late[0]["gc"])                   # the full collection it ran
    stacks = (tmp_path / "lag.jsonl.stacks").read_text()
    assert "busy_block_with_a_full_collection" in stacks and "=== the dump above" in stacks


def test_the_probe_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv("TOKENFAIR_LOOP_LAG_MS", raising=False)
    assert probe_from_env() is None
    monkeypatch.setenv("TOKENFAIR_LOOP_LAG_MS", "40")
    monkeypatch.delenv("TOKENFAIR_LOOP_LAG_FILE", raising=False)
    assert probe_from_env().threshold_s == 0.04


def test_the_start_up_heap_is_frozen_out_of_collections():
    try:
        assert freeze_startup_heap() > 1000 and gc.get_freeze_count() > 1000
        cycle: list = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1          # what is created later is still collected
    finally:
        gc.unfreeze()
