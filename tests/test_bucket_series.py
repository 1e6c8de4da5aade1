"""The sparse per-bucket series give the dense arrays' figures, float for float, and a long
quiet span costs nothing."""

import json
import tracemalloc

import numpy as np
from hypothesis import given, settings, strategies as st

from tokenfair.contracts.contract import parse_contract
from tokenfair.evaluation.bucket_series import BacklogIntervals, ServiceSeries
from tokenfair.evaluation.plot_grid import MAX_PLOT_POINTS, PlotGrid
from tokenfair.sim.simulate import simulate
from tokenfair.core.costmodel import load_profile
from tokenfair.workloads.workload import Workload, plain_row

N = 150
_values = st.sampled_from([0.5, 1.0 / 3, 7.25, 1e-3, 123.456, 2.0 ** -30, 1e9 / 7])
_series = st.dictionaries(st.integers(0, N + 5), _values, max_size=60)
_intervals = st.lists(st.tuples(st.integers(0, N), st.integers(0, N)), max_size=25)


def _dense_series(series, n):
    out = np.zeros(n)
    for b, v in series.items():
        if 0 <= b < n:
            out[b] += v
    return out


def _dense_backlog(pairs, n):
    diffs = np.zeros(n + 1, dtype=np.int64)
    for a, b in pairs:
        if a < b:
            diffs[a] += 1
            diffs[b] -= 1
    return np.cumsum(diffs)[:n] > 0


def _merged(pairs):
    return BacklogIntervals.merged(np.array([a for a, _ in pairs], dtype=np.int64),
                                   np.array([b for _, b in pairs], dtype=np.int64))


@settings(max_examples=200, deadline=None)
@given(_intervals, st.lists(st.tuples(st.integers(0, N), st.integers(0, N)), max_size=10), st.integers(1, 40))
def test_backlog_intervals_count_what_the_dense_flags_count(pairs, ranges, width):
    iv, dense = _merged(pairs), _dense_backlog(pairs, N)
    assert np.array_equal(iv.positions(), np.flatnonzero(dense))
    assert list(iv.starts[1:]) == sorted(iv.starts[1:]) and all(iv.ends[:-1] < iv.starts[1:])   # disjoint, apart
    lo = np.array([min(a, b) for a, b in ranges], dtype=np.int64)
    hi = np.array([max(a, b) for a, b in ranges], dtype=np.int64)
    assert iv.covered(lo, hi).tolist() == [int(dense[a:b].sum()) for a, b in zip(lo.tolist(), hi.tolist())]
    num_windows = N // width
    windows, counts = iv.window_counts(width, num_windows)
    want = {w: int(dense[w * width:(w + 1) * width].sum()) for w in range(num_windows)}
    assert dict(zip(windows.tolist(), counts.tolist())) == {w: k for w, k in want.items() if k}


@settings(max_examples=200, deadline=None)
@given(st.lists(_series, min_size=1, max_size=4), _intervals, st.integers(1, 40), st.integers(0, N))
def test_service_sums_are_the_dense_arrays_floats(many, pairs, width, x):
    dense = [_dense_series(s, N) for s in many]
    sparse = [ServiceSeries.of({str(b): v for b, v in s.items()}, N) for s in many]  # keys as JSON reads them
    for s, d in zip(sparse, dense):
        for w0 in range(0, N - width + 1, width):
            assert s.window_sum(w0, width) == float(d[w0:w0 + width].sum())
        csum = np.concatenate(([0.0], np.cumsum(d)))
        assert s.below(np.array([0, x, N])).tolist() == [csum[0], csum[x], csum[N]]
    mask = _dense_backlog(pairs, N)
    total_dense = sum(dense)
    total = ServiceSeries.total(sparse)
    where = _merged(pairs).positions()
    assert total.sum_at(where) == float(total_dense[mask].sum())
    assert sparse[0].sum_at(where) == float(dense[0][mask].sum())


@settings(max_examples=100, deadline=None)
@given(_series, st.integers(1, 7), _intervals)
def test_the_plot_grid_sums_carries_and_flags_whole_buckets(series, per_point, pairs):
    grid = PlotGrid(N, per_point, 0.5)
    dense = _dense_series(series, N)
    edges = list(range(0, N, per_point))
    assert np.allclose(grid.sums(series), [dense[e:e + per_point].sum() for e in edges], rtol=1e-12, atol=0)
    gauge, last, carried = {}, 0.0, []
    for b in range(N):
        if b in series:
            last = series[b]
        carried.append(last)
    gauge = {b: v for b, v in series.items() if b < N}
    assert grid.last_values(gauge).tolist() == [carried[min(e + per_point, N) - 1] for e in edges]
    flags = _dense_backlog(pairs, N)
    assert grid.backlogged(_merged(pairs)).tolist() == [
        bool(flags[e:e + per_point].sum() >= 0.5 * len(flags[e:e + per_point])) for e in edges]
    assert grid.x()[-1] == len(edges) * per_point * 0.5


def test_a_month_long_quiet_span_costs_what_happened_in_it():
    """Two bursts 30 days apart over 200 tenants: the fairness metrics take a few MB, where a
    dense array per tenant and second would take 200 x 2.6 M x 8 bytes = 4 GB."""
    rows = []
    for i in range(400):
        t = (i % 200) * 0.01 + (0.0 if i < 200 else 30 * 86400.0)
        rows.append(plain_row(f"r{i}", t, f"t{i % 200}", 2000, 50))
    contract = parse_contract({"classes": {"c": {"max_wait_s": 1.0, "min_share": 0.1}}, "default_class": "c",
                               "admission": {"shed_over_max_wait": False}})
    tracemalloc.start()
    out = simulate(Workload("gap", tuple(rows)), "fifo", contract, load_profile(None), isolated=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100e6, peak
    fair = out.summary["fairness"]
    assert fair["overdue_requests"]["within_share"] + fair["overdue_requests"]["over_share"] > 0
    assert fair["class_min_share"]["c"]["backlogged_s"] > 0
    grid = PlotGrid.of(json.loads(json.dumps(out.timeline)))
    assert grid.num_points <= MAX_PLOT_POINTS and grid.per_point > 1
    served = json.loads(json.dumps(out.timeline["tenant_service"]["t0"]))
    assert grid.sums(served).sum() == sum(served.values())
