"""The contract's life on the command line: ``contract apply/history/show/diff/rollback`` and
``gate`` here, ``shadow`` and ``sweep`` in :mod:`tokenfair.cli.shadow` (all registered on the
app by :mod:`tokenfair.cli.app`).

Bad input (a contract, a store, a trace, a thresholds or grid file) exits with status 2 and a
message naming the place and the fix; ``gate`` and ``sweep`` exit 1 when a threshold is
breached (each one named).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional

import typer

from .common import USER_ERRORS, error_message, fail, sim_inputs

if TYPE_CHECKING:
    from ..contracts.store import ContractStore, Entry

STORE_HELP = "contract store folder (plain files; keep it in git)"


def contract_apply(path: Path = typer.Argument(..., help="contract YAML with a version: label"),
                   store: Path = typer.Option(..., help=STORE_HELP),
                   message: str = typer.Option("", "--message", "-m", help="why this change")) -> None:
    """Validate a contract and record it as the current version of the store."""
    e = _change_store(store, lambda s: s.apply(path, message))
    typer.echo(f"applied {e.version}@{e.hash} at {e.time} (previous: {e.previous or 'none'})")


def contract_history(store: Path = typer.Option(..., help=STORE_HELP)) -> None:
    """Every change of the store, oldest first; '*' marks the current version.  Then the live
    changes services logged here (apply, reload, canary, canary_passed, rollback, refused)."""
    from ..contracts.store import ContractStore
    try:
        s = ContractStore(store)
        hist, cur = s.history(), s.current()
    except USER_ERRORS as err:
        fail(error_message(err))
    if not hist:
        typer.echo(f"{store}: no store changes recorded")
    for i, e in enumerate(hist):
        mark = "*" if i == len(hist) - 1 and e.version == cur else " "
        typer.echo(f"{mark} {e.time}  {e.event:<8} {e.version}@{e.hash}  {e.message}")
    from ..serve.contract_events import LIVE_LOG, read_live_log
    live = read_live_log(Path(store) / LIVE_LOG)
    if live:
        typer.echo(f"live changes (serve/gateway --contract-store {store}), oldest first:")
    for d in live:
        typer.echo(f"  {d.get('time', '?')}  {d.get('mode', '?'):<7} {d['event']:<13} {d['version']}  {d.get('reason', '')}")


def contract_show(version: Optional[str] = typer.Argument(None, help="version label (default: the current one)"),
                  store: Path = typer.Option(..., help=STORE_HELP)) -> None:
    """Print a stored version exactly as it was applied."""
    from ..contracts.store import ContractStore
    try:
        s = ContractStore(store)
        label = version or s.current()
        if label is None:
            raise ValueError(f"{store}: the store is empty; run 'tokenfair contract apply FILE --store {store}'")
        c = s.load(label)
        text = s.text(label)
    except USER_ERRORS as err:
        fail(error_message(err))
    typer.echo(f"# {c.version}@{c.content_hash}")
    typer.echo(text.rstrip("\n"))


def contract_diff(a: str = typer.Argument(..., help="version label in --store, or a contract file"),
                  b: str = typer.Argument(..., help="version label in --store, or a contract file"),
                  store: Optional[Path] = typer.Option(None, help=STORE_HELP)) -> None:
    """Semantic diff: fields changed per tenant and class, entitled shares under contention."""
    from ..contracts.diff import diff_contracts, format_diff
    from ..contracts.store import resolve_contract_ref
    try:
        ca, cb = resolve_contract_ref(a, store), resolve_contract_ref(b, store)
    except USER_ERRORS as err:
        fail(error_message(err))
    typer.echo(format_diff(diff_contracts(ca, cb)))


def contract_rollback(version: Optional[str] = typer.Argument(None, help="version to return to (default: the previous one)"),
                      store: Path = typer.Option(..., help=STORE_HELP),
                      message: str = typer.Option("", "--message", "-m", help="why")) -> None:
    """Make an earlier version current again (recorded in the history)."""
    e = _change_store(store, lambda s: s.rollback(version, message))
    typer.echo(f"rolled back to {e.version}@{e.hash} (from {e.previous})")


def _change_store(store: Path, change: Callable[[ContractStore], Entry]) -> Entry:
    """``change`` applied to the contract store in ``store`` (its history records it); a
    user error exits 2."""
    from ..contracts.store import ContractStore
    try:
        return change(ContractStore(store))
    except USER_ERRORS as err:
        fail(error_message(err))


def gate(traces: List[str] = typer.Argument(..., help="traces: built-in scenario, public trace name or file"),
         baseline: str = typer.Option(..., help="contract in force: file, or version label in --store"),
         candidate: str = typer.Option(..., help="contract to release: file, or version label in --store"),
         out: Path = typer.Option(..., help="output folder: gate.html, gate.json, <trace>/<role>/..."),
         profile: Optional[str] = typer.Option(None, help="built-in profile name or YAML file"),
         thresholds: Optional[Path] = typer.Option(None, help="thresholds YAML (default: built-in)"),
         store: Optional[Path] = typer.Option(None, help=STORE_HELP),
         policy: str = typer.Option("fair", help="scheduling policy both contracts run under"),
         seed: int = typer.Option(0, help="seed of built-in scenarios"),
         max_requests: Optional[int] = typer.Option(None, min=1, help="keep the first N requests of each trace")) -> None:
    """Simulate the baseline and the candidate contract on the same traces; exit 0 (pass),
    1 (a threshold breached, each named) or 2 (bad input)."""
    from ..contracts.store import resolve_contract_ref
    from ..contracts.gate import gate_table, run_gate
    from ..contracts.gate_report import write_gate_report
    try:
        a, b = resolve_contract_ref(baseline, store), resolve_contract_ref(candidate, store)
        prof, th, wls = sim_inputs(profile, thresholds, policy, traces, seed, max_requests)
    except USER_ERRORS as err:
        fail(error_message(err))
    gates = run_gate(wls, a, b, prof, th, policy=policy, out_dir=out, progress=lambda m: typer.echo(m, err=True))
    for g in gates:
        typer.echo(gate_table(g))
    path = write_gate_report(out, gates, f"tokenfair gate: {a.version} -> {b.version}")
    ok = all(g.passed for g in gates)
    breached = [c.name for g in gates for c in g.checks if not c.passed]
    typer.echo(f"gate {'PASS' if ok else 'FAIL'}: {b.version}@{b.content_hash} vs {a.version}@{a.content_hash}"
               + ("" if ok else f"; breached: {', '.join(breached)}"))
    typer.echo(f"wrote {path} and {out}/gate.json")
    if not ok:
        raise typer.Exit(1)
