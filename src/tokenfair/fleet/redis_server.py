"""A local ``redis-server`` process for tests, the fleet benchmark and rehearsals: loopback
port or unix socket, its data in a folder of ours, append-only file fsynced on every write
(so a killed and restarted server keeps the fleet's state)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

STARTUP_TIMEOUT_S = 10.0
MAX_SOCKET_PATH = 100          # sun_path holds 108 bytes on Linux


def redis_server_path() -> str | None:
    """The ``redis-server`` binary, or None (install Debian's ``redis-server``)."""
    return shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` on 127.0.0.1:``port`` (and ``folder``/redis.sock with
    ``unix_socket``) with its files under ``folder``."""

    def __init__(self, folder: str | Path, port: int | None = None, persist: bool = True,
                 unix_socket: bool = False) -> None:
        binary = redis_server_path()
        if binary is None:
            raise FileNotFoundError("redis-server not found: install Debian's redis-server "
                                    "(bash scripts/test-setup.sh does, as root)")
        self.binary = binary
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.persist = persist
        self.unix_socket = unix_socket      # also listen on folder/redis.sock; ``url`` names it
        self.proc: subprocess.Popen | None = None

    @property
    def socket_path(self) -> Path:
        return self.folder / "redis.sock"

    @property
    def tcp_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}?db=0" if self.unix_socket else self.tcp_url

    def start(self) -> "RedisServer":
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
                "--save", "", "--protected-mode", "yes", "--daemonize", "no", "--loglevel", "warning"]
        if self.persist:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        if self.unix_socket:
            if len(str(self.socket_path)) > MAX_SOCKET_PATH:
                raise ValueError(f"unix socket path {self.socket_path} is over {MAX_SOCKET_PATH} characters; "
                                 "use a shorter folder")
            args += ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        log = open(self.folder / "redis.log", "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.folder}/redis.log")
            if self._answers() and (not self.unix_socket or self.socket_path.exists()):
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {STARTUP_TIMEOUT_S}s")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown save (the append-only file has every write)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None
