"""The optimiser step alone (no forward or backward): what core's basis change adds per step.

    python scripts/optimizer_step_cost.py --teacher DIR|CONFIG.json [--bases DIR] --student-hidden 1536 [--repeats 3]

For `dense` and `core` (``--core-impl optimizer``, the basis change in the step) on the student of
``--teacher`` (as `lrc bench` takes it: a config JSON is a seeded random teacher), gradients
set at random: the median CPU seconds of ``CoordinateAdamW.step()`` (after a first step,
which also makes the coordinates from W), and one gradient map and one map back of one MLP
matrix, each timed warm (an untimed first map makes the map back's input). The basis change
is a fixed cost per optimiser step, whatever the tokens per step, so with a dense step of
``t`` seconds at a given batch ``core/dense ~ 1 + (core step - dense step) / t``
(docs/performance.md, "core over dense: the basis change in the optimiser step").
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lrc.commands.bench import load_bench_teacher
from lrc.method.reach import apply_arm
from lrc.method.spectral import compute_bases, load_bases
from lrc.method.student import build_student
from lrc.training.optim import CoordinateAdamW, coordinate_maps

ARMS = [("dense", "optimizer"), ("core", "optimizer")]


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True, help="teacher checkpoint directory or config JSON (random, seed 0)")
    ap.add_argument("--bases", help="its `lrc svd` bases (default: computed here)")
    ap.add_argument("--student-hidden", type=int, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    teacher = load_bench_teacher(a.teacher, seed=0)
    bases = load_bases(a.bases) if a.bases else compute_bases(teacher)
    print("arm                  step cpu s   map s   map back s   matrices")
    for arm, impl in ARMS:
        student = build_student(teacher, a.student_hidden, seed=0)
        apply_arm(student, teacher, arm, bases=bases, seed=0, core_impl=impl)
        params = [p for p in student.parameters() if p.requires_grad]
        maps = coordinate_maps(student)
        opt = CoordinateAdamW(params, coordinates=maps, lr=1e-4)
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opt.step()
        step = statistics.median(cpu_seconds(opt.step) for _ in range(a.repeats))
        line = f"{arm + ':' + impl:20} {step:11.2f}"
        if maps:
            weight, cmap = next(iter(maps.items()))
            coords = cmap.coordinates(weight.grad)
            line += (f" {cpu_seconds(lambda: cmap.coordinates(weight.grad)):7.2f}"
                     f" {cpu_seconds(lambda: cmap(coords)):12.2f} {len(maps):10d}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
