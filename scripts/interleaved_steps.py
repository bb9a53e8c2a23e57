"""Training steps of several arms in one process, taken in turn: ratios that machine drift cannot move.

    python scripts/interleaved_steps.py --teacher DIR|CONFIG.json [--bases DIR] --student-hidden 1536 \
        [--arms dense core] [--batch-size 1] [--seq-len 2048] [--micro-batches 1] [--rounds 5] [--out steps.csv]

`lrc bench` runs each arm in a fresh process, one after the other: right for peak memory,
but on a machine whose speed drifts (here by up to 18 % between two runs of one arm at
Llama-3.2-3B widths) a ratio of two runs minutes apart carries the drift. Here every arm gets
its own teacher copy (the clone terms hook their teacher), student, objective and optimiser
(the training loop's own AdamW / CoordinateAdamW and `lrc.training.loop.train_step`: forward and
backward over ``--micro-batches``, clipping, the optimiser step), and one round runs one step
of each arm, the order alternating between rounds. After one unmeasured round (AdamW's
states made), each measured round gives each arm's CPU seconds of the step and of its
optimiser step; the ratios to the first arm are taken within a round, then their median.
``fb`` is the step less its optimiser step (forward, backward, clipping): per token the
same for `dense` and `core` when their forwards are equal. With ``fb`` per micro-batch and
the optimiser step (a fixed cost per step) the ratio at ``N`` micro-batches of the same size
per step is ``(N * fb_arm + opt_arm) / (N * fb_first + opt_first)``, taken in each round
and then the median: ``--project N`` prints it. ``--forward-backward-only`` drops the
optimiser step, so that the rounds are short and the pairing fine, for the question whether
the arms' forwards and backwards cost the same.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import statistics
import time
from pathlib import Path

import torch

from lrc.commands.bench import RandomRows, load_bench_teacher
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.method.reach import BASIS_ARMS, apply_arm
from lrc.method.spectral import compute_bases, load_bases
from lrc.method.student import build_student
from lrc.training.loop import Run, TrainArgs, optimizer_and_schedule, train_step
from lrc.training.memory import (
    _TraceAccelerator,  # accelerate's one-process calls, without its global state
)


class Timed:
    """CPU seconds of the optimiser step (``train_step``'s ``time_optimizer``)."""

    def __init__(self):
        self.seconds = 0.0

    def __call__(self):
        return self

    def __enter__(self):
        self.start = time.process_time()

    def __exit__(self, *exc):
        self.seconds = time.process_time() - self.start


def prepare(arm: str, a, bases, steps: int):
    teacher = load_bench_teacher(a.teacher, seed=0)
    name, _, impl = arm.partition(":")  # core:parametrized, as in lrc bench
    student = build_student(teacher, a.student_hidden, seed=0)
    apply_arm(student, teacher, name, bases=bases if name in BASIS_ARMS else None, seed=0,
              core_impl=impl or "optimizer")
    objective = CloneObjective(teacher, student, RecipeArgs())
    per_step = a.batch_size * a.micro_batches
    targs = TrainArgs(batch_size=per_step, micro_batch_size=a.batch_size, precision="fp32", lr=1e-4, warmup=0.0,
                      progress=False)
    student.train()
    optimizer, scheduler = optimizer_and_schedule(student, targs, steps)
    run = Run(args=targs, accelerator=_TraceAccelerator("fp32"), wrapped=student, bare=student, optimizer=optimizer,
              scheduler=scheduler, fsdp=False, mixed="no", steps=steps, accum=a.micro_batches, seq_len=a.seq_len,
              n_rows=0, ckpt_dir=Path("."), fingerprint={})
    data = RandomRows(per_step * steps, a.seq_len, teacher.config.vocab_size, seed=0)
    batches = itertools.cycle(torch.utils.data.DataLoader(data, batch_size=a.batch_size))  # the same rows for every arm
    return run, objective, batches, [p for p in student.parameters() if p.requires_grad]


def forward_backward(run, objective, batches) -> None:
    """The micro-batches' forwards and backwards alone; the gradients dropped, no step."""
    for _ in range(run.accum):
        total, _ = objective.loss(next(batches), model=run.wrapped)
        (total / run.accum).backward()
    run.optimizer.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True, help="teacher checkpoint directory or config JSON (random, seed 0)")
    ap.add_argument("--bases", help="its `lrc svd` bases (default: computed here)")
    ap.add_argument("--student-hidden", type=int, required=True)
    ap.add_argument("--arms", nargs="+", default=["dense", "core"], help="the first is the reference of the ratios")
    ap.add_argument("--batch-size", type=int, default=1, help="sequences per micro-batch")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batches", type=int, default=1, help="micro-batches per optimiser step")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds (one unmeasured round first)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--forward-backward-only", action="store_true",
                    help="no optimiser step: rounds of forwards and backwards only (finer pairing; the optimiser step "
                         "is then 0)")
    ap.add_argument("--project", type=int, nargs="*", default=[], help="micro-batches per step to project the ratio to")
    ap.add_argument("--out", type=Path, help="CSV of every measured step")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    bases = None
    if any(arm.partition(":")[0] in BASIS_ARMS for arm in a.arms):
        bases = load_bases(a.bases) if a.bases else compute_bases(load_bench_teacher(a.teacher, seed=0))
    steps = a.rounds + 1
    prepared = {arm: prepare(arm, a, bases, steps) for arm in a.arms}
    rows = []
    for rnd in range(steps):
        order = a.arms if rnd % 2 == 0 else a.arms[::-1]
        for arm in order:
            run, objective, batches, trainable = prepared[arm]
            timer = Timed()
            start = time.process_time()
            if a.forward_backward_only:
                forward_backward(run, objective, batches)
            else:
                train_step(run, objective, batches, trainable, time_optimizer=timer)
            step = time.process_time() - start
            if rnd > 0:
                rows.append({"round": rnd, "arm": arm, "step_cpu_s": step, "optimizer_cpu_s": timer.seconds,
                             "fb_cpu_s": step - timer.seconds})
            print(f"round {rnd} {arm}: step {step:.2f} s, optimiser step {timer.seconds:.2f} s"
                  + (" (unmeasured)" if rnd == 0 else ""), flush=True)
    first = a.arms[0]
    by = {(r["round"], r["arm"]): r for r in rows}
    med = lambda arm, key: statistics.median(r[key] for r in rows if r["arm"] == arm)  # noqa: E731

    def paired(arm: str, cost) -> float:
        """Median over rounds of cost(arm's step) / cost(the first arm's step in the same round)."""
        return statistics.median(cost(by[(k, arm)]) / cost(by[(k, first)]) for k in range(1, steps))

    def at(n: int):
        return lambda r: n * r["fb_cpu_s"] / a.micro_batches + r["optimizer_cpu_s"]  # a step of n such micro-batches

    print(f"\n{a.rounds} rounds of {a.micro_batches} x {a.batch_size} x {a.seq_len} tokens; CPU seconds, medians; "
          f"ratios to {first} paired by round")
    print(f"{'arm':<20}{'step':>9}{'fb':>9}{'opt':>9}{'step/' + first:>16}{'fb/' + first:>14}"
          + "".join(f"{'x' + str(n) + ' mb':>10}" for n in a.project))
    for arm in a.arms:
        print(f"{arm:<20}{med(arm, 'step_cpu_s'):9.2f}{med(arm, 'fb_cpu_s'):9.2f}{med(arm, 'optimizer_cpu_s'):9.2f}"
              f"{paired(arm, lambda r: r['step_cpu_s']):16.4f}{paired(arm, lambda r: r['fb_cpu_s']):14.4f}"
              + "".join(f"{paired(arm, at(n)):10.4f}" for n in a.project))
    if a.out:
        with open(a.out, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
