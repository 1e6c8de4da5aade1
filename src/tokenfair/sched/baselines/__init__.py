"""Baseline policies from today's serving systems: fifo, sjf, priority, vtc."""
