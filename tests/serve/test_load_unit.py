"""The load generator: prompt synthesis, keys file, CLI user errors, status mapping, and a
replay against a fake backend behind the gateway (rejections recorded as such)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from tokenfair.serve.load import LoadConfig, check_keys, load_keys, run_load
from tokenfair.serve.load_request import synth_prompt
from tokenfair.workloads.workload import TraceRow


def test_synth_prompt_deterministic():
    a = synth_prompt(37, "req-1", seed=3)
    assert len(a.split()) == 37
    assert a == synth_prompt(37, "req-1", seed=3) and a != synth_prompt(37, "req-2", seed=3)


def test_keys_file(tmp_path):
    p = tmp_path / "keys.yaml"
    p.write_text("a: key-a\nb: key-b\n")
    assert load_keys(p) == {"a": "key-a", "b": "key-b"}
    j = tmp_path / "keys.json"
    j.write_text(json.dumps({"*": "k"}))
    assert load_keys(j) == {"*": "k"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping"):
        load_keys(bad)
    with pytest.raises(FileNotFoundError):
        load_keys(tmp_path / "missing.yaml")
    rows = [TraceRow("r1", 0.0, "x", 4, 4)]
    with pytest.raises(ValueError, match="no key for tenant"):
        check_keys(rows, {"a": "k"})
    check_keys(rows, {"*": "k"})


def _cli():
    from tokenfair.cli.serve import gateway, load, serve
    app = typer.Typer()
    app.command("load")(load)
    app.command("gateway")(gateway)
    app.command("serve")(serve)
    return app


def test_cli_user_errors_exit_2(tmp_path):
    runner = CliRunner()
    app = _cli()
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"request_id": "r", "arrival_s": 0, "tenant": "x", "prompt_tokens": 3,
                                 "output_tokens": 2}) + "\n")
    keys = tmp_path / "k.yaml"
    keys.write_text("y: key\n")
    out = tmp_path / "out"
    r = runner.invoke(app, ["load", str(trace), "--url", "http://127.0.0.1:9", "--keys", str(tmp_path / "no.yaml"),
                            "--out", str(out)])
    assert r.exit_code == 2 and "keys file" in r.output
    r = runner.invoke(app, ["load", str(trace), "--url", "http://127.0.0.1:9", "--keys", str(keys), "--out", str(out)])
    assert r.exit_code == 2 and "no key for tenant" in r.output
    keys.write_text("x: key\n")
    r = runner.invoke(app, ["load", str(trace), "--url", "127.0.0.1:9", "--keys", str(keys), "--out", str(out)])
    assert r.exit_code == 2 and "http" in r.output
    r = runner.invoke(app, ["load", str(tmp_path / "nope.csv"), "--url", "http://127.0.0.1:9", "--keys", str(keys),
                            "--out", str(out)])
    assert r.exit_code == 2
    r = runner.invoke(app, ["gateway", "--backend", "not-a-url"])
    assert r.exit_code == 2 and "http" in r.output
    bad_contract = tmp_path / "c.yaml"
    bad_contract.write_text("tenants: {a: {weight: -1}}\n")
    r = runner.invoke(app, ["serve", "--contract", str(bad_contract)])
    assert r.exit_code == 2 and "weight" in r.output
    r = runner.invoke(app, ["serve", "--model", str(tmp_path / "no-model")])
    assert r.exit_code == 2 and "model" in r.output
    for bad in ("0", "-1", "nan", "inf"):
        r = runner.invoke(app, ["load", str(trace), "--url", "http://127.0.0.1:9", "--keys", str(keys),
                                "--out", str(out), "--time-scale", bad])
        assert r.exit_code == 2 and "must be finite and > 0" in r.output, (bad, r.output)
    for args in (["--port", "99999"], ["--max-tokens-default", "0"]):
        r = runner.invoke(app, ["serve", *args])
        assert r.exit_code == 2 and f"Invalid value for '{args[0]}'" in r.output, r.output


def test_load_records_rejections_through_gateway(h, tmp_path):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    contract = h.service_contract()
    with ServerThread(create_fake_backend(concurrency=4, token_delay_s=0.01)) as be:
        gw = Gateway(contract, KeyRing(contract), [be.url])
        with ServerThread(create_app(gw), gw) as st:
            # q may run 1 and queue 1: of 6 simultaneous requests, 4 are refused (429)
            rows = [TraceRow(f"q{i}", 0.0, "q", 5, 20) for i in range(6)]
            rows += [TraceRow(f"a{i}", 0.05 * i, "a", 5, 5, deadline_s=30.0) for i in range(3)]
            cfg = LoadConfig(url=st.url + "/v1", keys={"q": h.KEYS["q"], "*": h.KEYS["a"]}, timeout_s=30)
            records, summary, timeline = run_load(rows, cfg, contract, tmp_path, "rej")
    by = {r["request_id"]: r for r in records}
    q = [by[f"q{i}"] for i in range(6)]
    assert sorted(r["status"] for r in q) == ["finished"] * 2 + ["rejected"] * 4
    rej = [r for r in q if r["status"] == "rejected"]
    assert all(r["http_status"] == 429 and r["reason"].startswith("queue_full") for r in rej)
    assert all(r["first_token_s"] is None and r["output_tokens"] == 0 for r in rej)
    fin = [r for r in q if r["status"] == "finished"]
    assert all(r["output_tokens"] == 20 and r["prompt_tokens"] == 5 for r in fin)   # fake: words = tokens
    assert all(by[f"a{i}"]["status"] == "finished" for i in range(3))
    assert by["a0"]["deadline_s"] == pytest.approx(by["a0"]["arrival_s"] + 30.0)
    assert summary["status"] == {"finished": 5, "rejected": 4}
    assert summary["tenants"]["q"]["status"]["rejected"] == 4
    # the gateway saw the same outcome and kept one record per request
    assert sorted(r["status"] for r in gw.records.items) == sorted(r["status"] for r in records)
