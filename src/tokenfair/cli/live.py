"""``tokenfair contract push / live / live-rollback``: change a running service's contract
over its admin endpoints (``serve``/``gateway`` with ``--admin-key-sha256``).

The admin key comes from ``--admin-key`` or ``$TOKENFAIR_ADMIN_KEY``.  ``push --canary-s S
--wait`` waits for the canary's verdict and exits 0 when the candidate held, 1 when it was
rolled back (the breached checks are printed); errors from the server exit 2.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from .common import fail

KEY_HELP = "admin key (default: $TOKENFAIR_ADMIN_KEY)"
VERDICT_GRACE_S = 30.0      # --wait gives up this long after the canary period
POLL_S = 0.5


def _client(url: str, admin_key: Optional[str]):
    import httpx
    if not admin_key:
        fail("no admin key: pass --admin-key or set TOKENFAIR_ADMIN_KEY")
    return httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {admin_key}"}, timeout=30)


def _call(client, method: str, path: str, **kw) -> dict:
    import httpx
    try:
        r = client.request(method, path, **kw)
    except httpx.HTTPError as err:
        fail(f"{client.base_url}{path}: {err}")
    if r.status_code != 200:
        try:
            msg = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = r.text
        fail(f"{client.base_url}{path}: HTTP {r.status_code}: {msg}")
    return r.json()


def _show(state: dict) -> None:
    typer.echo(f"in force: {state['contract']}")
    if state.get("canary"):
        c = state["canary"]
        typer.echo(f"canary: {c['candidate']} {c['state']} ({c['evaluations']} evaluations"
                   + (f"; breached {', '.join(c['breached'])}" if c["breached"] else "") + ")")
    for e in state.get("events", [])[-5:]:
        typer.echo(f"  {e['event']:<14} {e['version']}  {e['reason']}")


def contract_push(path: Path = typer.Argument(..., help="contract YAML to apply"),
                  url: str = typer.Option(..., help="service base URL, e.g. http://127.0.0.1:8080"),
                  canary_s: Optional[float] = typer.Option(None, help="apply as a canary for this many seconds"),
                  eval_s: Optional[float] = typer.Option(None, help="canary evaluation period (s)"),
                  wait: bool = typer.Option(False, help="wait for the canary's verdict (exit 1 if rolled back)"),
                  admin_key: Optional[str] = typer.Option(None, envvar="TOKENFAIR_ADMIN_KEY", help=KEY_HELP)) -> None:
    """Apply a contract to a running service (validated there; a bad one is refused)."""
    from ..contracts.contract import ContractError, load_contract
    try:
        c = load_contract(path)
    except ContractError as err:
        fail(str(err))
    params = {k: v for k, v in (("canary_s", canary_s), ("eval_s", eval_s)) if v is not None}
    with _client(url, admin_key) as client:
        state = _call(client, "POST", "/admin/contract", params=params, content=Path(path).read_bytes())
        _show(state)
        if canary_s is None or not wait:
            return
        label = f"{c.version}@{c.content_hash}"
        deadline = time.monotonic() + canary_s + VERDICT_GRACE_S
        while True:
            time.sleep(POLL_S)
            state = _call(client, "GET", "/admin/contract")
            if state.get("canary") is None or state["canary"]["candidate"] != label:
                break
            if time.monotonic() > deadline:
                typer.echo(f"canary of {label}: no verdict {VERDICT_GRACE_S:g}s after its period ended")
                raise typer.Exit(1)
    ev = next((e for e in reversed(state["events"]) if e["event"] in ("canary_passed", "rollback", "apply",
                                                                          "reload")), None)
    _show(state)
    if ev is None or ev["event"] != "canary_passed":
        typer.echo(f"canary of {label} did not hold: {ev['reason'] if ev else 'no verdict'}")
        raise typer.Exit(1)
    typer.echo(f"canary of {label} held")


def contract_live(url: str = typer.Option(..., help="service base URL"),
                  admin_key: Optional[str] = typer.Option(None, envvar="TOKENFAIR_ADMIN_KEY", help=KEY_HELP)) -> None:
    """The contract in force in a running service, its canary and recent changes."""
    with _client(url, admin_key) as client:
        _show(_call(client, "GET", "/admin/contract"))


def contract_live_rollback(url: str = typer.Option(..., help="service base URL"),
                           admin_key: Optional[str] = typer.Option(None, envvar="TOKENFAIR_ADMIN_KEY", help=KEY_HELP)) -> None:
    """Roll a running service back to its previous contract at once."""
    with _client(url, admin_key) as client:
        _show(_call(client, "POST", "/admin/contract/rollback"))
