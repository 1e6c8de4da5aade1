"""Admin endpoints for live contract changes, the contract header and the info metric.

Routes (admin key only: ``Authorization: Bearer <admin key>`` or ``x-admin-key``; the
server holds only its SHA-256, ``--admin-key-sha256``; tenant keys are never accepted, and
without a configured admin key every admin route answers 403):

  ``POST /admin/contract``            body: the contract as YAML or JSON.  Validated, then
                                      applied live (200 with the new VERSION@HASH); a bad
                                      contract is a 400 with the error and the old one stays.
                                      ``?canary_s=S[&eval_s=E]`` applies it as a canary
                                      (:mod:`tokenfair.serve.canary`).
  ``POST /admin/contract/rollback``   back to the previous version at once (409 if none).
  ``POST /admin/contract/reload``     re-read ``--contract`` (what SIGHUP does).
  ``GET  /admin/contract``            the version in force, the canary, the change log.

Every response carries ``x-tokenfair-contract: VERSION@HASH`` (an ASGI middleware, so
streams are untouched); ``/metrics`` has ``tokenfair_contract_info{version,hash} 1``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import signal
from pathlib import Path

import yaml
from fastapi import FastAPI, Request as HTTPRequest
from prometheus_client.core import GaugeMetricFamily

from ..contracts.contract import ContractError, parse_contract
from ..evaluation.thresholds import Thresholds, load_thresholds
from .auth import KeyRing
from .canary import Canary
from .contract_events import ContractEventLog
from .contract_live import LiveContract
from .errors import ServiceError

HEADER = "x-tokenfair-contract"
LIVE_GATE = "live"                       # the thresholds' scenario a canary is judged by
MAX_CONTRACT_BYTES = 1 << 20


def configure_live(service, *, contract_path: str | Path | None = None, admin_key_sha256: str | None = None,
                   thresholds: Thresholds | None = None, store: str | Path | None = None) -> LiveContract:
    """Attach a :class:`LiveContract` to ``service`` (before :func:`create_app`); with ``store``
    its change log is kept in ``store/live.jsonl`` (serve/contract_events.py)."""
    digest = admin_key_sha256.strip().lower() if admin_key_sha256 else None
    if digest is not None:
        if len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
            raise ValueError("--admin-key-sha256 must be the 64 hex digits of the admin key's SHA-256 "
                             "(python -c \"import hashlib;print(hashlib.sha256(b'KEY').hexdigest())\")")
        if digest in service.keyring.by_hash:
            raise ValueError("--admin-key-sha256 is also a tenant's key; the admin key must differ from every tenant key")
    event_log = ContractEventLog(store, service.mode) if store is not None else None
    live = LiveContract(service, contract_path, event_log)
    live.admin_key_sha256 = digest
    live.thresholds = thresholds if thresholds is not None else load_thresholds()
    service.live = live
    return live


def install_sighup(service) -> bool:
    """SIGHUP re-reads ``--contract`` on the service's event loop (main thread only)."""
    live = service.live
    if live is None or not hasattr(signal, "SIGHUP"):
        return False

    def on_hup(signum, frame) -> None:
        try:
            asyncio.get_running_loop().call_soon_threadsafe(live.reload_file)
        except RuntimeError:          # no loop running yet: nothing else touches the policy
            live.reload_file()

    signal.signal(signal.SIGHUP, on_hup)
    return True


class ContractHeader:
    """ASGI middleware: ``x-tokenfair-contract`` on every HTTP response."""

    def __init__(self, app, service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                c = self.service.contract
                value = f"{c.version}@{c.content_hash}".encode("latin-1", "replace")
                message = {**message, "headers": [*message.get("headers", []), (HEADER.encode(), value)]}
            await send(message)

        await self.app(scope, receive, send_with_header)


class ContractInfo:
    """``tokenfair_contract_info{version,hash} 1`` at scrape time."""

    def __init__(self, service) -> None:
        self.service = service

    def describe(self):
        return []

    def collect(self):
        c = self.service.contract
        g = GaugeMetricFamily("tokenfair_contract_info", "The contract in force (value 1)", labels=["version", "hash"])
        g.add_metric([c.version, c.content_hash], 1.0)
        yield g


def _check_admin(live: LiveContract, request: HTTPRequest) -> None:
    if live.admin_key_sha256 is None:
        raise ServiceError(403, "admin endpoints are off: start the server with --admin-key-sha256", "admin_disabled")
    key = KeyRing.presented_key(request.headers.get("authorization"), request.headers.get("x-admin-key"))
    if key is None or not hmac.compare_digest(hashlib.sha256(key.encode()).hexdigest(), live.admin_key_sha256):
        raise ServiceError(401, "admin endpoints need the admin key (not a tenant key)", "invalid_admin_key",
                           headers={"www-authenticate": "Bearer"})


def _float_param(request: HTTPRequest, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ServiceError(400, f"query parameter {name} must be a number of seconds, got {raw!r}", "invalid_request",
                           name) from None


def _state(live: LiveContract) -> dict:
    c = live.contract
    return {"version": c.version, "hash": c.content_hash, "contract": live.label,
            "previous": [p.version + "@" + p.content_hash for p in live.previous],
            "canary": live.canary.status() if live.canary is not None else None,
            "events": [e.as_dict() for e in live.events[-50:]]}


def install_admin(app: FastAPI, service) -> None:
    """The admin routes, the header middleware and the info metric on ``app``."""
    live = service.live if service.live is not None else configure_live(service)
    app.add_middleware(ContractHeader, service=service)
    service.metrics.registry.register(ContractInfo(service))

    @app.get("/admin/contract")
    async def admin_show(request: HTTPRequest):
        _check_admin(live, request)
        return _state(live)

    @app.post("/admin/contract")
    async def admin_apply(request: HTTPRequest):
        _check_admin(live, request)
        canary_s, eval_s = _float_param(request, "canary_s"), _float_param(request, "eval_s")
        body = await request.body()
        if len(body) > MAX_CONTRACT_BYTES:
            raise ServiceError(413, f"contract body over {MAX_CONTRACT_BYTES} bytes", "contract_too_large")
        try:
            data = yaml.safe_load(body.decode("utf-8")) if body.strip() else None
            if data is None:
                raise ContractError("<body>: empty; send the contract as YAML or JSON")
            new = parse_contract(data, "<body>")
            if canary_s is not None:
                cn = Canary(live, new, canary_s, live.thresholds.for_workload(LIVE_GATE), eval_s)
                live.decide(new)
                cn.start()
            else:
                live.apply(new, "apply", request.query_params.get("message", "POST /admin/contract"))
        except (ContractError, ValueError, UnicodeDecodeError, yaml.YAMLError) as err:
            live.refuse(err, "POST /admin/contract")
            raise ServiceError(400, f"contract refused, {live.label} stays in force: {err}", "invalid_contract") from None
        return _state(live)

    @app.post("/admin/contract/rollback")
    async def admin_rollback(request: HTTPRequest):
        _check_admin(live, request)
        try:
            live.rollback(request.query_params.get("message", "POST /admin/contract/rollback"))
        except ContractError as err:
            raise ServiceError(409, str(err), "nothing_to_roll_back") from None
        return _state(live)

    @app.post("/admin/contract/reload")
    async def admin_reload(request: HTTPRequest):
        _check_admin(live, request)
        ev = live.reload_file()
        if ev.event == "refused":
            raise ServiceError(400, f"reload refused, {live.label} stays in force: {ev.reason}", "invalid_contract")
        return _state(live)
