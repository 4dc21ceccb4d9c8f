"""Model-guided searches (docs/design.md §5): the answer bisection finds, from fewer probes.

Synthetic peak functions stand in for measurements (no model is built): a line in the batch, a
grown ResNet's depth whose blocks alternate between two stages, a quadratic in the input side, a
step change, noise, and non-monotone peaks. Every property loop runs with fixed seeds. The last
test plans a real ResNet-18 on meta through the CLI and checks what ``summary.json`` says.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Callable

import pytest

from actbench import strategies
from actbench.core.devices import PROFILES
from actbench.schema import InputSize, MEMORY_FAILURES, Measurement, ModelSpec, ResultRow
from actbench.planning.configs import multiples_of, ScaleConfig, SweepConfig
from actbench.planning.point import Point
from actbench.planning.guided import (binary_search_largest, GROWTH, guided_search_largest, MAX_GUIDED_PROBES,
                                      predictive_search_largest, search_probes)
from actbench.planning.search import run_max_scale, run_plan, run_sweep
from actbench.planning.settings import MeasureSettings

GiB = 2**30
BATCHES = multiples_of(4, 4, 16384)  # plan's batch range
DEPTHS = tuple(range(0, 4097))  # max-scale's depth range (extra blocks)
SIDES = tuple(range(32, 2049, 8))


def fp32_like(batch: int) -> int:
    """ResNet-50 fp32 on meta: 213 MB fixed + 86.7 MB per sample (exactly affine)."""
    return 213_077_648 + 86_704_136 * batch


def grown_resnet(extra: int) -> int:
    """ResNet-152 at batch 64 grown by ``extra`` blocks, 8:36 between a costlier and a cheaper stage."""
    to_stage2 = round(extra * 8 / 44)
    return 11_897_361_344 + 236_000_000 * to_stage2 + 170_000_000 * (extra - to_stage2)


def by_pixels(side: int) -> int:
    return 300_000_000 + 100_000 * side + 40_000 * side * side


WIDTHS = tuple(range(64, 2049, 8))


def by_width(width: int) -> int:
    """ResNet-152 fp32 on meta, fitted: 7.6 GB + 66 MB per unit of width_per_group + 62 kB per unit²."""
    return 7_600_000_000 + 66_000_000 * width + 62_000 * width * width


@dataclass
class Outcome:
    guided: int | None
    bisected: int | None
    probes: list[int]
    bisection_path: list[int]
    method: str
    fallback: str | None
    fits: Callable[[int], bool] = field(repr=False)

    @property
    def bisection_probes(self) -> int:
        return len(self.bisection_path)


def search(cands, peak: Callable[[int], int], budget: int, *, peaks_on_failure: bool = True, feature=float,
           degree: int = 1, first=None, anchor=None, scout: float = 1.0) -> Outcome:
    """The guided search and plain bisection on the same synthetic peak; every value probed once."""
    probes: list[int] = []

    def probe(v: int) -> tuple[bool, int | None]:
        assert v not in probes, f"{v} probed twice"
        probes.append(v)
        p = peak(v)
        return p <= budget, (p if p <= budget or peaks_on_failure else None)

    best, trace = guided_search_largest(cands, probe, budget, feature=feature, degree=degree, first=first,
                                        anchor=(lambda: anchor), scout=scout, fit="x")
    assert trace.probes == len(probes)
    bisection: list[int] = []
    ref = binary_search_largest(cands, lambda v: bisection.append(v) or peak(v) <= budget)
    return Outcome(best, ref, probes, bisection, trace.method, trace.fallback, lambda v: peak(v) <= budget)


def certified(o: Outcome, cands) -> bool:
    """The answer fits and the next candidate was probed and fails (or it is the last candidate)."""
    if o.guided is None:
        return cands[0] in o.probes and not o.fits(cands[0])
    nxt = cands.index(o.guided) + 1
    return o.fits(o.guided) and (nxt == len(cands) or (cands[nxt] in o.probes and not o.fits(cands[nxt])))


def monotone(cands, fits: Callable[[int], bool]) -> bool:
    flags = [fits(v) for v in cands]
    return all(a or not b for a, b in zip(flags, flags[1:]))


SMOOTH = [  # name, candidates, peak, budgets (lo, hi), search options as the commands set them, probe bounds
    # (with peaks on failure, cuda: without)
    ("line in batch", BATCHES, fp32_like, (2 * GiB, 1400 * GiB), dict(first=64, anchor=(0.0, 204_456_256.0)), (4, 4)),
    ("grown depth", DEPTHS, grown_resnet, (12 * GiB, 700 * GiB),
     dict(anchor=(-152 / 3, 0.0), scout=GROWTH["depth"].scout), (5, 5)),
    ("pixels", SIDES, by_pixels, (1 * GiB, 160 * GiB), dict(feature=GROWTH["resolution"].feature, anchor=(0.0, 2e8)),
     (5, 5)),
    ("width and width²", WIDTHS, by_width, (13 * GiB, 370 * GiB), dict(degree=2, anchor=(0.0, 4.8e8)), (5, 5)),
]


@pytest.mark.parametrize("peaks_on_failure", [True, False], ids=["meta-or-cpu", "cuda-oom-without-peak"])
@pytest.mark.parametrize("name,cands,peak,budgets,options,bounds", SMOOTH, ids=[s[0] for s in SMOOTH])
def test_smooth_growth_gives_bisections_answer_from_few_probes(name, cands, peak, budgets, options, bounds,
                                                              peaks_on_failure) -> None:
    """200 budgets each: bisection's answer, certified, from at most 4-5 probes (bisection: 8-12
    here), and about one failing probe per search, the one that certifies the answer (bisection:
    3.5-6; on cuda each is an out-of-memory run)."""
    rng = random.Random(17)
    total = bisection_total = failures = bisection_failures = 0
    for _ in range(200):
        budget = rng.randint(*budgets)
        o = search(cands, peak, budget, peaks_on_failure=peaks_on_failure, **options)
        assert o.guided == o.bisected, (name, budget, o)
        assert certified(o, cands) and o.method == "model-guided" and o.fallback is None, (name, budget, o)
        assert len(o.probes) <= bounds[not peaks_on_failure], (name, budget, o.probes)
        total += len(o.probes)
        bisection_total += o.bisection_probes
        failures += sum(not o.fits(v) for v in o.probes)
        bisection_failures += sum(not o.fits(v) for v in o.bisection_path)
    assert total < bisection_total * 0.7
    assert failures <= 200 * 1.1 and failures < bisection_failures * 0.4  # about one: the certifying probe


def test_depth_probes_small_before_it_jumps() -> None:
    """A probe costs as many layers as the network it builds: depth's first jump goes a quarter of the
    way, so the layers probed (2.5 answers' worth; jumping all the way: 2.9) stay near the floor of
    two, the answer and the one above it."""
    rng = random.Random(31)
    layers = {}
    for scout in (1.0, GROWTH["depth"].scout):
        total = 0.0
        for _ in range(200):
            budget = rng.randint(12 * GiB, 700 * GiB)
            probes: list[int] = []
            best, _ = guided_search_largest(DEPTHS, lambda v: (probes.append(v) or grown_resnet(v) <= budget,
                                                               grown_resnet(v)), budget,
                                            anchor=lambda: (-152 / 3, 0.0), scout=scout)
            assert best == binary_search_largest(DEPTHS, lambda v: grown_resnet(v) <= budget)
            total += sum(152 + 3 * v for v in probes) / (152 + 3 * best)
        layers[scout] = total / 200
    assert layers[GROWTH["depth"].scout] < 2.6 and layers[GROWTH["depth"].scout] < layers[1.0]


def test_line_in_the_wrong_variable_still_finds_the_answer() -> None:
    """Pixels fitted as a line in the side: the answers stay exact; the guard rails pay for it."""
    rng = random.Random(3)
    for _ in range(100):
        budget = rng.randint(1 * GiB, 160 * GiB)
        o = search(SIDES, by_pixels, budget, anchor=(0.0, 2e8))
        assert o.guided == o.bisected and certified(o, SIDES)


def test_monotone_noise_gives_bisections_answer() -> None:
    """Measured peaks jitter (allocator rounding): +-150 MB against 347 MB per candidate stays monotone."""
    rng = random.Random(5)
    jitter = {b: rng.uniform(-1.5e8, 1.5e8) for b in BATCHES}

    def noisy(b: int) -> int:
        return int(fp32_like(b) + jitter[b])

    for peaks_on_failure in (True, False):
        total = bisection_total = 0
        for _ in range(200):
            budget = rng.randint(2 * GiB, 900 * GiB)
            o = search(BATCHES, noisy, budget, peaks_on_failure=peaks_on_failure, first=64, anchor=(0.0, 2e8))
            assert o.guided == o.bisected and certified(o, BATCHES), (budget, o)
            assert o.method == "model-guided", (budget, o)
            assert len(o.probes) <= MAX_GUIDED_PROBES
            total += len(o.probes)
            bisection_total += o.bisection_probes
        assert total * 1.5 < bisection_total


def test_step_change_falls_back_and_still_gives_bisections_answer() -> None:
    """A step of 280 GiB at batch 6000 (an algorithm switch): some searches see the line miss twice,
    bisect what is left, and say so; every answer is bisection's."""
    def stepped(b: int) -> int:
        return fp32_like(b) + (300_000_000_000 if b >= 6000 else 0)

    rng = random.Random(11)
    for peaks_on_failure in (True, False):
        fallbacks: list[str] = []
        total = bisection_total = 0
        for _ in range(200):
            budget = rng.randint(2 * GiB, 1500 * GiB)
            o = search(BATCHES, stepped, budget, peaks_on_failure=peaks_on_failure, first=64, anchor=(0.0, 2e8))
            assert o.guided == o.bisected and certified(o, BATCHES), (budget, o)
            assert len(o.probes) <= MAX_GUIDED_PROBES + search_probes(len(BATCHES))
            if o.method == "bisection":
                fallbacks.append(o.fallback)
            total += len(o.probes)
            bisection_total += o.bisection_probes
        assert fallbacks, "the step never made the line miss"
        assert all(f.startswith(("poor fit", "no certified answer")) for f in fallbacks), fallbacks
        assert total < bisection_total


def test_non_monotone_peaks_fall_back_to_plain_bisection() -> None:
    """Peaks that wobble by more than one candidate's increment: when the probes see a peak fall as
    the value grows, the search becomes bisection itself (the same answer whatever the function)
    and says so; when fitting stays monotone for a budget, the answer is bisection's anyway; every
    answer is certified."""
    rng = random.Random(23)
    wobble = {b: 1 + rng.uniform(-0.02, 0.02) for b in BATCHES}

    def peak(b: int) -> int:
        return int(fp32_like(b) * wobble[b])

    seen = 0
    for _ in range(300):
        budget = rng.randint(2 * GiB, 1400 * GiB)
        o = search(BATCHES, peak, budget, first=64, anchor=(0.0, 2e8))
        assert certified(o, BATCHES), (budget, o)
        if "non-monotone" in (o.fallback or ""):
            seen += 1
            assert o.method == "bisection" and o.guided == o.bisected, (budget, o)
        if monotone(BATCHES, o.fits):
            assert o.guided == o.bisected, (budget, o)
    assert seen >= 100


def test_a_dip_the_probes_never_see_still_gives_a_certified_answer() -> None:
    """A cheaper algorithm from batch 6000 on (90 GiB less): for budgets where fitting is not monotone
    no search can know bisection's answer without its probes; the guided answer is still certified,
    and for every other budget it is bisection's."""
    def dipped(b: int) -> int:
        return fp32_like(b) - (96_000_000_000 if b >= 6000 else 0)

    rng = random.Random(29)
    for _ in range(300):
        budget = rng.randint(2 * GiB, 1400 * GiB)
        o = search(BATCHES, dipped, budget, first=64, anchor=(0.0, 2e8))
        assert certified(o, BATCHES), (budget, o)
        if monotone(BATCHES, o.fits):
            assert o.guided == o.bisected, (budget, o)


def test_edges_no_budget_nothing_fits_everything_fits() -> None:
    # No budget: nothing to aim at, plain bisection, the very probes binary_search_largest makes.
    probes: list[int] = []
    best, trace = guided_search_largest(BATCHES, lambda v: (probes.append(v) or v <= 608, None), None)
    expected: list[int] = []
    assert best == binary_search_largest(BATCHES, lambda v: expected.append(v) or v <= 608) == 608
    assert probes == expected and trace.method == "bisection" and trace.fallback == "no budget to aim at"
    # Nothing fits: certified by the first candidate failing.
    o = search(BATCHES, lambda b: 10**15 + b, GiB, first=64, anchor=(0.0, 0.0))
    assert o.guided is None is o.bisected and certified(o, BATCHES)
    # Everything fits: the last candidate.
    o = search(BATCHES, fp32_like, 10**16, first=64, anchor=(0.0, 0.0))
    assert o.guided == BATCHES[-1] == o.bisected and len(o.probes) <= 3
    # One candidate; and the earlier API still answers.
    assert search((8,), fp32_like, 16 * GiB).guided == 8
    assert predictive_search_largest(BATCHES, lambda v: (fp32_like(v) <= 16 * GiB, fp32_like(v)), 16 * GiB,
                                     first=64, intercept=lambda: 204_456_256) == 192


# --- the searches the commands run, on synthetic rows ------------------------------------------------------


def _row(point: Point, peak: int, budget: int | None, peaks_on_failure: bool) -> ResultRow:
    fits = budget is None or peak <= budget
    status = "ok" if fits else ("over_budget" if peaks_on_failure else "oom")
    depth = 152 + 3 * point.model.extra_blocks
    m = Measurement(status=status, peak_alloc_bytes=peak if fits or peaks_on_failure else None,
                    param_bytes=100_000_000, grad_bytes=100_000_000, depth=depth)
    return ResultRow.build(point.config, m, "run", "env")


def _synthetic(point: Point) -> int:
    """Peak of a point, growing like the real thing in each dimension (L3 a fifth of fp32's activations)."""
    per = 1.0 if point.strategy.name == "fp32" else 0.2
    width = point.model.width_per_group or 64
    activations = per * 40_000 * point.batch_size * point.image_size ** 2 / 224 ** 2 * 2_000
    activations *= (152 + 3 * point.model.extra_blocks) / 152 * (0.5 + 0.5 * width / 64)
    return int(200_000_000 + 30_000 * width ** 2 + activations)


def _strategies(*names: str) -> tuple:
    """The strategies called ``names``, as search configs hold them."""
    return tuple(strategies.get(n) for n in names)


class FakeRunner:
    """A ``run(point) -> row`` callable, as PointRunner.run; counts what it was asked for."""

    def __init__(self, budget: int | None, peaks_on_failure: bool = True) -> None:
        self.budget, self.peaks_on_failure, self.asked = budget, peaks_on_failure, []

    def __call__(self, point: Point) -> ResultRow:
        self.asked.append(point)
        return _row(point, _synthetic(point), self.budget, self.peaks_on_failure)


@pytest.mark.parametrize("dim,low,high,step", [("batch", 4, 16384, 4), ("depth", 0, 4096, 1), ("width", 64, 512, 8),
                                               ("resolution", 224, 768, 32)])
def test_run_plan_summary_says_how_each_maximum_was_reached(dim: str, low: int, high: int, step: int) -> None:
    budget = 16 * GiB
    settings = MeasureSettings(device=PROFILES["meta"], budget_bytes=budget, warmup_steps=1, timed_steps=0)
    cfg = ScaleConfig(dim, "resnet152", _strategies("fp32", "L3"), 64, InputSize(224, 224), low, high, step, settings, command="plan")
    runner = FakeRunner(budget)
    outcome = run_plan(cfg, runner)
    summary = outcome.summary()
    assert len(runner.asked) == len(outcome.rows) == sum(s["probes"] for s in summary.values())
    for strategy, entry in summary.items():
        assert set(entry) == {"max", "bounded", "key", "method", "probes", "fit", "fallback"}
        expected = binary_search_largest(cfg.candidates(),
                                         lambda v, s=strategy: _synthetic(cfg.point(strategies.get(s), v)) <= budget)
        assert entry["max"] == expected and entry["bounded"] is (expected < high), (dim, strategy, entry)
        assert entry["method"] == "model-guided" and entry["fallback"] is None
        assert entry["fit"] == GROWTH[dim].fit and entry["probes"] <= 5, entry
        assert entry["probes"] < search_probes(len(cfg.candidates())) or len(cfg.candidates()) < 32
        assert entry["key"] == outcome.best_rows[strategy].key


def test_max_scale_and_find_max_on_cuda_like_rows() -> None:
    """Out-of-memory rows carry no peak: the line is fitted to rows that fit; few of them run out."""
    budget = 16 * GiB
    settings = MeasureSettings(device=PROFILES["cuda"], budget_bytes=budget)
    cfg = ScaleConfig("depth", "resnet152", _strategies("fp32", "L3"), 64, InputSize(224, 224), 0, 4096, 1, settings)
    runner = FakeRunner(budget, peaks_on_failure=False)
    outcome = run_max_scale(cfg, runner)
    for strategy, entry in outcome.summary().items():
        expected = binary_search_largest(cfg.candidates(),
                                         lambda v, s=strategy: _synthetic(cfg.point(strategies.get(s), v)) <= budget)
        assert entry["max"] == expected and entry["method"] == "model-guided" and entry["probes"] <= 5
    assert sum(r.status == "oom" for r in outcome.rows) <= 3

    sweep = SweepConfig(ModelSpec("resnet50"), _strategies("fp32", "L3"), (16, 4096), InputSize(224, 224), settings, find_max=True)
    runner = FakeRunner(budget, peaks_on_failure=False)
    outcome = run_sweep(sweep, runner)
    for strategy, entry in outcome.summary().items():
        expected = binary_search_largest(sweep.candidates(), lambda v, s=strategy: _synthetic(
            settings.point(ModelSpec("resnet50"), strategies.get(s), v, InputSize(224, 224))) <= budget)
        assert entry["max"] == expected and entry["method"] == "model-guided" and entry["fit"] == "a + b·batch"
        assert entry["probes"] <= 5 and entry["bounded"]
    # Without a budget (cpu or cuda without --budget) there is no line to aim: plain bisection, as before.
    plain = SweepConfig(ModelSpec("resnet50"), _strategies("fp32"), (16, 4096), InputSize(224, 224),
                        MeasureSettings(device=PROFILES["cpu"]), find_max=True)
    outcome = run_sweep(plain, FakeRunner(None))
    assert outcome.summary()["fp32"]["method"] == "bisection" and outcome.summary()["fp32"]["max"] == 4096
    assert outcome.summary()["fp32"]["fallback"] == "no budget to aim at" and outcome.summary()["fp32"]["fit"] is None


def test_scan_summary_counts_its_points() -> None:
    settings = MeasureSettings(device=PROFILES["cpu"], budget_bytes=2 * GiB)
    cfg = SweepConfig(ModelSpec("resnet50"), _strategies("fp32"), (4, 8, 400, 800, 1600), InputSize(224, 224), settings, stop_after=2)
    outcome = run_sweep(cfg, FakeRunner(2 * GiB))
    entry = outcome.summary()["fp32"]
    assert entry["method"] == "scan" and entry["probes"] == len(outcome.rows) == 4 and entry["max"] == 8


def _takes(model: str, side: int) -> bool:
    from actbench.training.tasks.classification import size_problem

    return size_problem(model, InputSize(side, side)) is None


@pytest.mark.parametrize("command", ["max-scale", "plan"])
@pytest.mark.parametrize("model, sides", [
    ("resnet152", tuple(range(224, 1201, 10))),  # every side: the range as before
    ("vit_b_16", tuple(range(224, 1201, 16))),  # each next multiple of its patch at least --step on
    ("maxvit_t", (224, 445, 669, 893, 1117)),  # each next side its partitions tile
])
def test_a_resolution_search_probes_only_sides_the_model_takes(command: str, model: str, sides: tuple) -> None:
    from actbench.planning.configs import validate_max_scale

    budget = 16 * GiB
    settings = MeasureSettings(device=PROFILES["meta"], budget_bytes=budget, warmup_steps=1, timed_steps=0)
    cfg = ScaleConfig("resolution", model, _strategies("fp32", "L3"), 64, InputSize(224, 224), 224, 1200, 10,
                      settings, command=command)
    validate_max_scale(cfg)
    assert cfg.candidates() == sides and all(_takes(model, side) for side in sides)
    runner = FakeRunner(budget)
    outcome = (run_plan if command == "plan" else run_max_scale)(cfg, runner)
    assert runner.asked and all(_takes(model, p.image_size) for p in runner.asked)
    for strategy, best in outcome.maxima.items():
        expected = binary_search_largest(sides, lambda v, s=strategy: _synthetic(
            cfg.point(strategies.get(s), v)) <= budget)
        assert best == expected and best in sides, (strategy, best)


@pytest.mark.parametrize("model, low, high, rule", [
    ("vit_b_16", 225, 239, "vit_b_16 takes square images whose side is a multiple of 16"),
    ("maxvit_t", 225, 440, "maxvit_t takes sides whose feature maps stay multiples of 7"),
    ("inception_v3", 224, 298, "inception_v3 needs image sides of at least 299 px"),
])
def test_a_resolution_range_without_a_side_the_model_takes_is_refused(model: str, low: int, high: int,
                                                                      rule: str) -> None:
    from actbench.planning.configs import validate_max_scale, validate_plan

    settings = MeasureSettings(device=PROFILES["meta"], budget_bytes=GiB, warmup_steps=1, timed_steps=0)
    for command, validate in (("max-scale", validate_max_scale), ("plan", validate_plan)):
        cfg = ScaleConfig("resolution", model, _strategies("fp32"), 2, InputSize(224, 224), low, high, 1, settings,
                          command=command)
        with pytest.raises(ValueError) as exc:
            validate(cfg)
        message = str(exc.value)
        assert "\n" not in message and message.startswith(
            f"--dim resolution: --low {low} .. --high {high} holds no side {model} trains at: {rule}"), message


def test_a_probe_that_errs_ends_a_plan_without_a_maximum() -> None:
    budget = 16 * GiB
    settings = MeasureSettings(device=PROFILES["meta"], budget_bytes=budget, warmup_steps=1, timed_steps=0)
    cfg = ScaleConfig("batch", "resnet50", _strategies("fp32"), 64, InputSize(224, 224), 4, 16384, 4, settings, command="plan")

    def run(point: Point) -> ResultRow:
        if point.batch_size > 64:
            return ResultRow.build(point.config, Measurement(status="error", message="boom"), "run", "env")
        return _row(point, _synthetic(point), budget, True)

    outcome = run_plan(cfg, run)
    assert outcome.maxima["fp32"] is None and outcome.summary()["fp32"]["probes"] == 2
    assert all(r.status in ("ok", "error", *MEMORY_FAILURES) for r in outcome.rows)


# --- one real plan on meta, through the CLI ----------------------------------------------------------------


@pytest.mark.memory_gb(2.7)  # 2.60 GB measured, children included
@pytest.mark.slow
def test_plan_on_meta_records_how_each_maximum_was_reached(tmp_path) -> None:
    from typer.testing import CliRunner

    from actbench.cli import app

    result = CliRunner().invoke(app, ["plan", "resnet18", "--budget", "512MiB", "--levels", "L3", "--image-size", "32",
                                      "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    rows = [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())["max"]
    assert set(summary) == {"fp32", "L3"}
    for strategy, entry in summary.items():
        mine = {r["batch_size"]: r for r in rows if r["strategy"] == strategy}
        assert entry["method"] == "model-guided" and entry["fallback"] is None and entry["fit"] == "a + b·batch"
        assert entry["probes"] == len(mine) <= 5  # bisection over 4096 batch sizes: 12
        best = entry["max"]
        assert mine[best]["status"] == "ok" and mine[best + 4]["status"] == "over_budget"  # certified
        assert entry["bounded"] is True and entry["key"] == mine[best]["key"]
    assert summary["L3"]["max"] > summary["fp32"]["max"]


@pytest.mark.parametrize("name,cands,peak,budgets,options,bounds", SMOOTH, ids=[s[0] for s in SMOOTH])
def test_spare_slots_certify_the_answer_in_fewer_rounds(name, cands, peak, budgets, options, bounds) -> None:
    """With ``together`` (scale-out's spare slots) the predicted answer and the neighbour that would
    certify it are probed at once: the same certified answer in fewer rounds of probes, at the cost
    of at most one extra probe when the side is guessed wrong (about half the time on these shapes).
    Without a spare slot (``together`` returns None) the probes are the serial search's, in order."""
    rng = random.Random(23)
    serial_rounds = paired_rounds = extra = 0
    for _ in range(200):
        budget = rng.randint(*budgets)
        serial = search(cands, peak, budget, **options)
        rounds: list[list[int]] = []
        probed: list[int] = []

        def probe(v: int) -> tuple[bool, int | None]:
            assert v not in probed, f"{v} probed twice"
            probed.append(v)
            rounds.append([v])
            return peak(v) <= budget, peak(v)

        def together(values):
            assert len(values) == 2 and not set(values) & set(probed)
            probed.extend(values)
            rounds.append(list(values))
            return [(peak(v) <= budget, peak(v)) for v in values]

        opts = {k: v for k, v in options.items() if k != "anchor"}
        best, trace = guided_search_largest(cands, probe, budget, anchor=lambda: options.get("anchor"), fit="x",
                                            together=together, **opts)
        assert best == serial.bisected and trace.method == "model-guided", (name, budget)
        assert trace.probes == len(probed) <= len(serial.probes) + 1
        nxt = cands.index(best) + 1
        assert nxt == len(cands) or (cands[nxt] in probed and peak(cands[nxt]) > budget)  # certified
        serial_rounds += len(serial.probes)
        paired_rounds += len(rounds)
        extra += len(probed) - len(serial.probes)

        unpaired: list[int] = []
        guided_search_largest(cands, lambda v: unpaired.append(v) or (peak(v) <= budget, peak(v)), budget,
                              anchor=lambda: options.get("anchor"), fit="x", together=lambda values: None, **opts)
        assert unpaired == serial.probes
    # Measured (200 searches each): 84-136 rounds saved, 64-112 extra probes (at most one per search).
    assert paired_rounds <= serial_rounds - 80, (paired_rounds, serial_rounds)
    assert extra <= 120, extra
