"""What a run keeps on disk and reads back: its directory, atomic checkpoints, resuming, finished runs,
metrics.csv and the curve, experiment trackers."""
