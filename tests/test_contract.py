import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tokenfair.contracts.contract import Contract, ContractError, load_contract, parse_contract
from tokenfair.workloads.scenarios import SCENARIOS

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "contracts"


@pytest.mark.parametrize("name", [*SCENARIOS, "saas"])
def test_shipped_contracts_load(name):
    c = load_contract(EXAMPLES / f"{name}.yaml")
    assert c.version.startswith(name) or name == "saas"
    assert len(c.content_hash) == 16


def test_error_names_path_and_fix():
    with pytest.raises(ContractError) as err:
        parse_contract({"tenants": {"acme": {"weight": 0}}}, "c.yaml")
    assert "c.yaml: tenants.acme.weight: must be > 0" in str(err.value)


@pytest.mark.parametrize("path, doc", [
    ("tenants.a.weight", {"tenants": {"a": {"weight": math.inf}}}),
    ("costs.prefill_token", {"costs": {"prefill_token": math.inf}}),
    ("classes.interactive.max_wait_s", {"classes": {"interactive": {"priority": 1, "max_wait_s": math.inf}}}),
    ("tenants.a.rate_limit.tokens_per_s", {"tenants": {"a": {"rate_limit": {"tokens_per_s": math.inf,
                                                                           "burst_tokens": 5}}}}),
    ("classes.interactive.priority", {"classes": {"interactive": {"priority": math.nan}}})])
def test_a_number_that_is_not_finite_is_refused_naming_its_path(path, doc):
    """``weight: .inf`` validated and ran (every charge c / w_i was 0): a contract number is
    finite, as NaN already had to be."""
    with pytest.raises(ContractError) as err:
        parse_contract(doc, "c.yaml")
    assert f"c.yaml: {path}: Input should be a finite number" in str(err.value)


def test_unknown_field_rejected():
    with pytest.raises(ContractError) as err:
        parse_contract({"tenants": {"acme": {"wieght": 2}}}, "c.yaml")
    assert "tenants.acme.wieght" in str(err.value) and "unknown field" in str(err.value)


def test_min_shares_over_one_rejected():
    with pytest.raises(ContractError) as err:
        parse_contract({"tenants": {"a": {"min_share": 0.6}, "b": {"min_share": 0.5}}})
    assert "sum to 1.100 > 1" in str(err.value)


def test_unknown_class_rejected():
    with pytest.raises(ContractError, match="unknown class 'gold'"):
        parse_contract({"tenants": {"a": {"classes": ["gold"]}}})


def test_hash_changes_with_content_and_is_stable():
    a, b = Contract(), Contract()
    assert a.content_hash == b.content_hash
    c = parse_contract({"tenants": {"x": {"weight": 2}}})
    assert c.content_hash != a.content_hash


def test_default_tenant_template_applies():
    c = parse_contract({"default_tenant": {"weight": 3, "max_queued": 7}})
    assert c.tenant("never-named").weight == 3
    assert c.tenant("never-named").max_queued == 7


def test_class_for_respects_allowed_classes():
    c = parse_contract({"tenants": {"a": {"classes": ["batch"], "default_class": "batch"}}})
    assert c.class_for("a", None) == "batch"
    assert c.class_for("a", "realtime") is None
    assert c.class_for("other", "realtime") == "realtime"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tokenfair", *args], capture_output=True, text=True)


def test_cli_validate_and_schema(tmp_path):
    ok = _cli("contract", "validate", str(EXAMPLES / "saas.yaml"))
    assert ok.returncode == 0 and "hash=" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants:\n  acme:\n    weight: -1\n")
    res = _cli("contract", "validate", str(bad))
    assert res.returncode == 2
    assert "tenants.acme.weight: must be > 0" in res.stderr
    schema = json.loads(_cli("contract", "schema").stdout)
    assert "tenants" in schema["properties"]


def test_removed_tenants_setting_and_stable_hashes():
    from tokenfair.contracts.contract import ContractError, parse_contract
    plain = parse_contract({"version": "x"})
    reject = parse_contract({"version": "x", "removed_tenants": "reject"})
    keep = parse_contract({"version": "x", "removed_tenants": "default_template"})
    assert plain.content_hash == reject.content_hash != keep.content_hash   # the default leaves hashes as they were
    import hashlib
    import json
    d = plain.model_dump(mode="json")
    del d["removed_tenants"]
    assert plain.content_hash == hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    with pytest.raises(ContractError, match="removed_tenants"):
        parse_contract({"removed_tenants": "drop"})
