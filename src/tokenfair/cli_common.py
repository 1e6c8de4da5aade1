"""Helpers every CLI command shares: user-error reporting (exit 2) and input resolution."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .contract import Contract, ContractError, load_contract
from .costmodel import ProfileError
from .scenarios import SCENARIOS, build_scenario
from .workload import Workload, WorkloadError, read_trace

USER_ERRORS = (ContractError, WorkloadError, ProfileError, KeyError, ValueError, FileNotFoundError)


def fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def resolve_workload(spec: str, seed: int, *, skip_bad_rows: bool = False) -> tuple[Workload, Contract | None]:
    """A built-in scenario (with its contract), a public trace name, or a trace file."""
    if spec in SCENARIOS:
        return build_scenario(spec, seed)
    try:
        from .traces import load_workload
    except ModuleNotFoundError:
        return read_trace(spec), None
    try:
        return load_workload(spec, seed=seed, skip_bad_rows=skip_bad_rows), None
    except WorkloadError as err:
        if Path(spec).exists():
            raise
        raise WorkloadError(f"{err}; built-in scenarios: {', '.join(SCENARIOS)}") from None


def resolve_contract(path: Optional[Path], default: Contract | None) -> Contract:
    if path is not None:
        return load_contract(path)
    return default or Contract()


def _message(err: Exception) -> str:
    return err.args[0] if isinstance(err, KeyError) and err.args else str(err)


