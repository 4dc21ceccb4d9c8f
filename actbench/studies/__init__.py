"""Studies built on the harness: trust in meta, accuracy vs bits, gradient checks, the harness's own cost."""
