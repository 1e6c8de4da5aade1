"""API key digests in the contract: a non-digest entry or keys under default_tenant are errors
naming the tenant and the fix; ``tokenfair keys hash`` prints the digests; start-up says how
many keys map to how many tenants."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tokenfair.contracts.contract import ContractError, parse_contract
from tokenfair.serve.auth import KeyRing, hash_key


@pytest.mark.parametrize("entry", ["alice-key", "<digest of bob-key>", "ab" * 31, "g" * 64])
def test_a_non_digest_entry_is_an_error_naming_the_tenant_and_the_fix(entry):
    with pytest.raises((ContractError, ValueError)) as err:
        parse_contract({"tenants": {"alice": {"api_key_sha256": [hash_key("ok"), entry]}}})
    msg = str(err.value)
    assert "tenant 'alice': api_key_sha256[1] is not a SHA-256 digest" in msg and "tokenfair keys hash" in msg
    assert entry not in msg or len(entry) == 64 and set(entry) == {"g"}      # a pasted key is not echoed


def test_keys_under_default_tenant_are_an_error():
    with pytest.raises((ContractError, ValueError), match="default_tenant lists api_key_sha256"):
        parse_contract({"default_tenant": {"api_key_sha256": [hash_key("k")]}})


def test_digests_in_upper_case_are_accepted_and_counted():
    c = parse_contract({"tenants": {"a": {"api_key_sha256": [hash_key("k1").upper(), hash_key("k2")]},
                                    "b": {"api_key_sha256": [hash_key("k3")]}}})
    ring = KeyRing(c)
    assert (ring.num_keys, ring.num_tenants) == (3, 2)
    assert ring.tenant_for("Bearer k1") == "a" and ring.tenant_for(None, "k3") == "b"


def test_keys_hash_cli():
    from tokenfair.cli.app import app

    runner = CliRunner()
    res = runner.invoke(app, ["keys", "hash", "alice-key", "bob-key"])
    assert res.exit_code == 0 and res.stdout.split() == [hash_key("alice-key"), hash_key("bob-key")]
    res = runner.invoke(app, ["keys", "hash", "--tenant", "alice"], input="alice-key\n")
    assert res.exit_code == 0 and hash_key("alice-key") in res.stdout and res.stdout.strip().startswith("alice:")
    digest_line = res.stdout.strip()
    import yaml
    spec = yaml.safe_load(digest_line)
    assert parse_contract({"tenants": spec}).tenants["alice"].api_key_sha256 == (hash_key("alice-key"),)
    # an empty key hashed to a digest no request can match (a presented key is stripped, and an
    # empty one is no key): refused
    res = runner.invoke(app, ["keys", "hash", "alice-key", "  "])
    assert res.exit_code == 2 and "key 2 is empty" in res.output


def test_startup_prints_keys_and_tenants(capsys):
    from tokenfair.cli.serve import _keyring

    c = parse_contract({"tenants": {"a": {"api_key_sha256": [hash_key("k1"), hash_key("k2")]},
                                    "b": {"api_key_sha256": [hash_key("k3")]}}})
    _keyring(c, None)
    assert "3 API keys map to 2 tenants" in capsys.readouterr().err
