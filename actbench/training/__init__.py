"""The training step every strategy is measured with, and the model transformations strategies use."""
