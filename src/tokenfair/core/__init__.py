"""The simulator's and scheduler's vocabulary: requests, KV blocks, step cost, cost model."""
