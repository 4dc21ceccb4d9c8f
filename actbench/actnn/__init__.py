"""ActNN (2-bit activation-compressed training) for actbench: levels, layers, conversion, checks.

``convert(model, "L3")`` returns a :class:`Conversion` whose model trains with an ordinary loop;
each converted model has its own config and controller (no global state).
``loss_scope(model)`` is the context to compute forward and loss in, so the loss's saved tensors
are compressed too. ``set_host_scope(model, scope)`` files an L4/L5 model's host copies under a measurement's scope.
"""

from actbench.actnn.controller import Controller
from actbench.actnn.convert import Conversion, ConversionReport, UnsupportedModuleError, convert, set_host_scope
from actbench.actnn.hooks import loss_scope
from actbench.actnn.levels import LEVEL_NAMES, LevelConfig, level_config
from actbench.actnn.layers import NotConvertedError
from actbench.actnn.memory import SavedCensus, last_forward_census, saved_bytes, saved_tensor_census

__all__ = [
    "LEVEL_NAMES",
    "Controller",
    "Conversion",
    "ConversionReport",
    "LevelConfig",
    "NotConvertedError",
    "SavedCensus",
    "UnsupportedModuleError",
    "convert",
    "last_forward_census",
    "level_config",
    "loss_scope",
    "saved_bytes",
    "saved_tensor_census",
    "set_host_scope",
]
