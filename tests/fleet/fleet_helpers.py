"""A contract and load helpers shared by the fleet proof tests."""

from __future__ import annotations

KEYS = {"a": "key-a", "b": "key-b", "c": "key-c", "r": "key-r"}
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 3.0, "r": 1.0}
RATE = {"tokens_per_s": 300.0, "burst_tokens": 60.0}     # tenant r, in cost units


def contract():
    from tokenfair.contracts.contract import parse_contract
    from tokenfair.serve.auth import hash_key
    tenants = {t: {"weight": WEIGHTS[t], "api_key_sha256": [hash_key(k)]} for t, k in KEYS.items()}
    tenants["r"]["rate_limit"] = RATE
    return parse_contract({"version": "fleet-test", "tenants": tenants})


def cost(c, prompt_tokens: float, output_tokens: float) -> float:
    """A request's cost in the contract's units (what buckets and tags count)."""
    return c.costs.prefill_token * prompt_tokens + c.costs.decode_token * output_tokens


def keyring(c):
    from tokenfair.serve.auth import KeyRing
    return KeyRing(c)
