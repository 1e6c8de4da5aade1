"""The ``tokenfair`` command line.  Bad input exits with status 2 and a message naming the
place and the fix; nothing prints a traceback for a user error."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from .common import USER_ERRORS, error_message, fail, policy_list, report_skipped
from .sim_fleet import fleet_config
from .options import options_in_place
from .workload_options import ShapingOptions, resolve_inputs
from ..contracts.contract import ContractError, contract_schema, load_contract
from ..workloads.scenarios import SCENARIOS
from ..workloads.transforms import MAX_SPREAD_TENANTS

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Contract-driven fair scheduling for multi-tenant LLM serving.")
contract_app = typer.Typer(no_args_is_help=True, help="Validate, version, diff and roll back contracts.")
app.add_typer(contract_app, name="contract")


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__
        from ..core_build import describe
        typer.echo(f"tokenfair {__version__} {describe()}")
        raise typer.Exit()


@app.callback()
def _main_options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                               help="print the version and which core runs (mypyc|python), then exit")) -> None:
    """Contract-driven fair scheduling for multi-tenant LLM serving."""

@app.command()
@options_in_place
def simulate(workload: str = typer.Argument(..., help=f"built-in scenario ({', '.join(SCENARIOS)}) or trace path"),
             policy: str = typer.Option("fair", help="scheduling policy"),
             contract: Optional[Path] = typer.Option(None, help="contract YAML (default: the scenario's)"),
             profile: Optional[str] = typer.Option(None, help="built-in profile name or YAML file"),
             seed: int = typer.Option(0, help="seed for built-in scenarios and generators"),
             out: Path = typer.Option(..., help="output folder"),
             isolated: bool = typer.Option(True, help="also run isolated baselines for slowdown"),
             shaping: ShapingOptions = ShapingOptions(),   # --skip-bad-rows ... --remap-tenants
             replicas: Optional[int] = typer.Option(None, min=1, help="simulate a fleet of N engine replicas"),
             router: str = typer.Option("round-robin", help="fleet router: round-robin, least-loaded, kv-aware, "
                                                             "prefix-aware, locality"),
             fleet_policy: str = typer.Option("none", help="fair: the gateway's layers 1-3 in front of the fleet"),
             prefix_cache: bool = typer.Option(False, help="fleet: cache prompt prefix blocks (hash_ids) per replica"),
             gateway_window: Optional[int] = typer.Option(None, min=1, help="fleet gateway: a fixed window of requests in flight per replica (default: the gateway's saturation-driven window)"),
             cached_discount: float = typer.Option(0.1, help="fleet gateway: charge for a cached prompt token (0-1)"),
             load_bound: float = typer.Option(1.5, help="prefix-aware router: load bound (x the least load + 1)"),
             locality_hold: float = typer.Option(0.0, help="fleet gateway: seconds a request may wait for the replica holding half or more of its prompt (0: off)")) -> None:
    """Simulate one policy on a workload; write requests.jsonl, summary.json, timeline.json."""
    from ..runtime.progress import stderr_progress
    from ..runtime.output import summary_table, write_run
    from ..sim.simulate import simulate as run_sim
    try:
        wl, c, prof = resolve_inputs(workload, seed, shaping, contract, profile)
        from ..sched.registry import make_policy
        make_policy(policy)
        fleet = fleet_config(replicas, router, fleet_policy, prefix_cache, gateway_window, cached_discount,
                             load_bound, locality_hold)             # None without --replicas
    except USER_ERRORS as err:
        fail(error_message(err))
    report_skipped(wl)
    if fleet is not None:
        from ..sim.fleet_simulate import simulate_fleet
        res = simulate_fleet(wl, policy, c, prof, fleet, isolated=isolated, progress=stderr_progress(f"{policy}"))
    else:
        res = run_sim(wl, policy, c, prof, isolated=isolated, progress=stderr_progress(f"{policy}"))
    write_run(out, res.table, res.summary, res.timeline)
    typer.echo(summary_table(res.summary))
    typer.echo(f"wrote {out}/requests.jsonl, summary.json, timeline.json")


@contract_app.command("validate")
def contract_validate(path: Path) -> None:
    """Check a contract file; print its version and hash, or the errors (exit 2)."""
    try:
        c = load_contract(path)
    except ContractError as err:
        fail(str(err))
    typer.echo(f"ok: {path} version={c.version} hash={c.content_hash} tenants={len(c.tenants)} classes={len(c.classes)}")


@contract_app.command("schema")
def contract_schema_cmd() -> None:
    """Print the contract's JSON Schema."""
    typer.echo(json.dumps(contract_schema(), indent=2))


@app.command()
def scenarios() -> None:
    """List the built-in stress scenarios."""
    from ..workloads import scenarios as sc
    typer.echo(sc.__doc__.split("\n\n", 2)[2].strip() if sc.__doc__ else ", ".join(SCENARIOS))


bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: medians over repeated runs (not tests).")
app.add_typer(bench_app, name="bench")


