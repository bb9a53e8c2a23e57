"""`lrc bench`: step time and peak memory of each arm next to a plain-KD baseline.

Every measurement runs the real training loop (:func:`lrc.training.loop.train`, one optimiser
step = forward of teacher and student, backward, AdamW) on random token rows, in a fresh
subprocess per (arm, repeat), so that the peak memory of one arm is not the leftover of
another (on the CPU the peak is the process's max RSS, which never goes down). Repeats
rotate the order of the arms, so a machine that slows down over the run is spread evenly.

* ``kd``: the baseline, a standard HF student of the deployed shape (the teacher's config
  at hidden size r) trained only on the teacher's logits (:class:`lrc.method.objectives.KDObjective`);
  ``--no-baseline`` leaves it out, and the ratios to it blank (nan).
* each arm: the LRC student (`slice`, or re-parameterised by :func:`lrc.method.reach.apply_arm`)
  with :class:`lrc.method.clone.CloneObjective` (``--recipe``, default ``lrc``).

Columns: median step time over all measured steps of all repeats (the first
``--warmup-steps`` of each run are dropped), its interquartile range, the median CPU time
per step (this process's CPU seconds: on a shared machine far steadier than wall time; with
``--threads 1`` it is the compute), the median time of the optimiser step alone, wall (GPU:
the device's) and CPU (where `core`'s basis change runs: a cost per step, whatever the
tokens per step; under ``--processes``, process 0's, its waits for the others included, and
the slowest process's CPU times of the step and of the optimiser step, ``*_max``), the
peak memory (GPU: CUDA max allocated; CPU: peak RSS of the run, the kernel's mark reset
after the imports), the part of it above the memory at that point (what the models and the
step cost; the memory ratio to kd is taken on this part), trainable parameters, and how many
times the parametrisations are evaluated per step (each parametrised weight should be
materialised once per forward), and how many weights the optimiser steps in other
coordinates (`core`/`randcomp` with ``--core-impl optimizer``: one basis change per such
weight and step, none in the forward; "own": how many of them one process runs, the rest
running on the others with ``--processes P``, DDP through torchrun, each process taking
``--micro-batches`` forwards per step). ``--micro-batches N`` accumulates N forwards of
``--batch-size`` sequences per optimiser step, as training does. ``--teacher`` is a
checkpoint directory or a config JSON (a random teacher of that shape, seeded: enough for
timing).
"""

from __future__ import annotations

import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Sequence

import torch
from torch.nn.utils import parametrize
from transformers import AutoModelForCausalLM

from lrc.errors import LRCError
from lrc.io.atomic import atomic_file, write_json_atomic
from lrc.io.hf import load_model_config, load_teacher
from lrc.io.provenance import provenance, to_jsonable
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.method.objectives import KDObjective
from lrc.method.reach import BASIS_ARMS, CORE_IMPLS, apply_arm
from lrc.method.spectral import load_bases
from lrc.method.student import build_student, student_config
from lrc.names import ARMS, MAIN_ARMS
from lrc.options import check_choice, parse_args
from lrc.training.args import TrainArgs
from lrc.training.loop import train
from lrc.training.memory import peak_rss_mib, reset_peak_rss
from lrc.training.optim import coordinate_maps

BASELINE = "kd"


