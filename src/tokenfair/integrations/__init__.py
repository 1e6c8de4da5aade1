"""Adapters that run tokenfair's policy core inside other serving engines (``vllm``)."""
