"""From a command's spec to rows: specs, the runner, executors, scale-out."""
