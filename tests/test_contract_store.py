"""The contract store (apply / history / show / diff / rollback) and its CLI."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from tokenfair.cli.app import app
from tokenfair.contracts.contract import parse_contract
from tokenfair.contracts.diff import diff_contracts, format_diff
from tokenfair.contracts.store import ContractStore, StoreError

V1 = """version: v1
tenants:
  acme: {weight: 3, min_share: 0.2}
  globex: {weight: 1}
  tiny: {weight: 1}
"""
V2 = """version: v2
tenants:
  acme: {weight: 1, min_share: 0.5}
  globex: {weight: 1, rate_limit: {tokens_per_s: 100, burst_tokens: 1000}}
  newco: {weight: 2}
classes:
  interactive: {priority: 20, max_wait_s: 20}
  batch: {priority: 0, max_wait_s: 600, min_share: 0.1}
"""
T0 = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_apply_history_rollback(tmp_path):
    s = ContractStore(tmp_path / "store")
    e1 = s.apply(_write(tmp_path, "a.yaml", V1), "first", now=T0)
    assert (e1.version, e1.previous, e1.time) == ("v1", None, "2026-12-01T08:00:00+00:00")
    assert e1.hash == parse_contract({"version": "v1", "tenants": {"acme": {"weight": 3, "min_share": 0.2},
                                                                   "globex": {}, "tiny": {}}}).content_hash
    e2 = s.apply(_write(tmp_path, "b.yaml", V2), "second")
    assert s.current() == "v2" and e2.previous == "v1"
    # the store keeps the applied text byte for byte, one file per version
    assert (tmp_path / "store" / "versions" / "v2.yaml").read_text() == V2
    assert s.load("v1").tenants["acme"].weight == 3
    back = s.rollback(message="bad latency")
    assert (back.event, back.version, back.previous) == ("rollback", "v1", "v2") and s.current() == "v1"
    # rolling back again returns to the version before *that* change: v2
    assert s.rollback().version == "v2"
    lines = [json.loads(x) for x in (tmp_path / "store" / "history.jsonl").read_text().splitlines()]
    assert [(x["event"], x["version"]) for x in lines] == [("apply", "v1"), ("apply", "v2"), ("rollback", "v1"),
                                                           ("rollback", "v2")]
    assert lines[2]["message"] == "bad latency"


def test_same_label_different_content_is_an_error(tmp_path):
    s = ContractStore(tmp_path / "store")
    s.apply(_write(tmp_path, "a.yaml", V1))
    # the same content again (reformatted) only makes it current
    s.apply(_write(tmp_path, "a2.yaml", V1.replace("{weight: 1}", "{weight: 1.0}")))
    with pytest.raises(StoreError, match="already recorded with different content"):
        s.apply(_write(tmp_path, "c.yaml", V1.replace("weight: 3", "weight: 4")))
    with pytest.raises(StoreError, match="no version label"):
        s.apply(_write(tmp_path, "d.yaml", "tenants: {a: {weight: 1}}\n"))
    with pytest.raises(StoreError, match="no version 'v9'"):
        s.rollback("v9")
    assert s.versions() == ["v1"]


def test_diff_is_semantic():
    a, b = parse_contract(__import__("yaml").safe_load(V1)), parse_contract(__import__("yaml").safe_load(V2))
    d = diff_contracts(a, b)
    got = {(c.where, c.field): (c.before, c.after) for c in d.changes}
    assert got[("tenant acme", "weight")] == (3.0, 1.0)
    assert got[("tenant acme", "min_share")] == (0.2, 0.5)
    assert got[("tenant globex", "rate_limit.tokens_per_s")] == (None, 100.0)
    assert got[("tenant newco", "(added)")] == (None, "present")
    assert got[("tenant tiny", "(removed)")] == ("present", None)
    assert got[("class interactive", "max_wait_s")] == (30.0, 20.0)
    assert got[("class realtime", "(removed)")] == ("present", None)
    assert ("tenant globex", "weight") not in got
    # under contention: v1 acme 3/5 = 0.6 (above its min), globex = tiny = 0.2;
    # v2 acme is water-filled to its 0.5 min share, globex 0.5 * 1/3, newco 0.5 * 2/3
    assert d.shares["acme"] == pytest.approx((0.6, 0.5))
    assert d.shares["globex"] == pytest.approx((0.2, 1 / 6))
    assert d.shares["newco"][0] is None and d.shares["newco"][1] == pytest.approx(1 / 3)
    text = format_diff(d)
    assert "tenant acme:" in text and "weight: 3 -> 1" in text and "-0.100" in text
    assert diff_contracts(a, a).same


def test_cli_store_commands(tmp_path):
    r = CliRunner()
    store = str(tmp_path / "store")
    a, b = _write(tmp_path, "a.yaml", V1), _write(tmp_path, "b.yaml", V2)
    res = r.invoke(app, ["contract", "apply", str(a), "--store", store, "-m", "launch"])
    assert res.exit_code == 0 and "applied v1@" in res.output
    assert r.invoke(app, ["contract", "apply", str(b), "--store", store]).exit_code == 0
    res = r.invoke(app, ["contract", "history", "--store", store])
    assert res.exit_code == 0 and "launch" in res.output and res.output.splitlines()[-1].startswith("* ")
    res = r.invoke(app, ["contract", "show", "v1", "--store", store])
    assert res.exit_code == 0 and "acme: {weight: 3, min_share: 0.2}" in res.output
    res = r.invoke(app, ["contract", "diff", "v1", "v2", "--store", store])
    assert res.exit_code == 0 and "entitled share under contention" in res.output
    res = r.invoke(app, ["contract", "diff", str(a), str(b)])          # files, no store
    assert res.exit_code == 0 and "tenant newco:" in res.output
    res = r.invoke(app, ["contract", "rollback", "--store", store])
    assert res.exit_code == 0 and "rolled back to v1" in res.output
    # bad input: exit 2 with a message, never a traceback
    bad = _write(tmp_path, "bad.yaml", "version: v3\ntenants: {x: {weight: -1}}\n")
    res = r.invoke(app, ["contract", "apply", str(bad), "--store", store])
    assert res.exit_code == 2 and "tenants.x.weight" in res.output
    res = r.invoke(app, ["contract", "apply", str(_write(tmp_path, "c.yaml", V1.replace("3", "5"))), "--store", store])
    assert res.exit_code == 2 and "different content" in res.output
    res = r.invoke(app, ["contract", "show", "nope", "--store", store])
    assert res.exit_code == 2 and "no version 'nope'" in res.output
    res = r.invoke(app, ["contract", "diff", "v1", "missing.yaml"])
    assert res.exit_code == 2 and "no such contract file" in res.output
