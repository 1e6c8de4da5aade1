"""A trace replayed on the real engine in wall-clock time (:func:`run_real`), through the
same run loop as the simulator (:func:`tokenfair.runtime.loop.run`), written as the
simulator's files (requests.jsonl, summary.json, timeline.json)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.costmodel import Profile
from .loader import LoadedModel
from .real_engine import RealEngine
from .setup import make_real_setup, model_name


@dataclass
class RealOutput:
    records: list[dict]
    summary: dict
    timeline: dict
    run: object            # tokenfair.runtime.loop.RunResult
    profile: Profile       # the profile the scheduler used (engine KV geometry)
    workload: object       # the replayed (limited, time-scaled) Workload
    engine: RealEngine


def prepare_workload(workload, max_requests: int | None = None, time_scale: float = 1.0):
    """The first ``max_requests`` rows, arrivals multiplied by ``time_scale`` (>1 stretches)."""
    from dataclasses import replace

    from ..workloads.workload import Workload

    if not 0 < time_scale < math.inf:
        raise ValueError(f"time_scale must be finite and > 0, got {time_scale}")
    if max_requests is not None and max_requests <= 0:
        raise ValueError(f"max_requests must be positive, got {max_requests}")
    rows = workload.rows[:max_requests] if max_requests is not None else workload.rows
    if time_scale != 1.0:
        rows = tuple(replace(r, arrival_s=r.arrival_s * time_scale) for r in rows)
    name = workload.name
    if max_requests is not None and max_requests < len(workload.rows):
        name += f"[:{max_requests}]"
    if time_scale != 1.0:
        name += f"x{time_scale:g}"
    return Workload(name, tuple(rows))


def run_real(workload, policy: str, contract, model_spec: str | Path | LoadedModel = "default", *,
             out_dir: str | Path | None = None, profile: Profile | None = None, num_threads: int = 2,
             max_requests: int | None = None, time_scale: float = 1.0, num_blocks: int | None = None,
             block_size: int | None = None, seed: int = 0, dtype: torch.dtype = torch.float32, clock=None,
             progress=None, setup: tuple[Profile, RealEngine] | None = None) -> RealOutput:
    """Replay ``workload`` on the real engine in wall-clock time; write the simulator's files.

    ``setup`` reuses a ``make_real_setup`` result (its engine must be idle)."""
    from ..runtime.loop import run
    from .wall_clock import WallClock
    from ..evaluation.metrics import request_record, summarize
    from ..runtime.output import write_run
    from ..sched.registry import make_policy
    from ..sched.scheduler import IterationScheduler

    wl = prepare_workload(workload, max_requests, time_scale)
    if setup is None:
        setup = make_real_setup(model_spec, contract, profile, num_blocks=num_blocks, block_size=block_size,
                                num_threads=num_threads, seed=seed, dtype=dtype)
    prof, engine = setup
    sched = IterationScheduler(make_policy(policy), contract, prof)
    busy0, swap0, steps0 = engine.busy_s, engine.swap_s, engine.num_steps
    try:
        res = run(wl.rows, contract, sched, engine, clock or WallClock(), progress)
    finally:
        engine.close()
    records = [request_record(r) for r in res.requests]
    timeline = res.recorder.to_json()
    timeline["swap_s"] = engine.swap_s - swap0
    summary = summarize(records, timeline, contract)
    loaded = engine.loaded
    summary.update({
        "policy": policy, "profile": prof.name, "workload": wl.name, **contract.identity(),
        "engine": "real", "model": model_name(loaded) if loaded is not None else "model",
        "num_threads": num_threads, "dtype": str(engine.runner.cache.pool.dtype).removeprefix("torch."),
        "kv_capacity_tokens": prof.kv_capacity_tokens,
        "block_size": prof.block_size, "wall_s": res.wall_s,
        "engine_execute_s": engine.busy_s - busy0, "engine_steps_executed": engine.num_steps - steps0,
        "predictor": res.scheduler.predictor.report(),
    })
    if out_dir is not None:
        write_run(out_dir, records, summary, timeline)
    return RealOutput(records, summary, timeline, res, prof, wl, engine)
