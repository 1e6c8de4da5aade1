"""The Grafana dashboard (examples/grafana/tokenfair-fleet.json) queries only metrics that a
fleet gateway's and a fake vLLM-style backend's ``/metrics`` expose."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from fleet_helpers import KEYS, contract, keyring

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "tokenfair-fleet.json"
PROMQL_WORDS = {"sum", "max", "min", "avg", "by", "rate", "histogram_quantile", "le", "tenant", "instance",
                "backend", "reason", "status"}


def queried_metrics(dash: dict) -> set[str]:
    names = set()
    for p in dash["panels"]:
        for t in p["targets"]:
            expr = re.sub(r"\[[^\]]*\]", "", t["expr"])          # range selectors: [1m]
            expr = re.sub(r"^[^(]*\(|\b\d+(\.\d+)?\b", " ", expr)  # quantiles
            for tok in re.findall(r"[A-Za-z_][A-Za-z0-9_:]*", expr):
                if tok not in PROMQL_WORDS:
                    names.add(tok)
    return names


def exposed(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            names.add(name)
            if kind == "histogram":
                names |= {name + s for s in ("_bucket", "_sum", "_count")}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_dashboard_is_wellformed():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and all(p["targets"] and p["title"] for p in dash["panels"])
    assert {"tokenfair_service_share", "tokenfair_entitled_share", "tokenfair_rejections_total",
            "tokenfair_fleet_backend_leases", "tokenfair_ttft_seconds_bucket",
            "tokenfair_tpot_seconds_bucket"} <= queried_metrics(dash)


def test_every_queried_metric_exists(redis_server):
    from tokenfair.core.costmodel import Profile
    from tokenfair.fleet.client import FleetClient
    from tokenfair.fleet.gateway import FleetGateway
    from tokenfair.serve.app import create_app
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.shutdown import ServerThread

    prof = Profile(name="fast", kind="linear", decode_base_s=0.002, overhead_s=0.0)
    c = contract()
    with ServerThread(create_fake_backend(profile=prof, max_running=4)) as be:
        gw = FleetGateway(c, keyring(c), [be.url], max_context=64,
                          fleet=FleetClient(redis_server.url, "dash", "g0", heartbeat_s=0.1))
        with ServerThread(create_app(gw, 1.0), gw, grace_s=1.0) as st:
            h = {"authorization": f"Bearer {KEYS['a']}"}
            ok = httpx.post(st.url + "/v1/completions", headers=h, timeout=30,
                            json={"prompt": "a b c", "max_tokens": 4, "stream": True})
            too_long = httpx.post(st.url + "/v1/completions", headers=h, timeout=30,
                                  json={"prompt": "word " * 400, "max_tokens": 4})
            text = httpx.get(st.url + "/metrics").text + httpx.get(be.url + "/metrics").text
    assert ok.status_code == 200 and too_long.status_code == 400     # context_length_exceeded
    missing = queried_metrics(json.loads(DASHBOARD.read_text())) - exposed(text)
    assert not missing, missing
