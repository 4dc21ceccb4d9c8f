"""Trust for speed on a shared CPU: strategies' steps timed round-robin, beside meta's predictions.

Why: ``actbench trust --device-model`` times each point in its own ten seconds, so on a CPU shared with
other work the load moves between points and their order. Here every strategy's step is built first
and then timed in turn, round after round, so all see the same load; the fastest step of each (a
host's cost is a floor) and the median are printed beside the step meta predicts on the device model,
with and without its ``strategy_call_s`` (a strategy's own Python priced or free). Each line also
carries every round's step and their spread (IQR over median); a last line names the pairs of
strategies predicted in the other order than measured, each with its measured gap beside the spread
(``actbench.studies.trust.speed_order_misses``: a gap within the spread is an order the rounds do
not settle).

Usage: OMP_NUM_THREADS=1 python scripts/interleaved_speed.py MODEL_FILE MODEL IMAGE_SIZE BATCH ROUNDS STRATEGIES
(STRATEGIES a comma list; ``bf16`` is fp32 under bf16 autocast). Prints one JSON object per strategy.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import sys

import torch

from actbench import strategies
from actbench.kernels.bench import samples_in_turn
from actbench.measure.meta import MetaSessions
from actbench.measure.point import spread
from actbench.planning.point import Point
from actbench.planning.device_models import DeviceModel, load_device_model
from actbench.planning.step_time import predict_step
from actbench.schema import ModelSpec, PointConfig
from actbench.studies.trust import SpeedComparison, describe_speed_order, speed_order_misses
from actbench.training.models import build_model
from actbench.training.step import build_training_step, synthetic_batch


def _strategy_and_precision(name: str) -> tuple[str, str]:
    return ("fp32", "bf16") if name == "bf16" else (name, "fp32")


def predicted(model: DeviceModel, spec: ModelSpec, size: int, batch: int, name: str) -> tuple[float, float]:
    """(with strategy calls, without) predicted step seconds of one point on meta."""
    strategy, precision = _strategy_and_precision(name)
    sessions = MetaSessions(speed_model=model)
    sessions.measure_point(Point.resolve(PointConfig(spec, strategy, batch, size, "meta", timed_steps=0,
                                                     precision=precision)))
    ops = list(list(sessions._traces.values())[-1].ops)
    plain = dataclasses.replace(model, strategy_call_s={})
    return predict_step(ops, model).step_s, predict_step(ops, plain).step_s


def measured(spec: ModelSpec, size: int, batch: int, names: list[str], rounds: int) -> dict[str, list[float]]:
    """Seconds of each strategy's cpu step, ``rounds`` of them, timed in turn after two warm-up steps
    (``samples_in_turn``, as ``bench-actnn --in-turn`` times them)."""
    device = torch.device("cpu")
    steps = {}
    for name in names:
        strategy, precision = _strategy_and_precision(name)
        torch.manual_seed(0)
        step, _ = build_training_step(strategies.get(strategy), build_model(spec, size).to(device), device,
                                      precision=precision)
        images, targets = synthetic_batch(batch, size, spec.num_classes, device, 1)
        steps[name] = functools.partial(step, images, targets)
    return samples_in_turn(steps, "cpu", rounds, warmup=2)


def main(argv: list[str]) -> None:
    path, model_name, size, batch, rounds, names = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4]), argv[5]
    model, spec, chosen = load_device_model(path), ModelSpec(model_name), names.split(",")
    predictions = {name: predicted(model, spec, size, batch, name) for name in chosen}
    times = measured(spec, size, batch, chosen, rounds)
    rows = []
    for name in chosen:
        fastest, median = min(times[name]), statistics.median(times[name])
        with_calls, without = predictions[name]
        rows.append(SpeedComparison(model_name, name, batch, size, "cpu", model.name, "ok", "ok", with_calls, fastest,
                                    spread(times[name]), ""))
        print(json.dumps({"model": model_name, "strategy": name, "batch": batch, "image_size": size,
                          "device_model": model.name, "predicted_step_s": with_calls,
                          "predicted_step_s_without_calls": without, "measured_min_s": fastest,
                          "measured_median_s": median, "measured_spread": rows[-1].measured_spread,
                          "measured_rounds_s": times[name], "ratio_min": with_calls / fastest,
                          "ratio_min_without_calls": without / fastest}))
    print(describe_speed_order(speed_order_misses(rows)))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1:])
