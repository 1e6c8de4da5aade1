"""Workloads: the trace format, public trace readers, transforms, generators, scenarios."""
