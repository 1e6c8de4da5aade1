"""Graceful shutdown and in-process serving helpers.

On SIGTERM/SIGINT (or ``should_exit``), :class:`GracefulServer`:
  1. ``service.begin_shutdown()``: the listener stays open, new requests get 503
     ``shutting_down`` with ``Retry-After`` and ``/healthz`` answers 503 (a load balancer
     or Kubernetes' readiness probe takes the instance out of rotation);
  2. ``service.drain(grace_s)``: accepted requests (queued or running) may finish for up to
     ``grace_s`` seconds; whatever is left then FAILS with reason
     ``shutdown: the server is stopping (grace period over)`` -- streams get a final error
     event and ``[DONE]``, waiting clients a 503;
  3. stops listening, then uvicorn's own shutdown (close idle connections, lifespan
     shutdown: stop the worker / close backend connections, flush the records file).
The default ``grace_s`` (:data:`DEFAULT_GRACE_S`) plus uvicorn's 5 s to close connections
fits inside Kubernetes' default ``terminationGracePeriodSeconds`` of 30 s.
Nothing is left hanging: every accepted request ends in exactly one terminal state.

:class:`ServerThread` runs an app on a free loopback port in a background thread (tests,
benchmarks, the load generator's self-checks).
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from .defaults import CLOSE_S, DEFAULT_GRACE_S


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service, grace_s: float = DEFAULT_GRACE_S) -> None:
        super().__init__(config)
        self.service = service
        self.grace_s = grace_s

    async def shutdown(self, sockets=None) -> None:
        self.service.begin_shutdown()
        await self.service.drain(self.grace_s)
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        await super().shutdown(sockets=None)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """``uvicorn`` serving ``app`` on ``127.0.0.1:<free port>`` in a daemon thread."""

    def __init__(self, app, service=None, grace_s: float = 5.0, host: str = "127.0.0.1",
                 port: int | None = None) -> None:
        self.host = host
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port or 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=grace_s + CLOSE_S,
                                access_log=False)
        self.server = GracefulServer(config, service, grace_s) if service is not None else uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "ServerThread":
        self.thread.start()
        end = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > end:
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
