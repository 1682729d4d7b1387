"""Worker process: one per device, owns the model and the KV pool (the cluster issue)."""
