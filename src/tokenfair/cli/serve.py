"""``tokenfair serve`` / ``gateway`` / ``load``: the HTTP service modes and the load generator.

The lead registers these functions in ``cli.py`` (``app.command("serve")(serve)`` ...).
``serve`` and ``gateway`` take their options as one frozen dataclass each (``ServeOptions``,
``GatewayOptions``; the options both share are ``ServiceOptions`` and ``HttpOptions``,
declared once: :mod:`tokenfair.cli.options`).  User errors (bad contract, model path, URL, keys file, workload) exit with status 2 and a
message, never a traceback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer

from .common import MAX_PORT, USER_ERRORS, error_message, fail, resolve_contract, resolve_workload
from .options import nested, option, options_command
from ..sched.backend_window import DEFAULT_MAX_PREFILL_TOKENS
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
    from ..serve.heap import freeze_startup_heap
    from ..serve.shutdown import GracefulServer
    install_sighup(service)
    freeze_startup_heap()        # the loaded model, tokenizer and modules: out of full collections
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=grace_s + CLOSE_S, access_log=log_level == "debug")
    GracefulServer(config, service, grace_s).run()


@dataclass(frozen=True)
class ServiceOptions:
    """The records, live-contract, shutdown and label options of both service modes."""

    records: Optional[Path] = option(None, "append one JSON line per ended request here")
    records_max_mb: Optional[float] = option(None, "rotate the records file past this size (MB)")
    admin_key_sha256: Optional[str] = option(None, "SHA-256 (hex) of the admin key for /admin/contract")
    contract_store: Optional[Path] = option(None, CONTRACT_STORE_HELP)
    thresholds: Optional[Path] = option(None, "thresholds YAML for canaries (default: built-in)")
    allow_anonymous: Optional[str] = option(None, "tenant for requests WITHOUT a key (testing)")
    grace_s: float = option(DEFAULT_GRACE_S, "shutdown grace period for in-flight requests (+5 s to close)", min=0.0)
    max_tenant_labels: int = option(20, "tenant label values in /metrics before 'other'", min=0)


@dataclass(frozen=True)
class HttpOptions:
    """The request-size, /metrics access and log options of both service modes."""

    max_body_bytes: int = option(DEFAULT_MAX_BODY_BYTES, "largest request body (413 beyond it)")
    metrics_key_sha256: Optional[str] = option(None, "digest of the key GET /metrics requires "
                                               "('tokenfair keys hash KEY'; default: open)")
    log_level: str = option("info", "uvicorn log level")


def _records(opts: ServiceOptions):
    from ..serve.records_sink import make_record_sink
    return make_record_sink(opts.records, opts.records_max_mb)


def _configure(svc, contract: Optional[Path], opts: ServiceOptions, http: HttpOptions) -> None:
    """The body limit, the /metrics key and live contract changes of a built service."""
    svc.max_body_bytes = _positive("--max-body-bytes", http.max_body_bytes)
    svc.metrics_key_sha256 = _digest("--metrics-key-sha256", http.metrics_key_sha256)
    _live(svc, contract, opts.admin_key_sha256, opts.thresholds, opts.contract_store)


def _start(build: Callable[[], tuple[Any, str]], opts: ServeOptions | GatewayOptions) -> None:
    """``build()`` -> (service, banner); configure it, print the banner, serve until stopped.
    A user error (bad contract, option, path) exits with status 2 and a message."""
    from ..serve.app import create_app
    try:
        svc, banner = build()
        _configure(svc, opts.contract, opts.service, opts.http)
    except (*USER_ERRORS, OSError) as err:
        fail(error_message(err))
    typer.echo(banner, err=True)
    grace_s = opts.service.grace_s
    _run_server(create_app(svc, grace_s), svc, opts.host, opts.port, grace_s, opts.http.log_level)


@dataclass(frozen=True)
class ServeOptions:
    """``tokenfair serve``'s options, in --help order."""

    model: str = option("default", "'default' (SmolLM2-135M GGUF), a .gguf file or an HF folder")
    contract: Optional[Path] = option(None, "contract YAML (tenants, keys, classes)")
    port: int = option(8000, "TCP port", min=1, max=MAX_PORT)
    host: str = option("127.0.0.1", "bind address")
    threads: int = option(2, "CPU threads for the model")
    policy: str = option("fair", "scheduling policy (fair, fifo, ...)")
    kv_tokens: Optional[int] = option(None, "KV cache capacity in tokens (default 16384)")
    block_size: int = option(16, "KV block size in tokens")
    profile: Optional[str] = option(None, "calibrated profile YAML for the policy's estimates")
    served_model_name: Optional[str] = option(None, "model id reported by /v1/models")
    max_tokens_default: int = option(256, "max_tokens for chat requests that give none", min=1)
    service: ServiceOptions = nested(ServiceOptions)
    seed: int = option(0, "sampling seed source")
    http: HttpOptions = nested(HttpOptions)


