"""Planning for a device at hand or not: device speed models and the predicted step time (docs/design.md §11)."""
