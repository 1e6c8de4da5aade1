"""Real inference engine: a paged-KV Llama decoder in PyTorch (CPU first, device-agnostic).

Layers: ``config`` (ModelConfig) -> ``model`` (LlamaDecoder over flattened batches) with
``attention.paged_attention`` -> ``kv_cache`` (PagedKVCache) -> ``runner`` (ModelRunner,
one forward per scheduler step) -> ``offline`` (a tiny FCFS driver). ``loader`` reads HF
folders and GGUF files. Import submodules directly; this package imports nothing heavy.
"""
