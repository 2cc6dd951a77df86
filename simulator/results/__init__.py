"""What a run leaves: per-request records, metrics, the timeline and the latency anatomy."""
