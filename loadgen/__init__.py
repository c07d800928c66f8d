"""fairgate's load side: paper workloads and traces, the offline simulator, metrics, plots, reports."""
