"""A diagnostic probe of the event loop's lateness (off unless ``TOKENFAIR_LOOP_LAG_MS`` is set).

A task sleeps :data:`TICK_S` again and again; when it wakes more than the threshold late,
it writes one JSON line (to ``TOKENFAIR_LOOP_LAG_FILE``, default stderr) saying, for the
late tick, how much CPU each thread of the process ran and how long each waited *runnable
but not running* in the kernel's run queue (``/proc/self/task/*/schedstat``, Linux):

  * the loop's thread on the CPU for the whole lag: the loop ran something long (a stack
    of every thread is dumped by :mod:`faulthandler` once the tick is a threshold late, to
    the same file with ``.stacks`` appended);
  * the loop's thread neither on the CPU nor queued: it waited (for the GIL, held by the
    thread that ran instead, or on a lock);
  * queued (``wait_ms``) for most of the lag: the machine did not schedule the process;
  * ``gc``: the garbage collections (generation, milliseconds, objects collected) that ran
    in the late tick (:data:`gc.callbacks`).

    TOKENFAIR_LOOP_LAG_MS=50 TOKENFAIR_LOOP_LAG_FILE=/tmp/lag.jsonl tokenfair serve ...
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

TICK_S = 0.01
ENV_THRESHOLD_MS = "TOKENFAIR_LOOP_LAG_MS"
ENV_FILE = "TOKENFAIR_LOOP_LAG_FILE"
MIN_REPORTED_MS = 1.0      # threads that ran or waited less than this in a late tick are left out


def thread_times() -> dict[int, tuple[int, int]]:
    """tid -> (ns on the CPU, ns runnable in the run queue) of every thread of this process."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            on_cpu, queued, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        out[int(task.name)] = (int(on_cpu), int(queued))
    return out


def thread_names() -> dict[int, str]:
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


class LoopLagProbe:
    """The probe task (the module docstring); ``run`` until ``stop``."""

    def __init__(self, threshold_s: float, out_path: str | None = None) -> None:
        self.threshold_s = threshold_s
        self.out = open(out_path, "a", buffering=1) if out_path else sys.stderr
        self.stacks = open(out_path + ".stacks", "a", buffering=1) if out_path else sys.stderr
        self.num_late = 0
        self.stopped = False
        self.collections: list[tuple] = []    # (generation, ms, collected, thread) since the last tick
        self.gc_started_s = 0.0

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.gc_started_s = time.perf_counter()
        else:
            ms = round(1000 * (time.perf_counter() - self.gc_started_s), 1)
            self.collections.append((info["generation"], ms, info["collected"], threading.current_thread().name))

    async def run(self) -> None:
        loop_tid = threading.get_native_id()
        before = thread_times()
        gc.callbacks.append(self.on_gc)
        try:
            while not self.stopped:
                t0 = time.perf_counter()
                faulthandler.dump_traceback_later(self.threshold_s + TICK_S, file=self.stacks)
                await asyncio.sleep(TICK_S)
                faulthandler.cancel_dump_traceback_later()
                lag_s = time.perf_counter() - t0 - TICK_S
                after = thread_times()
                if lag_s > self.threshold_s:
                    self.report(lag_s, loop_tid, before, after)
                before = after
                self.collections.clear()
        finally:
            gc.callbacks.remove(self.on_gc)
            faulthandler.cancel_dump_traceback_later()

    def report(self, lag_s: float, loop_tid: int, before: dict, after: dict) -> None:
        self.num_late += 1
        names = thread_names()
        threads = []
        for tid, (cpu, queued) in after.items():
            c0, q0 = before.get(tid, (0, 0))
            cpu_ms, wait_ms = (cpu - c0) / 1e6, (queued - q0) / 1e6
            if cpu_ms >= MIN_REPORTED_MS or wait_ms >= MIN_REPORTED_MS:
                name = "loop" if tid == loop_tid else names.get(tid, str(tid))
                threads.append({"thread": name, "cpu_ms": round(cpu_ms, 1), "wait_ms": round(wait_ms, 1)})
        line = {"pid": os.getpid(), "t_monotonic": round(time.monotonic(), 4), "lag_ms": round(1000 * lag_s, 1),
                "loadavg": os.getloadavg()[0], "threads": sorted(threads, key=lambda t: -t["cpu_ms"]),
                "gc": list(self.collections)}
        self.out.write(json.dumps(line) + "\n")
        if lag_s > self.threshold_s + TICK_S:     # the stack dump fired during this tick
            self.stacks.write(f"=== the dump above: lag {1000 * lag_s:.0f} ms, t_monotonic {line['t_monotonic']}\n")

    def stop(self) -> None:
        self.stopped = True
        faulthandler.cancel_dump_traceback_later()


def probe_from_env() -> LoopLagProbe | None:
    """A probe when ``TOKENFAIR_LOOP_LAG_MS`` is set (its task is for the caller to start)."""
    raw = os.environ.get(ENV_THRESHOLD_MS)
    if not raw:
        return None
    return LoopLagProbe(float(raw) / 1000, os.environ.get(ENV_FILE))