@dataclass(kw_only=True)
class BenchArgs:
    """Median step time and peak memory per arm vs a plain-KD student of the same shape."""

    teacher: Path = field(metadata={"help": "teacher checkpoint directory, or a config JSON (random weights)"})
    student_hidden: int = field(metadata={"help": "student hidden size r"})
    out: Path = field(metadata={"help": "CSV file to write", "output": "file"})
    arms: list[str] = field(default_factory=lambda: list(MAIN_ARMS), metadata={
        "help": "arms to time (kd, the baseline, is added unless --no-baseline); ARM:IMPL (core:parametrized) times an "
                "arm with another --core-impl"})
    baseline: bool = field(default=True, metadata={
        "help": "time plain KD first and give every arm's ratios to it; --no-baseline: only --arms, "
                "the ratios to kd left blank (at large widths, where kd's own run is long)"})
    recipe: Literal["lrc", "kl"] = field(default="lrc", metadata={"help": "loss recipe of the arms"})
    batch_size: int = field(default=8, metadata={"help": "sequences per micro-batch (one forward)"})
    micro_batches: int = field(default=1, metadata={"help": "micro-batches per optimiser step (gradient accumulation)"})
    weight_build: Literal["auto", "step", "micro_batch"] = field(default="auto", metadata={
        "help": "the parametrised weights built once per step or per micro-batch (lrc distill --weight-build)"})
    divide_weight_build: bool = field(default=False, metadata={
        "help": "with --processes: each process builds 1/N of each weight's rows (lrc distill --divide-weight-build)"})
    core_impl: Literal["optimizer", "parametrized"] = field(default="optimizer", metadata={
        "help": "core/randcomp: basis change in the optimiser step or a parametrisation (lrc.method.reach.apply_arm)"})
    activation_checkpointing: bool = field(default=False, metadata={
        "help": "checkpoint each decoder layer of every student, kd's too (lrc.training.recompute)"})
    recompute_teacher: bool = field(default=False, metadata={
        "help": "with --activation-checkpointing: rerun the teacher's layers inside the student's (lrc distill "
                "--recompute-teacher)"})
    seq_len: int = field(default=128, metadata={"help": "tokens per sequence"})
    steps: int = field(default=10, metadata={"help": "measured steps per run"})
    warmup_steps: int = field(default=3, metadata={"help": "steps run first and not measured"})
    repeats: int = field(default=3, metadata={"help": "runs per arm (fresh process each)"})
    processes: int = field(default=1, metadata={
        "help": "data-parallel processes per run (DDP through torchrun; gloo on a CPU): each runs --micro-batches "
                "forwards per step, and core's basis changes are divided between them"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads"})
    precision: Literal["auto", "fp32", "bf16"] = field(default="auto", metadata={
        "help": "as in training: auto = fp32 on CPU, bf16 on GPU"})
    seed: int = field(default=0, metadata={"help": "seed of the random teacher, the students and the data"})
    allow_pickle: bool = field(default=False, metadata={
        "help": "accept a teacher stored as pickled weights (pytorch_model.bin; can run code when loaded)"})
    bases: Path | None = field(default=None, metadata={
        "help": "teacher bases directory for core/confined/randcomp (default: the SVD of the teacher, "
                "costly at large widths; any orthonormal bases of the right shapes time the same)"})


class RandomRows(torch.utils.data.Dataset):
    def __init__(self, rows: int, seq_len: int, vocab: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (rows, seq_len), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "loss_mask": torch.ones(self.ids.shape[1], dtype=torch.bool)}


def load_bench_teacher(spec: Path, seed: int, allow_pickle: bool = False):
    """The teacher to time: a checkpoint, or random weights of a config's shape (seeded).

    Not frozen here: the student built on it (or KDObjective) freezes it (lrc.io.hf)."""
    spec = Path(spec)
    if spec.is_dir():
        return load_teacher(spec, allow_pickle=allow_pickle)
    if spec.suffix == ".json" and spec.is_file():
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(load_model_config(spec)).eval()
    raise LRCError(f"--teacher {spec}: neither a checkpoint directory nor a config .json file")


def _count_parametrisation_calls(model) -> list[int]:
    """Builds of a parametrised weight: whole (a forward) or one process's row block (``rows``, DDP)."""
    counter = [0]

    def count(*_):
        counter[0] += 1

    def counted(rows):
        return lambda *a: (count(), rows(*a))[1]

    for module in model.modules():
        if parametrize.is_parametrized(module):
            for plist in module.parametrizations.values():
                for p in plist:
                    p.register_forward_hook(count)
                    if hasattr(p, "rows"):
                        p.rows = counted(p.rows)
    return counter


def run_one(arm: str, args: BenchArgs, work: Path) -> dict:
    """One timed run of ``arm`` in this process (called in a fresh subprocess)."""
    torch.set_num_threads(args.threads)
    base_rss = reset_peak_rss()
    teacher = load_bench_teacher(args.teacher, args.seed, args.allow_pickle)
    recipe = RecipeArgs(recipe=args.recipe)
    if arm == BASELINE:
        torch.manual_seed(args.seed)
        student = type(teacher)(student_config(teacher.config, args.student_hidden))
        objective = KDObjective(teacher, student, temperature=recipe.temperature, kl_reduction=recipe.kl_reduction)
    else:
        name, _, impl = arm.partition(":")  # "core:parametrized": one arm, another core_impl
        student = build_student(teacher, args.student_hidden, seed=args.seed)
        bases = load_bases(args.bases) if args.bases is not None and name in BASIS_ARMS else None
        apply_arm(student, teacher, name, bases=bases, seed=args.seed, core_impl=impl or args.core_impl)
        objective = CloneObjective(teacher, student, recipe, recompute_teacher=args.recompute_teacher)
    calls = _count_parametrisation_calls(student)
    total_steps = args.steps + args.warmup_steps
    per_step = args.batch_size * args.micro_batches * args.processes  # sequences per step, over all processes
    data = RandomRows(per_step * total_steps, args.seq_len, teacher.config.vocab_size, args.seed)
    targs = TrainArgs(tokens=total_steps * per_step * args.seq_len, batch_size=per_step,
                      micro_batch_size=args.batch_size, lr=1e-4, warmup=0.0, log_every=1, threads=args.threads,
                      precision=args.precision, seed=args.seed, progress=False, ckpt_dir=work / "ckpt",
                      activation_checkpointing=args.activation_checkpointing, recompute_teacher=args.recompute_teacher,
                      weight_build=args.weight_build, divide_weight_build=args.divide_weight_build)
    summary = train(objective, student, data, targs, work / "out")
    on_gpu = torch.device(summary["device"]).type == "cuda"
    records = [json.loads(line) for line in Path(summary["metrics"]).read_text().splitlines()]
    tokens_per_step = per_step * args.seq_len
    measured = records[args.warmup_steps:]
    times = [tokens_per_step / r["tokens_per_s"] for r in measured]
    return {
        "arm": arm,
        "step_times_s": times,
        "step_cpu_s": [r["cpu_s_per_step"] for r in measured],
        "optimizer_s": [r["optimizer_s_per_step"] for r in measured],
        "optimizer_cpu_s": [r["optimizer_cpu_s_per_step"] for r in measured],
        "step_cpu_max_s": [r["cpu_s_per_step_max"] for r in measured],  # the slowest process's
        "optimizer_cpu_max_s": [r["optimizer_cpu_s_per_step_max"] for r in measured],
        # GPU: CUDA max allocated (the models and the step only); CPU: peak RSS of the run.
        "peak_memory_mib": summary["peak_memory_mib"] if on_gpu else peak_rss_mib(),
        "base_memory_mib": 0.0 if on_gpu else base_rss,
        "trainable_params": sum(p.numel() for p in student.parameters() if p.requires_grad),
        "parametrisation_calls_per_step": calls[0] / total_steps,
        "weight_rows_share": summary.get("weight_rows_share") or 1.0,  # of the weights' rows, built here
        "optimizer_coordinate_maps": len(coordinate_maps(student)),
        # the basis changes this process runs per step (the rest run on the others)
        "basis_changes_this_process": summary.get("optimizer_coordinates", {}).get("this_process", 0),
        "device": summary["device"],
    }


def _worker(payload: str) -> None:
    spec = json.loads(payload)
    args = BenchArgs(**{k: (Path(v) if k in ("teacher", "out", "bases") and v is not None else v)
                        for k, v in spec["args"].items()})
    with tempfile.TemporaryDirectory(prefix="lrc-bench-") as work:
        result = run_one(spec["arm"], args, Path(work))
    if int(os.environ.get("RANK", "0")) == 0:  # (under torchrun: process 0 speaks for the run)
        print("LRC_BENCH_RESULT " + json.dumps(result), flush=True)
    if torch.distributed.is_initialized():  # as lrc.cli.end_process_group: no abort at exit
        torch.distributed.destroy_process_group()


def _spawn(arm: str, args: BenchArgs) -> dict:
    payload = json.dumps({"arm": arm,
                          "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()}})
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    launcher = [sys.executable]
    if args.processes > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(args.processes), "--master-port",
                     str(_free_port())]
        env |= {} if torch.cuda.is_available() else {"ACCELERATE_USE_CPU": "1"}  # accelerate: gloo on the CPU
    proc = subprocess.run(launcher + ["-m", "lrc.commands.bench", "_worker", payload], capture_output=True, text=True,
                          env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("LRC_BENCH_RESULT "):
            return json.loads(line.split(" ", 1)[1])
    raise LRCError(f"bench run of arm {arm!r} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def bench(args: BenchArgs) -> list[dict]:
    for arm in args.arms:
        name, _, impl = arm.partition(":")
        check_choice("arm", name, ARMS)
        if impl:
            check_choice(f"core_impl of {arm}", impl, CORE_IMPLS)
    for name in ("batch_size", "micro_batches", "seq_len", "steps", "repeats", "threads", "student_hidden",
                 "processes"):
        if getattr(args, name) < 1:
            raise LRCError(f"--{name.replace('_', '-')} must be >= 1")
    arms = [BASELINE] * args.baseline + [a for a in dict.fromkeys(args.arms) if a != BASELINE]
    if not arms:
        raise LRCError("--no-baseline needs at least one arm in --arms")
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    for rep in range(args.repeats):
        order = arms[rep % len(arms):] + arms[: rep % len(arms)]
        for arm in order:
            runs[arm].append(_spawn(arm, args))
            print(f"repeat {rep + 1}/{args.repeats} {arm}: median "
                  f"{1000 * statistics.median(runs[arm][-1]['step_times_s']):.1f} ms", file=sys.stderr)
    rows = []
    for arm in arms:
        def all_steps(key: str) -> list[float]:
            return [t for r in runs[arm] for t in r[key]]

        times, cpu = all_steps("step_times_s"), all_steps("step_cpu_s")
        peak = max(r["peak_memory_mib"] for r in runs[arm])
        above = max(r["peak_memory_mib"] - r["base_memory_mib"] for r in runs[arm])
        rows.append({
            "arm": arm,
            "step_time_ms": 1000 * statistics.median(times),
            "step_time_iqr_ms": 1000 * (_quantile(times, 0.75) - _quantile(times, 0.25)),
            "step_cpu_ms": 1000 * statistics.median(cpu),
            "optimizer_ms": 1000 * statistics.median(all_steps("optimizer_s")),
            "optimizer_cpu_ms": 1000 * statistics.median(all_steps("optimizer_cpu_s")),
            "step_cpu_max_ms": 1000 * statistics.median(all_steps("step_cpu_max_s")),
            "optimizer_cpu_max_ms": 1000 * statistics.median(all_steps("optimizer_cpu_max_s")),
            "tokens_per_s": (args.batch_size * args.micro_batches * args.processes * args.seq_len
                             / statistics.median(times)),
            "peak_memory_mib": peak,
            "step_memory_mib": above,
            "trainable_params": runs[arm][0]["trainable_params"],
            "parametrisation_calls_per_step": runs[arm][0]["parametrisation_calls_per_step"],
            "weight_rows_share": runs[arm][0]["weight_rows_share"],
            "optimizer_coordinate_maps": runs[arm][0]["optimizer_coordinate_maps"],
            "basis_changes_per_process": runs[arm][0]["basis_changes_this_process"],
            "measured_steps": len(times),
        })
    nan = float("nan")
    base = rows[0] if args.baseline else {"step_time_ms": nan, "step_cpu_ms": nan, "step_memory_mib": nan}
    for row in rows:
        row["time_ratio_to_kd"] = row["step_time_ms"] / base["step_time_ms"]
        row["cpu_ratio_to_kd"] = row["step_cpu_ms"] / base["step_cpu_ms"]
        row["memory_ratio_to_kd"] = (row["step_memory_mib"] / base["step_memory_mib"] if base["step_memory_mib"] > 0
                                     else nan)
    return rows


def describe(args: BenchArgs, device: str) -> dict:
    teacher = load_bench_teacher(args.teacher, args.seed, args.allow_pickle)
    c = teacher.config
    return {"teacher_hidden": c.hidden_size, "d_ff": c.intermediate_size, "layers": c.num_hidden_layers,
            "vocab": c.vocab_size, "student_hidden": args.student_hidden, "batch_size": args.batch_size,
            "micro_batches": args.micro_batches, "seq_len": args.seq_len, "processes": args.processes,
            "core_impl": args.core_impl, "weight_build": args.weight_build,
            "divide_weight_build": args.divide_weight_build,
            "activation_checkpointing": args.activation_checkpointing, "recompute_teacher": args.recompute_teacher,
            "threads": args.threads, "device": device, "recipe": args.recipe}


def write_csv(rows: list[dict], context: dict, path: Path) -> None:
    fields = list(rows[0]) + list(context)
    with atomic_file(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in (row | context).items()})


def format_table(rows: list[dict]) -> str:
    head = (f"{'arm':<20}{'step ms':>10}{'IQR ms':>9}{'x kd':>7}{'cpu ms':>9}{'x kd':>7}"
            f"{'opt ms':>9}{'opt cpu':>9}{'opt max':>9}{'peak MiB':>10}{'step MiB':>10}{'x kd':>7}"
            f"{'trainable':>12}{'p-calls':>9}{'o-maps (own)':>14}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['arm']:<20}{r['step_time_ms']:>10.1f}{r['step_time_iqr_ms']:>9.1f}{r['time_ratio_to_kd']:>7.2f}"
                     f"{r['step_cpu_ms']:>9.1f}{r['cpu_ratio_to_kd']:>7.2f}"
                     f"{r['optimizer_ms']:>9.1f}{r['optimizer_cpu_ms']:>9.1f}{r['optimizer_cpu_max_ms']:>9.1f}"
                     f"{r['peak_memory_mib']:>10.0f}{r['step_memory_mib']:>10.0f}{r['memory_ratio_to_kd']:>7.2f}"
                     f"{r['trainable_params']:>12,}{r['parametrisation_calls_per_step']:>9.0f}"
                     f"{str(r['optimizer_coordinate_maps']) + ' (' + str(r['basis_changes_per_process']) + ')':>14}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(BenchArgs, argv, prog="lrc bench")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    context = describe(args, device)
    rows = bench(args)
    write_csv(rows, context, args.out)
    # The output is a file: its provenance goes next to it, as FILE.settings.json.
    record = provenance("bench", args) | {"table": rows, "context": context}
    side = Path(str(args.out) + ".settings.json")
    write_json_atomic(side, to_jsonable(record))
    print(format_table(rows))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "_worker":
        _worker(sys.argv[2])
    else:
        raise SystemExit(main())