@options_command(ServeOptions)
def serve(opts: ServeOptions) -> None:
    """Serve a model with the fair scheduler behind an OpenAI-compatible HTTP API."""
    _start(lambda: _build_serve(opts), opts)


def _build_serve(o: ServeOptions):
    """(the engine service, its start-up line)."""
    from ..core.costmodel import load_profile
    from ..serve.engine_backend import build_engine_service
    c = resolve_contract(o.contract, None)
    ring = _keyring(c, o.service.allow_anonymous)
    prof = load_profile(o.profile) if o.profile is not None else None
    if o.threads <= 0 or o.block_size <= 0 or (o.kv_tokens is not None and o.kv_tokens < o.block_size):
        raise ValueError("threads and block_size must be > 0 and kv_tokens >= block_size")
    svc = build_engine_service(o.model, c, ring, threads=o.threads, kv_tokens=o.kv_tokens, block_size=o.block_size,
                               policy=o.policy, profile=prof, served_model=o.served_model_name,
                               max_tokens_default=o.max_tokens_default, records=_records(o.service), seed=o.seed,
                               max_tenant_labels=o.service.max_tenant_labels)
    return svc, (f"serving {svc.served_model} on http://{o.host}:{o.port}/v1 (policy {o.policy}, "
                 f"KV {svc.capacity_tokens} tokens, contract {c.version}@{c.content_hash})")


@dataclass(frozen=True)
class GatewayOptions:
    """``tokenfair gateway``'s options, in --help order."""

    backend: List[str] = option(..., "OpenAI-compatible backend base URL (repeat)")
    contract: Optional[Path] = option(None, "contract YAML (tenants, keys, classes)")
    port: int = option(8080, "TCP port", min=1, max=MAX_PORT)
    host: str = option("127.0.0.1", "bind address")
    policy: str = option("fair", "scheduling policy for the gateway queue")
    backend_key: Optional[str] = option(None, "API key for the backends (default: forward the client's)")
    initial_window: float = option(2.0, "initial per-backend concurrency window")
    max_window: float = option(256.0, "largest per-backend window")
    min_window: float = option(1.0, "smallest per-backend window")
    ttft_tolerance: float = option(2.0, "TTFT over tolerance x baseline (+slack) shrinks the window", min=1.0)
    window_mode: str = option("saturation", "'saturation' (the backend's /metrics queue and KV usage; TTFT "
                              "when it has none) or 'latency' (TTFT only)", "--window")
    backend_priority: bool = option(False, "send vLLM `priority` from the class (backends run "
                                    "--scheduling-policy priority or the tokenfair scheduler)")
    max_inflight_tokens: Optional[int] = option(None, "cap on predicted tokens in flight per backend", min=1)
    max_prefill_backlog: int = option(DEFAULT_MAX_PREFILL_TOKENS, "with --window saturation: prompt tokens released to a vLLM "
                                      "backend without a first token yet, at most (0: no bound)")
    max_context: Optional[int] = option(None, "backends' context length (400 context_length_exceeded beyond it)",
                                        min=1)
    service: ServiceOptions = nested(ServiceOptions)
    connect_timeout_s: float = option(3.0, "seconds to connect to a backend")
    first_token_timeout_s: float = option(120.0, "seconds from release to a backend's first token")
    inter_chunk_timeout_s: float = option(30.0, "seconds between a backend's streamed chunks")
    probe_interval_s: float = option(1.0, "seconds between health probes of each backend")
    probe_timeout_s: float = option(1.5, "a probe unanswered this long has failed")
    probe_failures_down: int = option(2, "failed probes in a row that mark a backend down")
    http: HttpOptions = nested(HttpOptions)
    redis: Optional[str] = option(None, "Redis URL: share tenant state with the fleet's other gateways")
    fleet: str = option("default", "fleet name (the Redis key prefix) with --redis")
    gateway_id: Optional[str] = option(None, "this replica's id in the fleet (default host:port)")
    lease_ttl: float = option(5.0, "with --redis: a dead replica's capacity returns after this (s)")
    heartbeat: float = option(0.25, "with --redis: heartbeat interval (s)")
    redis_timeout: float = option(0.25, "with --redis: a slower call counts as Redis down (s)")


