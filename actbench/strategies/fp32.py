"""fp32: plain training, every saved tensor kept as autograd saves it (the baseline)."""

from __future__ import annotations

from actbench.strategies.registry import PreparedModel, Strategy, register


@register
class Fp32(Strategy):
    name = "fp32"
    description = "plain training; every saved tensor kept in full precision (the baseline)"
    order = 0
    colour = "#333333"

    def prepare(self, model, device, options, host_scope) -> PreparedModel:
        return PreparedModel(model=model)
