"""Fixtures of the fleet tests: a real ``redis-server`` (Debian's package, installed by
scripts/test-setup.sh) on a free loopback port, its files in a temporary folder."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def redis_binary() -> str:
    pytest.importorskip("redis", reason="redis-py is not installed (pip install -e '.[serve]')")
    from tokenfair.fleet.redis_server import redis_server_path
    path = redis_server_path()
    if path is None:
        pytest.skip("redis-server is not installed: run `bash scripts/test-setup.sh` as root "
                    "(apt-get install redis-server)")
    return path


@pytest.fixture
def redis_server(redis_binary, tmp_path):
    """A fresh redis-server per test (append-only file, fsync always)."""
    from tokenfair.fleet.redis_server import RedisServer
    srv = RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()