def _gateway_kwargs(o: GatewayOptions) -> dict:
    """The Gateway's keyword arguments from the options (a bad value is a ValueError naming it)."""
    from ..sched.registry import make_policy
    from ..serve.gateway import WindowConfig
    from ..serve.gateway_health import HealthConfig
    from ..serve.saturation import SaturationConfig
    if not (0 < o.min_window <= o.initial_window <= o.max_window):
        raise ValueError("windows must satisfy 0 < min_window <= initial_window <= max_window")
    win = WindowConfig(initial=o.initial_window, min=o.min_window, max=o.max_window, tolerance=o.ttft_tolerance,
                       max_inflight_tokens=o.max_inflight_tokens)
    make_policy(o.policy)
    health = HealthConfig.from_options(connect_timeout_s=o.connect_timeout_s,
                                       first_token_timeout_s=o.first_token_timeout_s,
                                       inter_chunk_timeout_s=o.inter_chunk_timeout_s,
                                       probe_interval_s=o.probe_interval_s, probe_timeout_s=o.probe_timeout_s,
                                       probe_failures_down=o.probe_failures_down)
    if o.window_mode not in ("saturation", "latency"):
        raise ValueError(f"--window: expected 'saturation' or 'latency', got {o.window_mode!r}")
    if o.max_prefill_backlog < 0:
        raise ValueError(f"--max-prefill-backlog: expected tokens >= 0 (0: no bound), got {o.max_prefill_backlog}")
    sat = (SaturationConfig(max_prefill_tokens=o.max_prefill_backlog or None)
           if o.window_mode == "saturation" else None)
    return dict(policy=o.policy, backend_key=o.backend_key, window=win, max_context=o.max_context,
                records=_records(o.service), max_tenant_labels=o.service.max_tenant_labels,
                health=health, backend_priority=o.backend_priority, saturation=sat)


def _build_gateway(o: GatewayOptions):
    """(a Gateway, or a fleet replica with ``--redis``; its start-up line)."""
    from ..serve.gateway import Gateway
    c = resolve_contract(o.contract, None)
    ring = _keyring(c, o.service.allow_anonymous)
    kw = _gateway_kwargs(o)
    if o.redis is None:
        gw = Gateway(c, ring, list(o.backend), **kw)
    else:
        from ..fleet.gateway import fleet_gateway
        gw = fleet_gateway(c, ring, list(o.backend), o.redis, o.fleet, o.gateway_id or f"{o.host}:{o.port}",
                           lease_ttl_s=o.lease_ttl, heartbeat_s=o.heartbeat, timeout_s=o.redis_timeout, **kw)
    return gw, f"gateway on http://{o.host}:{o.port}/v1 -> {', '.join(b.url for b in gw.backends)} (policy {o.policy})"


@options_command(GatewayOptions)
def gateway(opts: GatewayOptions) -> None:
    """Fair-queueing gateway in front of OpenAI-compatible backends (adaptive windows)."""
    _start(lambda: _build_gateway(opts), opts)


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
        if not (0 < time_scale < math.inf and 0 < timeout < math.inf) or max_connections <= 0:
            raise ValueError("time_scale, timeout and max_connections must be finite and > 0")
    except USER_ERRORS as err:
        fail(error_message(err))
    cfg = LoadConfig(url=url[0], more_urls=tuple(url[1:]), keys=key_map, endpoint=endpoint, model=model, time_scale=time_scale, seed=seed,
                     timeout_s=timeout, max_connections=max_connections)
    _, summary, _ = run_load(wl.rows, cfg, c, out, wl.name)
    typer.echo(summary_table(summary))
    typer.echo(f"wrote {out}/requests.jsonl, summary.json, timeline.json")
