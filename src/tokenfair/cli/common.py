"""Helpers every CLI command shares: user-error reporting (exit 2) and input resolution."""

from __future__ import annotations

from pathlib import Path
from typing import List, NoReturn, Optional

import typer

from ..contracts.contract import Contract, ContractError, load_contract
from ..core.costmodel import ProfileError
from ..workloads.scenarios import SCENARIOS, build_scenario
from ..workloads.workload import Workload, WorkloadError, read_trace

MAX_PORT = 65535          # the largest TCP port a server option takes

USER_ERRORS = (ContractError, WorkloadError, ProfileError, KeyError, ValueError, FileNotFoundError)


def fail(msg: str) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def policy_list(spec: str, default: str | None = None) -> list[str]:
    """``--policies``: comma-separated policy specs (``vtc:input_weight=1,output_weight=2`` is
    one spec), each checked (its options included); ValueError for an empty or repeated list,
    an unknown policy or a bad option.  When ``spec`` is ``default``, a policy that is not
    registered is skipped with a note instead."""
    from ..sched.registry import make_policy, policy_names
    names: list[str] = []
    for tok in (t.strip() for t in spec.split(",")):
        if not tok:
            continue
        if "=" in tok and ":" not in tok and names and ":" in names[-1]:
            names[-1] += "," + tok          # more options of the previous policy: vtc:a=1,b=2
        else:
            names.append(tok)
    if not names:
        raise ValueError("--policies is empty; give a comma-separated list such as fifo,vtc")
    dup = sorted({p for p in names if names.count(p) > 1})
    if dup:
        raise ValueError(f"--policies names {', '.join(dup)} more than once")
    known = set(policy_names())
    unknown = [p for p in names if p.partition(":")[0] not in known]
    if unknown and spec != default:
        raise ValueError(f"unknown polic{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))}; "
                         f"choose from: {', '.join(sorted(known))}")
    for p in unknown:
        typer.echo(f"note: policy {p!r} is not registered; skipping it", err=True)
    names = [p for p in names if p not in unknown]
    for p in names:
        make_policy(p)          # options (``vtc:output_weight=3``) are checked here: ValueError
    if not names:
        raise ValueError("none of the policies is available")
    return names


def resolve_workload(spec: str, seed: int, *, skip_bad_rows: bool = False) -> tuple[Workload, Contract | None]:
    """A built-in scenario (with its contract), a public trace name, or a trace file."""
    if spec in SCENARIOS:
        return build_scenario(spec, seed)
    try:
        from ..workloads.traces import load_workload
    except ModuleNotFoundError:
        return read_trace(spec), None
    try:
        return load_workload(spec, seed=seed, skip_bad_rows=skip_bad_rows), None
    except WorkloadError as err:
        if Path(spec).exists():
            raise
        raise WorkloadError(f"{err}; built-in scenarios: {', '.join(SCENARIOS)}") from None


def shape_workload(wl: Workload, *, start_s: float | None = None, end_s: float | None = None,
                   rate_scale: float | None = None, spread_tenants: int | None = None,
                   max_requests: int | None = None, seed: int = 0,
                   remap_tenants: Path | None = None) -> Workload:
    """Slice a time range (re-based to 0), scale the arrival rate, spread the requests over N
    tenants (Zipf-skewed, seeded) or remap tenant names with a YAML/JSON mapping file
    (``old: new``; unnamed tenants keep their name), and cap the count -- in that order."""
    from ..workloads import traces
    if start_s is not None or end_s is not None:
        wl = traces.slice_time(wl, start_s or 0.0, end_s)
    if rate_scale is not None:
        if rate_scale <= 0:
            raise ValueError(f"--rate-scale must be > 0, got {rate_scale}")
        wl = traces.scale_rate(wl, rate_scale)
    if spread_tenants is not None:
        wl = traces.spread_tenants(wl, spread_tenants, seed=seed)
    if remap_tenants is not None:
        wl = traces.remap_tenants(wl, _load_mapping(remap_tenants))
    if max_requests is not None:
        wl = traces.limit(wl, max_requests)
    if not wl.rows:
        raise ValueError("the workload is empty after slicing; widen --start-s/--end-s")
    return wl


def _load_mapping(path: Path) -> dict[str, str]:
    import yaml
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"{path}: cannot read the tenant mapping ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML/JSON: {err}") from None
    if not isinstance(data, dict) or not all(isinstance(v, (str, int)) for v in data.values()):
        raise ValueError(f"{path}: a tenant mapping must be a mapping of old name -> new name")
    return {str(k): str(v) for k, v in data.items()}


def report_skipped(wl: Workload) -> None:
    """Bad rows dropped with --skip-bad-rows are counted and shown, never silent."""
    skipped = getattr(wl, "skipped", ())
    if skipped:
        typer.echo(f"note: skipped {len(skipped)} bad row(s); first: {skipped[0].message}", err=True)


def resolve_contract(path: Optional[Path], default: Contract | None) -> Contract:
    if path is not None:
        return load_contract(path)
    return default or Contract()


def error_message(err: Exception) -> str:
    return err.args[0] if isinstance(err, KeyError) and err.args else str(err)


def load_traces(traces: List[str], seed: int, max_requests: Optional[int]):
    """Each trace spec as a workload; a serve/gateway records file is read as the trace it is."""
    from ..workloads.records import is_records_file, records_workload
    out = []
    for t in traces:
        wl = records_workload(t) if is_records_file(t) else resolve_workload(t, seed)[0]
        out.append(shape_workload(wl, max_requests=max_requests, seed=seed))
    return out


def sim_inputs(profile: Optional[str], thresholds: Optional[Path], policy: str, traces: List[str], seed: int,
               max_requests: Optional[int]):
    """(profile, thresholds, workloads) for a simulated comparison; user errors raise."""
    from ..core.costmodel import load_profile
    from ..sched.registry import make_policy
    from ..evaluation.thresholds import load_thresholds
    prof = load_profile(profile)
    th = load_thresholds(thresholds)
    make_policy(policy)
    return prof, th, load_traces(traces, seed, max_requests)
