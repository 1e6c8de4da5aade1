"""``tokenfair bench shedding WORKLOAD``: shedding's precision and recall (shedding.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import USER_ERRORS, fail, resolve_contract, resolve_workload


def _f(v) -> str:
    return "-" if v is None else f"{v:.1%}"


def bench_shedding_cmd(workload: str = typer.Argument(..., help="built-in scenario, trace name or file"),
                       policy: str = typer.Option("fair", help="the policy that sheds"),
                       contract: Optional[Path] = typer.Option(None, help="contract YAML (default: the scenario's)"),
                       profile: Optional[str] = typer.Option(None, help="built-in profile name or YAML file"),
                       seed: int = typer.Option(0), json_out: bool = typer.Option(False, "--json")) -> None:
    """The same workload with load shedding on and off: of the requests shed, the fraction
    that unshed would have waited past max wait (precision); of those that waited past it,
    the fraction shed (recall)."""
    from ..core.costmodel import load_profile
    from ..evaluation.shedding import bench_shedding
    try:
        wl, scenario_contract = resolve_workload(workload, seed)
        c = resolve_contract(contract, scenario_contract)
        r = bench_shedding(wl, c, load_profile(profile), policy)
    except USER_ERRORS as err:
        fail(str(err))
        return
    if json_out:
        typer.echo(json.dumps(r))
        return
    typer.echo(f"{r['workload']} / {r['policy']}: shed {r['shed']}, precision {_f(r['precision'])}, "
               f"recall {_f(r['recall'])} ({r['late_unshed']} waited past max wait unshed)")
    for label in ("on", "off"):
        s = r[label]
        typer.echo(f"  shedding {label:<3} finished {s['finished_tokens']:,} tokens, in time {s['in_time_tokens']:,}, "
                   f"SLO {s['slo_tokens']:,}; overdue {s['overdue_requests']}; not finished {s['outcomes'] or '-'}")
