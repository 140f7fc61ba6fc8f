"""The Stage-2 training loop and what it owns: config, data, optimizer, checkpoints, metrics, preflight."""
