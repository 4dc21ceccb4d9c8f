"""Planning a run: points resolved once, how each is measured, the searches, the caching-allocator model,
device speed models and the predicted step time (docs/design.md §5, §10, §11)."""
