"""``tokenfair load --url A --url B``: each tenant's requests are spread over the URLs."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tokenfair.cli.app import app
from tokenfair.serve.fake_backend import create_fake_backend
from tokenfair.serve.load import spread_over
from tokenfair.serve.shutdown import ServerThread
from tokenfair.workloads.workload import TraceRow


def test_spread_over_is_even_per_tenant():
    rows = [TraceRow(request_id=f"{t}{i}", arrival_s=i * 0.1, tenant=t, prompt_tokens=4, output_tokens=2)
            for t in ("x", "y") for i in range(6)]
    got = spread_over(["u1", "u2", "u3"], rows)
    for t in ("x", "y"):
        urls = [got[f"{t}{i}"] for i in range(6)]
        assert sorted(urls) == ["u1", "u1", "u2", "u2", "u3", "u3"]
    assert got["x0"] != got["y0"]          # tenants start on different URLs


def test_load_cli_sends_to_every_url(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("request_id,arrival_s,tenant,prompt_tokens,output_tokens\n" +
                     "".join(f"r{i},{0.01 * i},{'ab'[i % 2]},4,3\n" for i in range(8)))
    keys = tmp_path / "keys.yaml"
    keys.write_text("'*': anything\n")
    apps = [create_fake_backend(concurrency=4, token_delay_s=0.001) for _ in range(2)]
    with ServerThread(apps[0]) as s1, ServerThread(apps[1]) as s2:
        r = CliRunner().invoke(app, ["load", str(trace), "--url", s1.url, "--url", s2.url, "--keys", str(keys),
                                     "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert [a.state.stats["served"] for a in apps] == [4, 4]
    recs = [json.loads(x) for x in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    assert all(x["status"] == "finished" for x in recs) and {x["url"] for x in recs} == {s1.url, s2.url}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["urls"] == [s1.url, s2.url]
