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


def test_isolated_tenant_metrics_from_columns_equal_those_from_dicts():
    """``isolated_baselines`` takes a tenant-alone run's records as columns
    (``RecordTable.from_requests``): the metrics equal those of ``request_record``'s dicts."""
    from tokenfair.core.costmodel import load_profile
    from tokenfair.evaluation.metrics import group_metrics, request_record
    from tokenfair.evaluation.record_table import RecordTable
    from tokenfair.sim.simulate import REFERENCE_POLICY, isolated_baselines, simulate_once
    from tokenfair.workloads.scenarios import build_scenario
    wl, contract = build_scenario("whale", 0)
    profile = load_profile(None)
    _, iso_ten = isolated_baselines(wl, contract, profile)
    assert len(iso_ten) >= 2
    for t, got in iso_ten.items():
        alone = simulate_once(wl.only_tenant(t), REFERENCE_POLICY, contract, profile, timeline=False)
        assert RecordTable.from_requests(alone.requests).rows() == [request_record(r) for r in alone.requests]
        assert got == group_metrics([request_record(r) for r in alone.requests], None)


def test_count_names_one_name_and_many():
    from tokenfair.core.request import count_names
    a, b = "a", "".join(["a"])              # equal, maybe not the same object
    assert count_names([]) == {}
    assert count_names([a, a, a]) == {"a": 3}
    assert count_names([a, "b", b]) == {"a": 2, "b": 1}
    assert list(count_names(["b", a, "b", a])) == ["b", "a"]        # first-seen order


def test_the_collector_is_paused_while_simulate_runs_and_restored_after():
    """``simulate`` runs with the collector paused (sim/simulate.py), and leaves it on; the
    results are those of the run with it on (``simulate_once`` pauses nothing)."""
    from tokenfair.core.costmodel import load_profile
    from tokenfair.evaluation.metrics import request_record
    from tokenfair.sim.simulate import simulate, simulate_once
    from tokenfair.workloads.scenarios import build_scenario
    wl, contract = build_scenario("hol", 0)
    profile = load_profile(None)
    seen: list[bool] = []
    out = simulate(wl, "fair", contract, profile, progress=lambda done, total: seen.append(gc.isenabled()))
    assert seen and not any(seen)
    assert gc.isenabled()
    plain = simulate_once(wl, "fair", contract, profile)
    assert out.records == [request_record(r) for r in plain.requests]
