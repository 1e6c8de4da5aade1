"""A tokenfair gateway in this process, in front of one backend, for benchmarks and tests:
the contract file plus an API key per tenant (``{tenant: key}``)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import yaml


def contract_with_keys(path: str, keys: dict[str, str]):
    from ..contract import parse_contract
    from ..serve.auth import hash_key

    data = yaml.safe_load(Path(path).read_text()) or {}
    tenants = data.setdefault("tenants", {})
    for name, key in keys.items():
        tenants.setdefault(name, {})["api_key_sha256"] = [hash_key(key)]
    return parse_contract(data, path)


def start_gateway(backend_url: str, contract_path: str, keys: dict[str, str], **kw):
    """(gateway, its server thread: `with` it to serve on a free loopback port)."""
    from ..serve.app import create_app
    from ..serve.auth import KeyRing
    from ..serve.gateway import Gateway
    from ..serve.shutdown import ServerThread

    contract = contract_with_keys(contract_path, keys)
    gw = Gateway(contract, KeyRing(contract), [backend_url], **kw)
    return gw, ServerThread(create_app(gw, 5.0), gw, grace_s=5.0)


@contextmanager
def gateway_for(backend_url: str, contract_path: str, keys: dict[str, str], **kw):
    """The gateway's base URL while the block runs."""
    _, st = start_gateway(backend_url, contract_path, keys, **kw)
    with st:
        yield st.url
