"""Where time and memory go: per-op step profiles and traces, compiled step memory, the planner
and its step-time estimator against measured steps, this host's peak."""
