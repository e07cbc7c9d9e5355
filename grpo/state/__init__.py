"""What a run leaves on disk and how it comes back: atomic checkpoints and exact resume, the
output-directory lock, signals, metrics.jsonl and trackers, and export of a checkpoint."""
