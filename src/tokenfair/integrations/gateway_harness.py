"""A tokenfair gateway in this process, in front of one backend, for benchmarks and tests:
the contract file plus an API key per tenant (``{tenant: key}``)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import yaml


def contract_with_keys(path: str, keys: dict[str, str]):
    from ..contracts.contract import parse_contract
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


class GatewayProcess:
    """``tokenfair gateway`` as its own process (a benchmark's load generator must not share
    the gateway's interpreter), on loopback, with the contract plus keys written to ``folder``."""

    def __init__(self, backend_url: str, contract_path: str, keys: dict[str, str], folder: Path,
                 extra_args: tuple[str, ...] = ()) -> None:
        import sys

        from ..serve.shutdown import free_port
        self.folder = folder
        self.port = free_port()
        data = yaml.safe_load(Path(contract_path).read_text()) or {}
        contract = contract_with_keys(contract_path, keys)
        data["tenants"] = {k: v.model_dump(mode="json", exclude_defaults=True) for k, v in contract.tenants.items()}
        folder.mkdir(parents=True, exist_ok=True)
        self.contract_file = folder / "gateway-contract.yaml"
        self.contract_file.write_text(yaml.safe_dump(data))
        self.cmd = [sys.executable, "-m", "tokenfair", "gateway", "--backend", backend_url,
                    "--contract", str(self.contract_file), "--port", str(self.port), "--log-level", "warning",
                    *extra_args]
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "GatewayProcess":
        import subprocess
        import time

        import httpx
        log = open(self.folder / f"gateway-{self.port}.log", "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode} (log in {self.folder})")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("gateway not healthy after 60 s")

    def __exit__(self, *exc) -> None:
        import subprocess
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
