"""Benchmarks and soaks (``tokenfair bench ...``); never timed tests."""
