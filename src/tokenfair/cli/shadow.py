"""``tokenfair shadow`` and ``tokenfair sweep`` (registered by :mod:`tokenfair.cli.contracts`).

Both exit 2 on bad input, 1 when the candidate (shadow) or every variant (sweep) breaches a
threshold, 0 otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from .common import USER_ERRORS, error_message, fail, sim_inputs

STORE_HELP = "contract store folder, to look up --live / --candidate / the records' version by label"


def _live_contract(live: Optional[str], store: Optional[Path], records: list[dict]):
    from ..contracts.store import ContractStore, resolve_contract_ref
    from ..contracts.shadow import versions_in
    if live is not None:
        return resolve_contract_ref(live, store)
    seen = versions_in(records)
    if len(seen) != 1 or store is None:
        named = ", ".join(f"{v} ({n} requests)" for v, n in seen.most_common()) or "none"
        raise ValueError(f"give --live FILE|VERSION: the records name contract version(s) {named}"
                         + ("" if store is not None else " and there is no --store to look one up"))
    return ContractStore(store).load(next(iter(seen)))


def shadow(records: Path = typer.Argument(..., help="serve/gateway --records file (rotated files are read too)"),
           candidate: str = typer.Option(..., help="contract to try: file, or version label in --store"),
           live: Optional[str] = typer.Option(None, help="contract that was live (default: the records' version in --store)"),
           store: Optional[Path] = typer.Option(None, help=STORE_HELP),
           profile: Optional[str] = typer.Option(None, help="calibrated profile (tokenfair calibrate); default: fit from the records"),
           thresholds: Optional[Path] = typer.Option(None, help="thresholds YAML (default: built-in)"),
           policy: str = typer.Option("fair", help="scheduling policy the service ran"),
           out: Optional[Path] = typer.Option(None, help="write the two simulated runs and shadow.json here")) -> None:
    """Replay recorded traffic under the live contract and a candidate; per-tenant deltas next
    to the simulator's error on the live contract."""
    import json

    from ..contracts.store import resolve_contract_ref
    from ..core.costmodel import load_profile
    from ..workloads.records import read_records, workload_of
    from ..contracts.records_profile import calibrate_to_records, fit_profile
    from ..sched.registry import make_policy
    from ..contracts.shadow import run_shadow, shadow_table
    from ..evaluation.thresholds import load_thresholds
    try:
        recs = read_records(records)
        wl = workload_of(recs, records.stem)
        live_c = _live_contract(live, store, recs)
        cand = resolve_contract_ref(candidate, store)
        prof = load_profile(profile) if profile is not None else fit_profile(recs)
        th = load_thresholds(thresholds)
        make_policy(policy)
    except USER_ERRORS as err:
        fail(error_message(err))
    cal = None
    if profile is None:         # the fit's prefill is one step: calibrate it as the simulator runs it
        prof, cal = calibrate_to_records(recs, wl, live_c, prof, policy)

    res = run_shadow(recs, wl, live_c, cand, prof, th, policy=policy, out_dir=out)
    if cal is not None:
        typer.echo(f"profile fitted from the records, calibrated by {cal.rounds} replay(s) under the live contract "
                   f"(mean prefill {cal.prefill_error:+.1%}, mean TPOT {cal.tpot_error:+.1%} before the last rescale)")
    typer.echo(shadow_table(res))
    if out is not None:
        doc = {"profile": prof.model_dump(mode="json"),
               "calibration": None if cal is None else {"rounds": cal.rounds, "prefill_error": cal.prefill_error,
                                                        "tpot_error": cal.tpot_error},
               "live": f"{live_c.version}@{live_c.content_hash}",
               "candidate": f"{cand.version}@{cand.content_hash}",
               "simulator_error": [{"tenant": e.tenant, "figure": e.figure, "recorded": e.measured,
                                    "simulated": e.simulated, "rel_error": e.rel_error} for e in res.errors],
               "passed": res.gate.passed, "checks": [c.as_dict() for c in res.gate.checks]}
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "shadow.json").write_text(json.dumps(doc, indent=2))
        typer.echo(f"wrote {out}/shadow.json and {out}/(live,candidate)/")
    if not res.gate.passed:
        raise typer.Exit(1)


def sweep(traces: List[str] = typer.Argument(..., help="traces: built-in scenario, public trace name, file or records"),
          grid: Path = typer.Option(..., help="grid YAML: base contract and the values to vary"),
          out: Path = typer.Option(..., help="output folder: sweep.json, sweep.csv, sweep.png, variants/"),
          baseline: Optional[str] = typer.Option(None, help="gate baseline (default: the grid's base contract)"),
          store: Optional[Path] = typer.Option(None, help=STORE_HELP),
          profile: Optional[str] = typer.Option(None, help="built-in profile name or YAML file"),
          thresholds: Optional[Path] = typer.Option(None, help="thresholds YAML (default: built-in)"),
          policy: str = typer.Option("fair", help="scheduling policy"),
          workers: int = typer.Option(min(4, os.cpu_count() or 1), min=1, help="worker processes"),
          seed: int = typer.Option(0, help="seed of built-in scenarios"),
          max_requests: Optional[int] = typer.Option(None, min=1, help="keep the first N requests of each trace")) -> None:
    """Simulate many contract variants in parallel, rank them by the gate; a table and a plot."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from ..contracts.store import resolve_contract_ref
    from ..contracts.sweep import check_light_tenants, dump_variant, load_grid, run_sweep, write_sweep
    try:
        g = load_grid(grid)
        base = resolve_contract_ref(baseline, store) if baseline is not None else g.base
        prof, th, wls = sim_inputs(profile, thresholds, policy, traces, seed, max_requests)
        check_light_tenants(g, wls)
    except USER_ERRORS as err:
        fail(error_message(err))
    console = Console(stderr=True)
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        task = bar.add_task(f"{len(g.variants)} variants x {len(wls)} trace(s)", total=len(g.variants) + 1)
        results, light, base_point = run_sweep(g, wls, base, prof, th, policy=policy, workers=workers,
                                   progress=lambda done, total: bar.update(task, completed=done))
    table = Table(title=f"contract variants vs {base.version}@{base.content_hash} (light tenants: {', '.join(light)})")
    for col in ("rank", "variant", "set", "gate", "breaches", "light P99 TTFT s", "throughput tok/s"):
        table.add_column(col)
    for i, r in enumerate(results, 1):
        table.add_row(str(i), r.variant.contract.version, ", ".join(f"{k}={v}" for k, v in r.variant.values.items()),
                      "PASS" if r.passed else "FAIL", str(len(r.breaches)),
                      "-" if r.light_ttft_p99_s is None else f"{r.light_ttft_p99_s:.3f}",
                      f"{r.throughput_tokens_per_s:,.0f}")
    Console(width=200).print(table)
    paths = write_sweep(out, results, light, base_point)
    vdir = out / "variants"
    vdir.mkdir(parents=True, exist_ok=True)
    for r in results:
        (vdir / f"{r.variant.contract.version}.yaml").write_text(dump_variant(r.variant))
    typer.echo(f"wrote {', '.join(str(p) for p in paths)} and {vdir}/<version>.yaml")
    if not any(r.passed for r in results):
        raise typer.Exit(1)