@bench_app.command("scheduler")
def bench_scheduler_cmd(policies: str = typer.Option("fifo,vtc,fair", help="comma-separated policies"),
                        running: int = typer.Option(256, min=1), waiting: str = typer.Option("10000,100000"),
                        tenants: int = typer.Option(1000, min=1), iterations: int = typer.Option(300, min=10),
                        repeats: int = typer.Option(3, min=1), json_out: bool = typer.Option(False, "--json")) -> None:
    """schedule() + update_from_output() in a steady decode state: median per iteration."""
    from ..benchmarks.bench import bench_scheduler
    try:
        names = policy_list(policies)
        try:
            sizes = [int(w) for w in waiting.split(",") if w.strip()]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 0:
            raise ValueError(f"--waiting takes comma-separated counts >= 0, got {waiting!r}")
    except USER_ERRORS as err:
        fail(error_message(err))
    rows = [bench_scheduler(p, running, w, tenants, iterations, repeats) for w in sizes for p in names]
    for r in rows:
        if json_out:
            typer.echo(json.dumps(r))
        else:
            typer.echo(f"{r['policy']:<8} running={r['running']} waiting={r['waiting']:>6} tenants={r['tenants']} "
                       f"median {r['median_ms_per_iteration']:.3f} ms/iteration  "
                       f"{r['us_per_running_request']:.2f} us/running request  core={r['core']}")
    if not json_out:
        base = {(r["policy"], r["waiting"]): r["median_ms_per_iteration"] for r in rows}
        for p in names:
            if len(sizes) > 1:
                typer.echo(f"{p}: {sizes[-1]} waiting / {sizes[0]} waiting = "
                           f"{base[(p, sizes[-1])] / base[(p, sizes[0])]:.2f}x")
        if "fifo" in names:
            for p in names:
                typer.echo(f"{p} / fifo at {sizes[0]} waiting: {base[(p, sizes[0])] / base[('fifo', sizes[0])]:.2f}x")


@bench_app.command("sim")
def bench_sim_cmd(workload: str = typer.Argument("azure:conv"),
                  policies: str = typer.Option("fifo,vtc,fair"),
                  tenants: int = typer.Option(20, min=1, max=MAX_SPREAD_TENANTS),
                  max_requests: Optional[int] = typer.Option(None, min=1),
                  min_requests: Optional[int] = typer.Option(
                      None, min=1, help="tile the trace in time until it has this many requests (e.g. 1000000)"),
                  whole: bool = typer.Option(True, help="also time the whole command (reading, baselines, metrics, files)"),
                  seed: int = 0, json_out: bool = typer.Option(False, "--json")) -> None:
    """Simulated requests per second of wall time, one fresh process per policy."""
    from ..benchmarks.bench import bench_sim
    try:
        names = policy_list(policies)
    except USER_ERRORS as err:
        fail(error_message(err))
    rows = []
    for p in names:
        try:
            rows.append(bench_sim(workload, p, tenants=tenants, seed=seed, max_requests=max_requests,
                                  min_requests=min_requests, whole=whole))
        except (RuntimeError, ValueError) as err:
            fail(str(err))
    for r in rows:
        if json_out:
            typer.echo(json.dumps(r))
        else:
            whole_txt = (f"whole command {r['whole_wall_s']:.2f} s ({r['whole_cpu_s']:.2f} s CPU) "
                         f"{r['whole_requests_per_s']:.0f} requests/s  " if whole else "")
            if "command_wall_s" in r:
                whole_txt += (f"tokenfair simulate {r['command_wall_s']:.2f} s ({r['command_cpu_s']:.2f} s CPU) "
                              f"{r['command_requests_per_s']:.0f} requests/s  ")
            typer.echo(f"{r['policy']:<8} requests={r['requests']} loop {r['wall_s']:.2f} s ({r['cpu_s']:.2f} s CPU) "
                       f"{r['requests_per_s']:.0f} requests/s  {whole_txt}"
                       f"peak RSS {r['peak_rss_mb']:.0f} MB  core={r['core']}")


# the commands and groups the other cli modules define, in the order ``--help`` lists them:
# (the Typer it joins, its name, "module:attribute" in tokenfair.cli)
_COMMANDS = (
    (app, "compare", "compare:compare"), (app, "demo", "compare:demo"),
    (app, "serve", "serve:serve"), (app, "gateway", "serve:gateway"), (app, "load", "serve:load"),
    (app, "run", "engine:run"), (app, "calibrate", "engine:calibrate"), (app, "fidelity", "engine:fidelity"),
    (app, "gate", "contracts:gate"), (app, "shadow", "shadow:shadow"), (app, "sweep", "shadow:sweep"),
    (app, "fake-backend", "fleet:fake_backend"),
    (contract_app, "apply", "contracts:contract_apply"), (contract_app, "history", "contracts:contract_history"),
    (contract_app, "show", "contracts:contract_show"), (contract_app, "diff", "contracts:contract_diff"),
    (contract_app, "rollback", "contracts:contract_rollback"), (contract_app, "push", "live:contract_push"),
    (contract_app, "live", "live:contract_live"), (contract_app, "live-rollback", "live:contract_live_rollback"),
    (bench_app, "engine", "engine:bench_engine"), (bench_app, "fleet", "fleet:bench_fleet"),
    (bench_app, "fleet-latency", "fleet:bench_fleet_latency"), (bench_app, "vllm", "vllm:bench_vllm"),
    (bench_app, "shedding", "shedding:bench_shedding_cmd"), (bench_app, "fleet-sim", "sim_fleet:bench_fleet_cmd"),
)
_GROUPS = ((app, "keys", "keys:keys_app"), (app, "fleet", "fleet:fleet_app"))


def _cli_attribute(ref: str):
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), attr)


def _register_optional() -> None:
    for parent, name, ref in _COMMANDS:
        parent.command(name)(_cli_attribute(ref))
    for parent, name, ref in _GROUPS:
        parent.add_typer(_cli_attribute(ref), name=name)


_register_optional()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
