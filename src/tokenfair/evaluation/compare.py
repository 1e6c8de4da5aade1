"""Run several policies on the same workload, side by side, and gate them on thresholds.

``run_compare`` simulates every policy (with its isolated baselines) on one workload and
writes ``out_dir/<policy>/{requests.jsonl, summary.json, timeline.json}``; each summary gets
a ``gate`` entry (``{"passed": bool, "checks": [...]}``) from :mod:`tokenfair.evaluation.thresholds`,
with ``fifo``'s run as the throughput baseline when fifo is among the policies (otherwise
the throughput-ratio check is left out): each summary's ``vs_fifo`` holds its finished tokens
and fifo's by the same horizon (``goodput.vs_baseline``).  It also writes ``out_dir/report.html``.

``run_demo`` does that for each built-in scenario into ``out_dir/<scenario>/`` and writes one
``out_dir/report.html`` covering all of them.  Every figure is rendered once: the per-scenario
reports and the combined one share the rendered sections.

A policy name the registry does not know (e.g. ``fair`` while it is being written) is skipped
with a note, never an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from ..contracts.contract import Contract
from ..core.costmodel import Profile, load_profile
from .goodput import vs_baseline
from ..runtime.output import write_run
from ..sched.registry import DEFAULT_POLICIES, make_policy
from .table import compare_table
from .thresholds import Thresholds, evaluate, load_thresholds
from ..workloads.workload import Workload


Progress = Callable[[str], None] | None


def _say(progress: Progress, msg: str) -> None:
    if progress is not None:
        progress(msg)


def available_policies(names: Sequence[str], progress: Progress = print) -> list[str]:
    """``names`` in order, without duplicates and without those the registry does not know."""
    out: list[str] = []
    for name in names:
        if name in out:
            continue
        try:
            make_policy(name)
        except KeyError:
            _say(progress, f"note: policy {name!r} is not registered; skipping it")
            continue
        out.append(name)
    return out


def compare_results(workload: Workload, contract: Contract, profile: Profile, policies: Sequence[str],
                    out_dir: str | Path | None, *, thresholds: Thresholds | None = None,
                    progress: Progress = print, isolated: bool = True) -> dict[str, dict]:
    """Every policy's ``{summary, records, timeline, contract}`` (summaries carry ``gate``);
    written under ``out_dir/<policy>/`` unless ``out_dir`` is None."""
    from ..sim.simulate import isolated_baselines, simulate
    thresholds = thresholds if thresholds is not None else load_thresholds()
    names = available_policies(policies, progress)
    # the same for every policy (sim/simulate.py): computed once for all the runs
    baselines = isolated_baselines(workload, contract, profile) if isolated and names else None
    runs: dict[str, dict] = {}
    for name in names:
        _say(progress, f"  {workload.name}: simulating {name} ({len(workload)} requests)")
        res = simulate(workload, name, contract, profile, isolated=isolated, baselines=baselines)
        runs[name] = {"summary": res.summary, "records": res.records, "timeline": res.timeline,
                      "contract": contract}
    fifo = runs.get("fifo")
    base = fifo["summary"] if fifo is not None else None
    for name, run in runs.items():
        if fifo is not None:
            run["summary"]["vs_fifo"] = vs_baseline(run["records"], fifo["records"])
        checks = evaluate(run["summary"], thresholds, base)
        run["summary"]["gate"] = {"thresholds_version": thresholds.version,
                                  "passed": all(c.passed for c in checks),
                                  "checks": [c.as_dict() for c in checks]}
        if out_dir is not None:
            write_run(Path(out_dir) / name, run["records"], run["summary"], run["timeline"])
    return runs


def run_compare(workload: Workload, contract: Contract, profile: Profile, policies: Sequence[str],
                out_dir: str | Path, *, thresholds: Thresholds | None = None, progress: Progress = print,
                report: bool = True, isolated: bool = True) -> dict[str, dict]:
    """Run ``policies`` on ``workload``; write per-policy results (and ``report.html``) under
    ``out_dir``; return ``{policy: summary}`` (each with its ``gate`` verdict)."""
    runs = compare_results(workload, contract, profile, policies, out_dir, thresholds=thresholds,
                           progress=progress, isolated=isolated)
    if report and runs:
        from .report import write_report
        path = write_report(Path(out_dir) / "report.html", {workload.name: runs},
                            title=f"tokenfair comparison: {workload.name}")
        _say(progress, f"  wrote {path}")
    return {name: run["summary"] for name, run in runs.items()}


def run_demo(out_dir: str | Path, seed: int = 0, policies: Sequence[str] = DEFAULT_POLICIES, *,
             thresholds: Thresholds | None = None, profile: Profile | None = None,
             scenarios: Sequence[str] | None = None, progress: Progress = print) -> dict[str, dict[str, dict]]:
    """The comparison on each built-in scenario (``out_dir/<scenario>/<policy>/...`` and
    ``out_dir/<scenario>/report.html``) plus ``out_dir/report.html`` covering all of them.
    Returns ``{scenario: {policy: summary}}``."""
    from .report import render_section, write_html
    from ..workloads.scenarios import SCENARIOS, build_scenario
    profile = profile or load_profile(None)
    thresholds = thresholds if thresholds is not None else load_thresholds()
    names = available_policies(policies, progress)
    out = Path(out_dir)
    sections: list[tuple[str, str]] = []
    result: dict[str, dict[str, dict]] = {}
    for scenario in scenarios or SCENARIOS:
        wl, contract = build_scenario(scenario, seed)
        _say(progress, f"scenario {scenario}: {len(wl)} requests, policies {', '.join(names)}")
        runs = compare_results(wl, contract, profile, names, out / scenario, thresholds=thresholds,
                               progress=progress)
        section = render_section(scenario, runs)
        write_html(out / scenario / "report.html", [(scenario, section)], f"tokenfair comparison: {scenario}")
        sections.append((scenario, section))
        result[scenario] = {p: r["summary"] for p, r in runs.items()}
        _say(progress, compare_table(result[scenario]))
        del runs
    path = write_html(out / "report.html", sections, f"tokenfair demo: {len(sections)} scenarios, seed {seed}")
    _say(progress, f"wrote {path} (and a report.html per scenario)")
    return result
