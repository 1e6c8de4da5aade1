"""The service contract and its life: versions, diff, release gate, shadow replay, sweep."""
