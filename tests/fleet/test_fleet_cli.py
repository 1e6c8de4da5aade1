"""``tokenfair gateway --redis``, ``fleet status``, ``bench fleet``: bad options exit 2 with
a message naming the option."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tokenfair.cli.app import app


@pytest.mark.parametrize("args, needle", [
    (["gateway", "--backend", "http://127.0.0.1:9", "--redis", "127.0.0.1:6379"], "--redis"),
    (["gateway", "--backend", "http://127.0.0.1:9", "--redis", "redis://127.0.0.1:9/0", "--fleet", "a:b"], "--fleet"),
    (["gateway", "--backend", "http://127.0.0.1:9", "--redis", "redis://127.0.0.1:9/0", "--policy", "fifo"],
     "--policy fair"),
    (["gateway", "--backend", "http://127.0.0.1:9", "--redis", "redis://127.0.0.1:9/0", "--lease-ttl", "0.1"],
     "lease_ttl_s"),
    (["fleet", "status", "--redis", "http://127.0.0.1:9"], "--redis"),
    (["fleet", "status", "--redis", "redis://127.0.0.1:9/0"], "ConnectionError"),
    (["bench", "fleet", "--gateways", "0"], "--gateways"),
    (["bench", "fleet-latency", "--transport", "udp"], "--transport"),
    (["bench", "fleet-latency", "--duration", "1"], "--duration"),
])
def test_bad_fleet_options_exit_2(args, needle):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert needle in r.output, r.output
