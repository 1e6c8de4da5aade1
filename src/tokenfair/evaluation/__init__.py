"""What a run is judged by: metrics, goodput, starvation, thresholds, comparison, reports."""
