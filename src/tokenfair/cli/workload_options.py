"""The options that shape the workload ``simulate`` and ``compare`` read, declared once.

Each command takes them as one parameter ``shaping: ShapingOptions = ShapingOptions()``
(:func:`tokenfair.cli.options.options_in_place` lists the options in its place);
:func:`resolve_inputs` turns a workload spec, its shaping, a contract and a profile option into
what a simulation runs on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .common import resolve_contract, resolve_workload, shape_workload
from .options import option
from ..contracts.contract import Contract
from ..core.costmodel import Profile, load_profile
from ..workloads.transforms import MAX_SPREAD_TENANTS
from ..workloads.workload import Workload


@dataclass(frozen=True)
class ShapingOptions:
    """How the workload is cut and reshaped (``ShapingOptions()``: as read)."""

    skip_bad_rows: bool = option(False, "count and skip unusable trace rows")
    start_s: Optional[float] = option(None, "keep arrivals from this time (s)")
    end_s: Optional[float] = option(None, "keep arrivals before this time (s)")
    rate_scale: Optional[float] = option(None, "multiply the arrival rate")
    spread_tenants: Optional[int] = option(None, "spread requests over N tenants", min=1,
                                            max=MAX_SPREAD_TENANTS)
    max_requests: Optional[int] = option(None, "keep the first N requests", min=1)
    remap_tenants: Optional[Path] = option(None, "YAML/JSON mapping old tenant -> new")


def resolve_inputs(workload: str, seed: int, shaping: ShapingOptions, contract: Path | None,
                   profile: str | None) -> tuple[Workload, Contract, Profile]:
    """The workload (a scenario, a trace name or file, shaped), the contract (the file, else
    the scenario's, else the default) and the profile; user errors raise."""
    wl, default_contract = resolve_workload(workload, seed, skip_bad_rows=shaping.skip_bad_rows)
    wl = shape_workload(wl, start_s=shaping.start_s, end_s=shaping.end_s, rate_scale=shaping.rate_scale,
                        spread_tenants=shaping.spread_tenants, max_requests=shaping.max_requests, seed=seed,
                        remap_tenants=shaping.remap_tenants)
    return wl, resolve_contract(contract, default_contract), load_profile(profile)
