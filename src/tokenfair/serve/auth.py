"""API key -> tenant, from the contract's ``api_key_sha256`` lists.

The contract stores only hex SHA-256 digests of keys (``tenants.<name>.api_key_sha256``);
a request presents ``Authorization: Bearer <key>`` (or ``x-api-key: <key>``).  The digest of
the presented key is looked up in a dict built once; an unknown or missing key is a 401.
``anonymous_tenant`` (off by default, for local testing) maps requests *without* a key to a
tenant; a wrong key is still a 401.  Keys are never logged or stored in records.
"""

from __future__ import annotations

import hashlib

from ..contracts.contract import Contract


def hash_key(key: str) -> str:
    """The hex SHA-256 digest a contract stores for ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


class AuthError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class KeyRing:
    def __init__(self, contract: Contract, anonymous_tenant: str | None = None) -> None:
        self.by_hash: dict[str, str] = {}
        for name, spec in contract.tenants.items():
            for digest in spec.api_key_sha256:
                d = digest.strip().lower()
                other = self.by_hash.get(d)
                if other is not None and other != name:
                    raise ValueError(f"api key digest {d[:12]}... is listed for tenants {other!r} and {name!r}")
                self.by_hash[d] = name
        self.anonymous_tenant = anonymous_tenant

    @property
    def num_keys(self) -> int:
        return len(self.by_hash)

    @property
    def num_tenants(self) -> int:
        """Tenants that have at least one key."""
        return len(set(self.by_hash.values()))

    @staticmethod
    def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
        if authorization:
            scheme, _, token = authorization.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return authorization.strip() or None
        if x_api_key and x_api_key.strip():
            return x_api_key.strip()
        return None

    def tenant_for(self, authorization: str | None, x_api_key: str | None = None) -> str:
        """The tenant of a request's key; raises :class:`AuthError` (-> 401)."""
        key = self.presented_key(authorization, x_api_key)
        if key is None:
            if self.anonymous_tenant is not None:
                return self.anonymous_tenant
            raise AuthError("missing API key: send 'Authorization: Bearer <key>'")
        tenant = self.by_hash.get(hash_key(key))
        if tenant is None:
            raise AuthError("invalid API key")
        return tenant
