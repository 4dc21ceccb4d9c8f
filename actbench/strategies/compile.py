"""compile: torch.compile (default settings); ``compile@B``: with an activation memory budget B in (0, 1).

The spelling ``NAME@VALUE`` gives a strategy a parameter (``Strategy.parameter``); ``compile@0.5``
asks the partitioner to keep saved activations near half of what plain ``compile`` saves, by
recomputing more in backward (``torch._functorch.config.activation_memory_budget``).
"""

from __future__ import annotations

import math

from actbench.strategies.registry import PreparedModel, Strategy, register


@register
class Compile(Strategy):
    name = "compile"
    description = ("torch.compile with default settings (inductor; cpu/meta: same partition, graphs run eagerly); "
                   "compile@B: activation memory budget B in (0, 1), the partitioner recomputes to save ~B x as much")
    order = 220
    colour = "#393b79"
    parameter = "activation memory budget: a fraction strictly between 0 and 1 (plain compile = torch's default, 1)"
    #: the activation memory budget; None = torch's default (plain ``compile``)
    budget: float | None = None

    def with_parameter(self, value: str) -> "Compile":
        try:
            budget = float(value)
        except ValueError:
            budget = math.nan
        if not (0.0 < budget < 1.0):
            raise ValueError(f"bad strategy 'compile@{value}': the {self.parameter}, e.g. compile@0.5")
        made = Compile()
        made.budget = budget
        made.name = f"compile@{budget:g}"
        made.colour = "#6b6ecf"  # every budget: a lighter shade of compile's
        return made

    def prepare(self, model, device, options, host_scope) -> PreparedModel:
        from actbench.core import compat
        from actbench.strategies.mechanics.compiling import compile_model

        compiled, backend = compile_model(model, device)
        budget = self.budget

        def forward_context():
            return compat.activation_memory_budget(budget)  # read when forward compiles the graphs

        note = f"torch.compile backend {backend}, activation_memory_budget {'default' if budget is None else budget}"
        return PreparedModel(model=compiled, forward_context=forward_context, note=note)
