"""ActNN (2-bit activation-compressed training) for actbench: levels, layers, conversion, checks.

``convert(model, "L3")`` returns a :class:`Conversion` whose model trains with an ordinary loop;
each converted model has its own config and controller (no global state).
"""

from actbench.actnn.controller import Controller
from actbench.actnn.convert import Conversion, ConversionReport, UnsupportedModuleError, convert
from actbench.actnn.levels import LEVEL_NAMES, LevelConfig, level_config
from actbench.actnn.memory import SavedCensus, level_memory_table, saved_bytes, saved_tensor_census

__all__ = [
    "LEVEL_NAMES",
    "Controller",
    "Conversion",
    "ConversionReport",
    "LevelConfig",
    "SavedCensus",
    "UnsupportedModuleError",
    "convert",
    "level_config",
    "level_memory_table",
    "saved_bytes",
    "saved_tensor_census",
]
