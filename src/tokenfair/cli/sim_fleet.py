"""The fleet options of ``tokenfair simulate`` (``--replicas N --router NAME --fleet-policy``)
turned into a validated :class:`~tokenfair.sim.fleet.FleetConfig`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer
from pydantic import ValidationError

from ..workloads.transforms import MAX_SPREAD_TENANTS

if TYPE_CHECKING:
    from ..sim.fleet import FleetConfig


def fleet_config(replicas: int | None, router: str, fleet_policy: str, prefix_cache: bool,
                 gateway_window: int | None, cached_discount: float, load_bound: float = 1.5,
                 locality_hold: float = 0.0) -> "FleetConfig | None":
    """The fleet to simulate; None without ``--replicas`` (one engine).  A fleet option set
    without ``--replicas`` is refused (it would be ignored): the error names it and the fix."""
    from ..sim.fleet import FleetConfig
    if replicas is None:
        default = FleetConfig()
        given = {"--router": router != default.router, "--fleet-policy": fleet_policy != default.fleet_policy,
                 "--prefix-cache": prefix_cache != default.prefix_cache,
                 "--gateway-window": gateway_window != default.gateway_window,
                 "--cached-discount": cached_discount != default.cached_discount,
                 "--load-bound": load_bound != default.load_bound,
                 "--locality-hold": locality_hold != default.locality_hold_s}
        named = [name for name, set_ in given.items() if set_]
        if named:
            raise ValueError(f"{', '.join(named)}: fleet option(s) without --replicas; add --replicas N "
                             f"(--replicas 1 for one engine with them)")
        return None
    try:
        return FleetConfig(num_replicas=replicas, router=router, fleet_policy=fleet_policy,
                           prefix_cache=prefix_cache, gateway_window=gateway_window,
                           cached_discount=cached_discount, load_bound=load_bound,
                           locality_hold_s=locality_hold)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "fleet options"
        names = {"num_replicas": "replicas", "locality_hold_s": "locality_hold"}
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise ValueError(f"--{names.get(where, where).replace('_', '-')}: {msg}") from None


def bench_fleet_cmd(workload: str = typer.Argument("azure:conv"),
                    policy: str = typer.Option("vtc", help="each replica's scheduling policy"),
                    replicas: int = typer.Option(8, min=1), router: str = typer.Option("round-robin"),
                    fleet_policy: str = typer.Option("none"), prefix_cache: bool = typer.Option(False),
                    tenants: Optional[int] = typer.Option(None, min=1, max=MAX_SPREAD_TENANTS,
                                                          help="spread requests over N tenants"),
                    min_requests: Optional[int] = typer.Option(None, min=1, help="tile the trace in time"),
                    max_requests: Optional[int] = typer.Option(None, min=1),
                    rate_scale: Optional[float] = typer.Option(
                        None, help="multiply the arrival rate (default: the replica count)"),
                    whole: bool = typer.Option(True, help="also time the whole command"),
                    seed: int = 0, json_out: bool = typer.Option(False, "--json")) -> None:
    """A fleet simulation in a fresh process: the loop, the whole command, peak RSS."""
    import json

    from ..benchmarks.fleet_sim import bench_fleet
    from .common import fail
    try:
        from ..sim.fleet import DEFAULT_CACHED_DISCOUNT
        fleet_config(replicas, router, fleet_policy, prefix_cache, None, DEFAULT_CACHED_DISCOUNT)
        r = bench_fleet(workload, policy, replicas=replicas, router=router, fleet_policy=fleet_policy,
                        prefix_cache=prefix_cache, tenants=tenants, seed=seed, max_requests=max_requests,
                        min_requests=min_requests, rate_scale=float(replicas) if rate_scale is None else rate_scale,
                        whole=whole)
    except (ValueError, RuntimeError) as err:
        fail(str(err))
    if json_out:
        typer.echo(json.dumps(r))
        return
    typer.echo(f"{r['policy']:<6} replicas={r['replicas']} router={r['router']} fleet={r['fleet_policy']} "
               f"requests={r['requests']} tenants={r['tenants']}  loop {r['wall_s']:.1f} s "
               f"({r['requests_per_s']:.0f} requests/s, {r['cpu_s']:.1f} s CPU)"
               + (f"  whole {r['whole_wall_s']:.1f} s ({r['whole_requests_per_s']:.0f} requests/s, "
                  f"{r['whole_cpu_s']:.1f} s CPU)" if whole else "")
               + f"  peak RSS {r['peak_rss_mb']:.0f} MB  core={r['core']}")
