"""``tokenfair serve`` / ``gateway`` / ``load``: the HTTP service modes and the load generator.

The lead registers these functions in ``cli.py`` (``app.command("serve")(serve)`` ...).
User errors (bad contract, model path, URL, keys file, workload) exit with status 2 and a
message, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .common import USER_ERRORS, error_message, fail, resolve_contract, resolve_workload
from ..serve.defaults import CLOSE_S, DEFAULT_GRACE_S, DEFAULT_MAX_BODY_BYTES


def _keyring(contract, allow_anonymous: Optional[str]):
    from ..serve.auth import KeyRing
    ring = KeyRing(contract, anonymous_tenant=allow_anonymous)
    if ring.num_keys == 0 and allow_anonymous is None:
        typer.echo("warning: the contract lists no api_key_sha256; every request will get 401 "
                   "(add keys, or pass --allow-anonymous TENANT for local testing)", err=True)
    else:
        typer.echo(f"{ring.num_keys} API keys map to {ring.num_tenants} tenants"
                   + (f"; requests without a key run as {allow_anonymous!r}" if allow_anonymous else ""), err=True)
    return ring


def _positive(option: str, value: int) -> int:
    if value <= 0:
        raise ValueError(f"{option} must be > 0, got {value}")
    return value


def _digest(option: str, value: Optional[str]) -> Optional[str]:
    from ..contracts.contract import SHA256_HEX_CHARS
    if value is None:
        return None
    d = value.strip().lower()
    if len(d) != SHA256_HEX_CHARS or any(ch not in "0123456789abcdef" for ch in d):
        raise ValueError(f"{option}: expected a SHA-256 digest ({SHA256_HEX_CHARS} hex characters), "
                         "as printed by `tokenfair keys hash KEY`")
    return d


def _live(svc, contract: Optional[Path], admin_key_sha256: Optional[str], thresholds: Optional[Path],
          store: Optional[Path] = None) -> None:
    """Live contract changes: the admin key, the canary's thresholds, SIGHUP, the change log
    kept in a contract store (serve/admin.py, serve/contract_events.py)."""
    from ..serve.admin import configure_live
    from ..evaluation.thresholds import load_thresholds
    configure_live(svc, contract_path=contract, admin_key_sha256=admin_key_sha256,
                   thresholds=load_thresholds(thresholds), store=store)


CONTRACT_STORE_HELP = "contract store folder: live changes, canaries and rollbacks are logged in DIR/live.jsonl"


def _run_server(app, service, host: str, port: int, grace_s: float, log_level: str) -> None:
    import uvicorn

    from ..serve.admin import install_sighup
    from ..serve.shutdown import GracefulServer
    install_sighup(service)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=grace_s + CLOSE_S, access_log=log_level == "debug")
    GracefulServer(config, service, grace_s).run()


def serve(model: str = typer.Option("default", help="'default' (SmolLM2-135M GGUF), a .gguf file or an HF folder"),
          contract: Optional[Path] = typer.Option(None, help="contract YAML (tenants, keys, classes)"),
          port: int = typer.Option(8000, help="TCP port"),
          host: str = typer.Option("127.0.0.1", help="bind address"),
          threads: int = typer.Option(2, help="CPU threads for the model"),
          policy: str = typer.Option("fair", help="scheduling policy (fair, fifo, ...)"),
          kv_tokens: Optional[int] = typer.Option(None, help="KV cache capacity in tokens (default 16384)"),
          block_size: int = typer.Option(16, help="KV block size in tokens"),
          profile: Optional[str] = typer.Option(None, help="calibrated profile YAML for the policy's estimates"),
          served_model_name: Optional[str] = typer.Option(None, help="model id reported by /v1/models"),
          max_tokens_default: int = typer.Option(256, help="max_tokens for chat requests that give none"),
          records: Optional[Path] = typer.Option(None, help="append one JSON line per ended request here"),
          records_max_mb: Optional[float] = typer.Option(None, help="rotate the records file past this size (MB)"),
          admin_key_sha256: Optional[str] = typer.Option(None, help="SHA-256 (hex) of the admin key for /admin/contract"),
          contract_store: Optional[Path] = typer.Option(None, help=CONTRACT_STORE_HELP),
          thresholds: Optional[Path] = typer.Option(None, help="thresholds YAML for canaries (default: built-in)"),
          allow_anonymous: Optional[str] = typer.Option(None, help="tenant for requests WITHOUT a key (testing)"),
          grace_s: float = typer.Option(DEFAULT_GRACE_S, help="shutdown grace period for in-flight requests (+5 s to close)"),
          max_tenant_labels: int = typer.Option(20, help="tenant label values in /metrics before 'other'"),
          seed: int = typer.Option(0, help="sampling seed source"),
          max_body_bytes: int = typer.Option(DEFAULT_MAX_BODY_BYTES, help="largest request body (413 beyond it)"),
          metrics_key_sha256: Optional[str] = typer.Option(None, help="digest of the key GET /metrics requires "
                                                           "('tokenfair keys hash KEY'; default: open)"),
          log_level: str = typer.Option("info", help="uvicorn log level")) -> None:
    """Serve a model with the fair scheduler behind an OpenAI-compatible HTTP API."""
    from ..core.costmodel import load_profile
    from ..serve.app import create_app
    from ..serve.engine_backend import build_engine_service
    from ..serve.records_sink import make_record_sink
    try:
        c = resolve_contract(contract, None)
        ring = _keyring(c, allow_anonymous)
        prof = load_profile(profile) if profile is not None else None
        if threads <= 0 or block_size <= 0 or (kv_tokens is not None and kv_tokens < block_size):
            raise ValueError("threads and block_size must be > 0 and kv_tokens >= block_size")
        svc = build_engine_service(model, c, ring, threads=threads, kv_tokens=kv_tokens, block_size=block_size,
                                   policy=policy, profile=prof, served_model=served_model_name,
                                   max_tokens_default=max_tokens_default,
                                   records=make_record_sink(records, records_max_mb),
                                   seed=seed, max_tenant_labels=max_tenant_labels)
        svc.max_body_bytes = _positive("--max-body-bytes", max_body_bytes)
        svc.metrics_key_sha256 = _digest("--metrics-key-sha256", metrics_key_sha256)
        _live(svc, contract, admin_key_sha256, thresholds, contract_store)
    except (*USER_ERRORS, OSError) as err:
        fail(error_message(err))
    typer.echo(f"serving {svc.served_model} on http://{host}:{port}/v1 (policy {policy}, "
               f"KV {svc.capacity_tokens} tokens, contract {c.version}@{c.content_hash})", err=True)
    _run_server(create_app(svc, grace_s), svc, host, port, grace_s, log_level)


def gateway(backend: List[str] = typer.Option(..., help="OpenAI-compatible backend base URL (repeat)"),
            contract: Optional[Path] = typer.Option(None, help="contract YAML (tenants, keys, classes)"),
            port: int = typer.Option(8080, help="TCP port"),
            host: str = typer.Option("127.0.0.1", help="bind address"),
            policy: str = typer.Option("fair", help="scheduling policy for the gateway queue"),
            backend_key: Optional[str] = typer.Option(None, help="API key for the backends (default: forward the client's)"),
            initial_window: float = typer.Option(2.0, help="initial per-backend concurrency window"),
            max_window: float = typer.Option(256.0, help="largest per-backend window"),
            min_window: float = typer.Option(1.0, help="smallest per-backend window"),
            ttft_tolerance: float = typer.Option(2.0, help="TTFT over tolerance x baseline (+slack) shrinks the window"),
            window_mode: str = typer.Option("saturation", "--window", help="'saturation' (the backend's /metrics "
                                            "queue and KV usage; TTFT when it has none) or 'latency' (TTFT only)"),
            backend_priority: bool = typer.Option(False, help="send vLLM `priority` from the class (backends run "
                                                  "--scheduling-policy priority or the tokenfair scheduler)"),
            max_inflight_tokens: Optional[int] = typer.Option(None, help="cap on predicted tokens in flight per backend"),
            max_context: Optional[int] = typer.Option(None, help="backends' context length (400 context_length_exceeded beyond it)"),
            records: Optional[Path] = typer.Option(None, help="append one JSON line per ended request here"),
            records_max_mb: Optional[float] = typer.Option(None, help="rotate the records file past this size (MB)"),
            admin_key_sha256: Optional[str] = typer.Option(None, help="SHA-256 (hex) of the admin key for /admin/contract"),
            contract_store: Optional[Path] = typer.Option(None, help=CONTRACT_STORE_HELP),
            thresholds: Optional[Path] = typer.Option(None, help="thresholds YAML for canaries (default: built-in)"),
            allow_anonymous: Optional[str] = typer.Option(None, help="tenant for requests WITHOUT a key (testing)"),
            grace_s: float = typer.Option(DEFAULT_GRACE_S, help="shutdown grace period for in-flight requests (+5 s to close)"),
            max_tenant_labels: int = typer.Option(20, help="tenant label values in /metrics before 'other'"),
            connect_timeout_s: float = typer.Option(3.0, help="seconds to connect to a backend"),
            first_token_timeout_s: float = typer.Option(120.0, help="seconds from release to a backend's first token"),
            inter_chunk_timeout_s: float = typer.Option(30.0, help="seconds between a backend's streamed chunks"),
            probe_interval_s: float = typer.Option(1.0, help="seconds between health probes of each backend"),
            probe_timeout_s: float = typer.Option(1.5, help="a probe unanswered this long has failed"),
            probe_failures_down: int = typer.Option(2, help="failed probes in a row that mark a backend down"),
            max_body_bytes: int = typer.Option(DEFAULT_MAX_BODY_BYTES, help="largest request body (413 beyond it)"),
            metrics_key_sha256: Optional[str] = typer.Option(None, help="digest of the key GET /metrics requires "
                                                             "('tokenfair keys hash KEY'; default: open)"),
            log_level: str = typer.Option("info", help="uvicorn log level"),
            redis: Optional[str] = typer.Option(None, help="Redis URL: share tenant state with the fleet's other gateways"),
            fleet: str = typer.Option("default", help="fleet name (the Redis key prefix) with --redis"),
            gateway_id: Optional[str] = typer.Option(None, help="this replica's id in the fleet (default host:port)"),
            lease_ttl: float = typer.Option(5.0, help="with --redis: a dead replica's capacity returns after this (s)"),
            heartbeat: float = typer.Option(0.25, help="with --redis: heartbeat interval (s)"),
            redis_timeout: float = typer.Option(0.25, help="with --redis: a slower call counts as Redis down (s)")) -> None:
    """Fair-queueing gateway in front of OpenAI-compatible backends (adaptive windows)."""
    from ..serve.app import create_app
    from ..serve.gateway import Gateway, WindowConfig
    from ..serve.gateway_health import HealthConfig
    from ..serve.records_sink import make_record_sink
    from ..serve.saturation import SaturationConfig
    try:
        c = resolve_contract(contract, None)
        ring = _keyring(c, allow_anonymous)
        if not (0 < min_window <= initial_window <= max_window):
            raise ValueError("windows must satisfy 0 < min_window <= initial_window <= max_window")
        win = WindowConfig(initial=initial_window, min=min_window, max=max_window, tolerance=ttft_tolerance,
                           max_inflight_tokens=max_inflight_tokens)
        from ..sched.registry import make_policy
        make_policy(policy)
        health = HealthConfig.from_options(connect_timeout_s=connect_timeout_s, first_token_timeout_s=first_token_timeout_s,
                              inter_chunk_timeout_s=inter_chunk_timeout_s, probe_interval_s=probe_interval_s,
                              probe_timeout_s=probe_timeout_s, probe_failures_down=probe_failures_down)
        if window_mode not in ("saturation", "latency"):
            raise ValueError(f"--window: expected 'saturation' or 'latency', got {window_mode!r}")
        sat = SaturationConfig() if window_mode == "saturation" else None
        kw = dict(policy=policy, backend_key=backend_key, window=win, max_context=max_context,
                  records=make_record_sink(records, records_max_mb), max_tenant_labels=max_tenant_labels,
                  health=health, backend_priority=backend_priority, saturation=sat)
        if redis is None:
            gw = Gateway(c, ring, list(backend), **kw)
        else:
            from ..fleet.gateway import fleet_gateway
            gw = fleet_gateway(c, ring, list(backend), redis, fleet, gateway_id or f"{host}:{port}",
                               lease_ttl_s=lease_ttl, heartbeat_s=heartbeat, timeout_s=redis_timeout, **kw)
        gw.max_body_bytes = _positive("--max-body-bytes", max_body_bytes)
        gw.metrics_key_sha256 = _digest("--metrics-key-sha256", metrics_key_sha256)
        _live(gw, contract, admin_key_sha256, thresholds, contract_store)
    except (*USER_ERRORS, OSError) as err:
        fail(error_message(err))
    typer.echo(f"gateway on http://{host}:{port}/v1 -> {', '.join(b.url for b in gw.backends)} (policy {policy})",
               err=True)
    _run_server(create_app(gw, grace_s), gw, host, port, grace_s, log_level)


def load(workload: str = typer.Argument(..., help="built-in scenario or trace path"),
         url: List[str] = typer.Option(..., help="server base URL, e.g. http://127.0.0.1:8000; repeat to "
                                            "spread each tenant's requests over several (a fleet)"),
         keys: Path = typer.Option(..., help="YAML/JSON mapping tenant -> API key ('*' for the rest)"),
         out: Path = typer.Option(..., help="output folder"),
         max_requests: Optional[int] = typer.Option(None, help="replay only the first N requests"),
         time_scale: float = typer.Option(1.0, help="multiply arrival times (2 = half the rate)"),
         seed: int = typer.Option(0, help="seed for scenarios and prompt synthesis"),
         contract: Optional[Path] = typer.Option(None, help="contract for classes/SLOs in the summary"),
         endpoint: str = typer.Option("completions", help="'completions' or 'chat'"),
         model: Optional[str] = typer.Option(None, help="model id (default: the first of /v1/models)"),
         timeout: float = typer.Option(600.0, help="per-request timeout in seconds"),
         max_connections: int = typer.Option(1024, help="concurrent HTTP connections")) -> None:
    """Replay a trace against an OpenAI-compatible endpoint; write the simulator's files."""
    from ..engine.replay import prepare_workload
    from ..runtime.output import summary_table
    from ..serve.load import LoadConfig, base_url, load_keys, run_load, check_keys
    try:
        wl, default_contract = resolve_workload(workload, seed)
        c = resolve_contract(contract, default_contract)
        wl = prepare_workload(wl, max_requests, 1.0)
        key_map = load_keys(keys)
        check_keys(wl.rows, key_map)
        for u in url:
            base_url(u)
        if endpoint not in ("completions", "chat"):
            raise ValueError(f"--endpoint must be 'completions' or 'chat', got {endpoint!r}")
        if time_scale <= 0 or max_connections <= 0 or timeout <= 0:
            raise ValueError("time_scale, timeout and max_connections must be > 0")
    except USER_ERRORS as err:
        fail(error_message(err))
    cfg = LoadConfig(url=url[0], more_urls=tuple(url[1:]), keys=key_map, endpoint=endpoint, model=model, time_scale=time_scale, seed=seed,
                     timeout_s=timeout, max_connections=max_connections)
    _, summary, _ = run_load(wl.rows, cfg, c, out, wl.name)
    typer.echo(summary_table(summary))
    typer.echo(f"wrote {out}/requests.jsonl, summary.json, timeline.json")
