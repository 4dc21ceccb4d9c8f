"""How strategies change a model: checkpointing segments, selective recompute, compiled steps."""
