"""actbench: how much larger can you train with each memory-saving strategy, and at what speed?"""

__version__ = "0.1.0"
