"""``tokenfair keys hash KEY...``: the SHA-256 digests a contract stores for API keys
(``tenants.<name>.api_key_sha256``); the keys themselves never go into a contract."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

keys_app = typer.Typer(no_args_is_help=True, help="API keys: the digests a contract stores.")


@keys_app.command("hash")
def hash_keys(keys: Optional[List[str]] = typer.Argument(None, help="keys to hash (default: one per line on stdin)"),
              tenant: Optional[str] = typer.Option(None, help="print a ready contract line for this tenant")) -> None:
    """Print the hex SHA-256 digest of each key (for api_key_sha256)."""
    from ..contracts.contract import SHA256_HEX_CHARS
    from ..serve.auth import hash_key

    given = list(keys or []) or [line.strip() for line in sys.stdin if line.strip()]
    if not given:
        typer.echo("error: give at least one key (as arguments or one per line on stdin)", err=True)
        raise typer.Exit(2)
    blank = [i for i, k in enumerate(given, 1) if not k.strip()]
    if blank:
        # the server strips a presented key and reads an empty one as no key at all
        typer.echo(f"error: key {blank[0]} is empty; a request can never present it (give the key itself)",
                   err=True)
        raise typer.Exit(2)
    digests = [hash_key(k.strip()) for k in given]
    assert all(len(d) == SHA256_HEX_CHARS for d in digests)
    if tenant is not None:
        typer.echo(f"  {tenant}: {{api_key_sha256: [{', '.join(repr(d) for d in digests)}]}}")
        return
    for d in digests:
        typer.echo(d)
