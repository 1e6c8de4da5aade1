"""``tokenfair fleet status`` and ``tokenfair fake-backend``.  Registered in ``cli.py``;
user errors exit with status 2 and a message."""

from __future__ import annotations

import json
import math
from typing import Optional

import typer

from .common import MAX_PORT, USER_ERRORS, error_message, fail

fleet_app = typer.Typer(no_args_is_help=True, help="A fleet of gateways sharing state through Redis.")


@fleet_app.command("status")
def fleet_status(redis: str = typer.Option(..., help="the fleet's Redis URL, e.g. redis://127.0.0.1:6379/0"),
                 fleet: str = typer.Option("default", help="fleet name (as the gateways' --fleet)"),
                 heartbeat: float = typer.Option(0.25, help="the gateways' heartbeat interval (s), for 'live'"),
                 as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Tenants' fleet shares and tags, queues per replica, leases per backend."""
    try:
        import redis as redis_py
    except ImportError:
        fail("fleet status needs redis-py: pip install 'tokenfair[serve]'")
    from ..fleet.status import format_status, read_status
    if not redis.startswith(("redis://", "rediss://", "unix://")):
        fail(f"--redis {redis!r}: expected redis://host:port[/db], rediss://... or unix:///path")
    try:
        r = redis_py.Redis.from_url(redis, socket_timeout=5.0, socket_connect_timeout=5.0)
        st = read_status(r, fleet, heartbeat)
    except (redis_py.RedisError, OSError) as err:
        fail(f"--redis {redis}: {type(err).__name__}: {err}")
    typer.echo(json.dumps(st, indent=2) if as_json else format_status(st))


def fake_backend(port: int = typer.Option(8001, min=1, max=MAX_PORT, help="TCP port"),
                 host: str = typer.Option("127.0.0.1", help="bind address"),
                 profile: Optional[str] = typer.Option(None, help="simulator profile (name or YAML) for continuous-"
                                                       "batching step times (default llama3-8b-a100)"),
                 max_running: int = typer.Option(16, help="requests batched at once (FIFO beyond)"),
                 time_scale: float = typer.Option(1.0, help="multiply every step time (0.1 = 10x faster)"),
                 token_delay_s: Optional[float] = typer.Option(None, help="instead of a profile: fixed seconds "
                                                               "per output token, --concurrency at once"),
                 concurrency: int = typer.Option(4, help="with --token-delay-s: requests served at once"),
                 ttft_s: float = typer.Option(0.0, help="with --token-delay-s: seconds to the first token"),
                 model: str = typer.Option("fake-model", help="model id for /v1/models"),
                 log_level: str = typer.Option("warning", help="uvicorn log level")) -> None:
    """A fake OpenAI-compatible backend (no GPU): continuous batching timed by a simulator
    profile, or a fixed delay per token."""
    from ..core.costmodel import load_profile
    from ..serve.fake_backend import create_fake_backend
    try:
        if token_delay_s is not None:
            if profile is not None:
                raise ValueError("give --profile or --token-delay-s, not both")
            if not (0 <= token_delay_s < math.inf and 0 <= ttft_s < math.inf) or concurrency <= 0:
                raise ValueError("--token-delay-s and --ttft-s must be finite and >= 0, and --concurrency > 0")
            app = create_fake_backend(concurrency=concurrency, token_delay_s=token_delay_s, ttft_s=ttft_s,
                                      model=model)
            what = f"{concurrency} at once, {token_delay_s:g} s/token"
        else:
            prof = load_profile(profile or "llama3-8b-a100")
            if max_running <= 0 or not 0 < time_scale < math.inf:
                raise ValueError("--max-running and --time-scale must be finite and > 0")
            app = create_fake_backend(model=model, profile=prof, max_running=max_running, time_scale=time_scale)
            what = f"profile {prof.name}, max_running {max_running}"
    except (*USER_ERRORS, OSError) as err:
        fail(error_message(err))
    import uvicorn
    typer.echo(f"fake backend {model} on http://{host}:{port}/v1 ({what})", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)


def bench_fleet(out: str = typer.Option("reports/bench-fleet", help="folder for fleet_bench.json and the plot"),
                gateways: str = typer.Option("1,2,3,4", help="numbers of gateways, comma-separated"),
                latency_ms: str = typer.Option("0,1,5", help="injected Redis latencies (ms), comma-separated"),
                duration: float = typer.Option(3.0, help="seconds of backlogged load per fairness run"),
                rate: float = typer.Option(20.0, help="requests/s of the latency run"),
                latency_duration: float = typer.Option(20.0, help="seconds of the latency run (0: skip it)"),
                repeats: int = typer.Option(3, help="fairness runs per point (the median is reported)")) -> None:
    """Fleet fairness error vs gateways and Redis latency; the latency Redis adds (needs redis-server)."""
    from pathlib import Path

    from ..fleet.bench import format_bench, run_bench
    from ..fleet.redis_server import redis_server_path
    try:
        ns = [int(x) for x in gateways.split(",") if x.strip()]
        lat = [float(x) for x in latency_ms.split(",") if x.strip()]
        if not ns or min(ns) < 1 or any(x < 0 for x in lat) or duration <= 0 or rate <= 0 or latency_duration < 0 \
                or repeats < 1:
            raise ValueError("--gateways >= 1, --latency-ms >= 0, --duration and --rate > 0, --latency-duration >= 0, "
                             "--repeats >= 1")
    except ValueError as err:
        fail(f"bench fleet: {err}")
    if redis_server_path() is None:
        fail("bench fleet needs redis-server: apt-get install redis-server (bash scripts/test-setup.sh)")
    result = run_bench(Path(out), ns, lat, duration, rate, latency_duration, repeats)
    typer.echo(format_bench(result))
    typer.echo(f"wrote {out}/fleet_bench.json and {out}/fleet_fairness.png")


def bench_fleet_latency(out: str = typer.Option("reports/bench-fleet", help="folder for fleet_latency.json"),
                        rate: float = typer.Option(20.0, help="requests/s"),
                        duration: float = typer.Option(20.0, help="seconds per run"),
                        runs: int = typer.Option(3, help="runs per transport (medians are reported)"),
                        transport: str = typer.Option("tcp,unix", help="Redis over: tcp, unix or both")) -> None:
    """The latency a --redis gateway adds over a plain one, Redis on loopback TCP and a unix socket."""
    import json
    from pathlib import Path

    from ..fleet.bench_latency import TRANSPORTS, format_latency, latency_bench
    from ..fleet.redis_server import redis_server_path
    ts = tuple(t.strip() for t in transport.split(",") if t.strip())
    if not ts or any(t not in TRANSPORTS for t in ts):
        fail(f"bench fleet-latency: --transport {transport!r}: tcp, unix or tcp,unix")
    if rate <= 0 or duration <= 2 or runs < 1:
        fail("bench fleet-latency: --rate > 0, --duration > 2 (the first 2 s warm up) and --runs >= 1")
    if redis_server_path() is None:
        fail("bench fleet-latency needs redis-server: apt-get install redis-server (bash scripts/test-setup.sh)")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    import tempfile
    with tempfile.TemporaryDirectory(prefix="tf-lat-", dir="/tmp") as tmp:
        result = latency_bench(rate, duration, Path(tmp), runs=runs, transports=ts)
    (folder / "fleet_latency.json").write_text(json.dumps(result, indent=2))
    typer.echo(format_latency(result))
    typer.echo(f"wrote {folder}/fleet_latency.json")
