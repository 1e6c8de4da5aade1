"""``tokenfair compare`` and ``tokenfair demo`` (registered on the app in :mod:`tokenfair.cli.app`).

User errors -- a bad contract, trace, profile, thresholds file or policy name -- exit with
status 2 and a message (``tokenfair.cli.app.fail``).  With the default ``--policies`` list, a
policy that is not registered is skipped with a note instead; named explicitly, it is an error.
A policy may carry constructor options as the registry parses them: ``fifo,vtc:output_weight=3``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import USER_ERRORS, error_message, fail, policy_list, report_skipped
from .options import options_in_place
from .workload_options import ShapingOptions, resolve_inputs
from ..sched.registry import DEFAULT_POLICIES

_DEFAULT = ",".join(DEFAULT_POLICIES)


@options_in_place
def compare(workload: str = typer.Argument(..., help="built-in scenario (hol, whale, flood, burst), trace name or trace path"),
            policies: str = typer.Option(_DEFAULT, help="comma-separated policies to compare"),
            contract: Optional[Path] = typer.Option(None, help="contract YAML (default: the scenario's)"),
            profile: Optional[str] = typer.Option(None, help="built-in profile name or YAML file"),
            seed: int = typer.Option(0, help="seed for built-in scenarios and generators"),
            out: Path = typer.Option(..., help="output folder: <out>/<policy>/..., <out>/report.html"),
            thresholds: Optional[Path] = typer.Option(None, help="release-gate thresholds YAML (default: built-in)"),
            shaping: ShapingOptions = ShapingOptions()) -> None:   # --skip-bad-rows ... --remap-tenants
    """Run several policies on the same workload; write each run, a side-by-side table and an
    HTML report with the release-gate verdict per policy."""
    from ..evaluation.compare import run_compare
    from ..evaluation.table import compare_table
    from ..evaluation.thresholds import load_thresholds
    try:
        names = policy_list(policies, _DEFAULT)
        wl, c, prof = resolve_inputs(workload, seed, shaping, contract, profile)
        gate = load_thresholds(thresholds)
    except USER_ERRORS as err:
        fail(error_message(err))
    report_skipped(wl)
    summaries = run_compare(wl, c, prof, names, out, thresholds=gate,
                            progress=lambda m: typer.echo(m, err=True))
    typer.echo(compare_table(summaries))
    typer.echo(f"wrote {out}/<policy>/(requests.jsonl, summary.json, timeline.json) and {out}/report.html")


def demo(out: Path = typer.Option(Path("reports/demo"), help="output folder"),
         seed: int = typer.Option(0, help="seed of the built-in scenarios")) -> None:
    """Compare every available policy on the six built-in scenarios; write one HTML report."""
    from ..evaluation.compare import run_demo
    run_demo(out, seed, DEFAULT_POLICIES, progress=lambda m: typer.echo(m))
    typer.echo(f"open {out}/report.html in a browser")
