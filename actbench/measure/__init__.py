"""Measurement: the live-storage tracker (cpu), one-point measurement, environment capture."""
