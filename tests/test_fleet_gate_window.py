"""The simulated fleet gateway's window per replica: by default the rule ``tokenfair gateway``
runs (``sched/backend_window.py``, saturation-driven, with the prefill backlog bound), fed
with a reading of the replica's queue, running count and KV use every ``poll_s``."""

from __future__ import annotations

import statistics

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import load_profile
from tokenfair.sched import backend_window
from tokenfair.sim import fleet_gate
from tokenfair.sim.fleet import FleetConfig, simulate_fleet_once
from tokenfair.workloads.workload import TraceRow, Workload

CONTRACT = parse_contract({"admission": {"shed_over_max_wait": False}})
PROFILE = load_profile(None)


def _heavy_and_light(num_heavy: int = 8, per_heavy: int = 50) -> Workload:
    """``num_heavy`` tenants' bursts, together more than the replicas' KV holds at once
    (about 70 of these requests each), and a light tenant arriving through them."""
    rows = [TraceRow(f"h{t}-{i}", (i * num_heavy + t) * 0.01, f"heavy{t}", 5000, 600)
            for t in range(num_heavy) for i in range(per_heavy)]
    rows += [TraceRow(f"l{i}", 1.0 + i * 0.5, "light", 200, 50) for i in range(40)]
    rows.sort(key=lambda r: (r.arrival_s, r.request_id))
    return Workload("heavy-light", tuple(rows))


def _watched_run(monkeypatch, window: int | None):
    """The run, and per dispatch round and replica: (released and not ended if the round
    released to it, else 0; the window's limit; prompt tokens released without a first token;
    how many those are; the replica's own queue)."""
    seen: list[tuple[int, int, int, int, int]] = []
    orig = fleet_gate.FleetGate.dispatch

    def watch(self, now, replicas, *a, **k):
        before = [len(p) for p in self.pending]
        orig(self, now, replicas, *a, **k)
        for r in replicas:
            unstarted = self.unstarted[r.index]
            limit = self.window if self.windows is None else self.windows[r.index].limit
            released = len(self.pending[r.index]) > before[r.index]
            seen.append((len(self.pending[r.index]) if released else 0, limit,
                         sum(gw.prompt_tokens for gw, _, _ in unstarted), len(unstarted), r.sched.policy.num_waiting()))

    monkeypatch.setattr(fleet_gate.FleetGate, "dispatch", watch)
    cfg = FleetConfig(num_replicas=2, router="least-loaded", fleet_policy="fair", gateway_window=window)
    run = simulate_fleet_once(_heavy_and_light(), "fifo", CONTRACT, PROFILE, cfg)
    return run, seen


def test_the_default_window_follows_the_replicas_saturation(monkeypatch):
    readings = []
    orig = backend_window.SaturationWindow.on_reading

    def count(self, reading, inflight, starting=0):
        readings.append((reading.at_s, self))
        return orig(self, reading, inflight, starting)

    monkeypatch.setattr(backend_window.SaturationWindow, "on_reading", count)
    run, seen = _watched_run(monkeypatch, None)
    assert len(run.requests) == 440 and all(r.status.value == "finished" and r.reason for r in run.requests)
    assert run.gate.num_running == 0 and all(not p for p in run.gate.pending)
    windows = run.gate.windows
    assert windows is not None and len(windows) == 2
    assert all(w.increases > 0 and w.decreases > 0 for w in windows)         # grew, and shrank on a queue
    # a round releases to a replica only up to its window (a window that shrinks keeps
    # what was released before)
    assert all(inflight <= limit for inflight, limit, *_ in seen)
    # the prefill backlog bound: one prompt of any length, or at most the bound in all
    cap = backend_window.DEFAULT_MAX_PREFILL_TOKENS
    assert all(n <= 1 or tokens <= cap for _, _, tokens, n, _ in seen)
    # each window read at most once per poll interval
    for w in windows:
        times = [t for t, ww in readings if ww is w]
        assert times and all(b - a >= w.sat.poll_s - 1e-9 for a, b in zip(times, times[1:]))


def test_the_default_window_keeps_the_queue_in_the_gateway(monkeypatch):
    """With a fixed window of the replica's max_running the gateway hands everything over and
    the replicas' own FIFO queues decide the order; the saturation window keeps it in the
    gateway's fair queue, and the light tenant waits less."""
    adaptive, seen_a = _watched_run(monkeypatch, None)
    monkeypatch.undo()
    fixed, seen_f = _watched_run(monkeypatch, CONTRACT.engine.max_running)
    queued_a = statistics.mean(q for *_, q in seen_a)
    queued_f = statistics.mean(q for *_, q in seen_f)
    assert queued_a < 0.2 * queued_f, (queued_a, queued_f)

    def light_p99(run):
        ttft = sorted(r.first_token_s - r.arrival_s for r in run.requests if r.tenant == "light")
        return ttft[int(0.99 * (len(ttft) - 1))]
    assert light_p99(adaptive) < light_p99(fixed), (light_p99(adaptive), light_p99(fixed))
    assert sum(r.num_output for r in adaptive.requests) == sum(r.num_output for r in fixed.requests)
