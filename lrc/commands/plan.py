"""`lrc plan`: the peak memory per GPU of a distillation run, and the largest micro-batch that fits.

For a workflow config (``--workflow-config config/paper/llama3.2-3b.yaml``: teacher, r, micro-batch,
sequence length, precision, GPUs and DDP/FSDP of its `distill` stage) or explicit options,
each arm's training step is traced at full size with fake tensors (:mod:`lrc.training.memory`: the
real ``build_student``, ``apply_arm``, ``CloneObjective``, ``lrc.training.loop.train_step`` and
AdamW under PyTorch's MemTracker; seconds per arm, no GPU, no memory) and the peak is shown
with its breakdown. ``--memory-gib`` (default 80) is the card: the largest micro-batch whose
traced peak fits it (less ``--reserve-gib``) is found by tracing (the peak is affine in the
micro-batch: two traces give the line, a third checks the answer).

DDP holds per GPU what one process holds, plus its all-reduce buckets: every gradient, for
the whole run (the gradients are views into them, ``gradient_as_bucket_view``), so the
gradients count in full even where the one-process trace has none alive; with
``--shard-optimizer`` the optimiser states are rank 0's share (:mod:`lrc.training.optim`).
FSDP is *estimated* from the same trace, not traced: student
weights, gradients and optimiser states divided by the number of GPUs, plus one gathered
group (the largest of a decoder layer's or the embedding's trainable tensors, and its
gradient); the teacher (whose weights the student reads, never copied) and core's basis buffers stay replicated
(:mod:`lrc.training.sharding`). The numbers are allocated memory (what ``torch.cuda.max_memory_allocated``
reports); the CUDA context and allocator fragmentation come on top (``--reserve-gib``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Sequence

import yaml

from lrc.errors import LRCError
from lrc.io.atomic import write_json_atomic
from lrc.io.hf import load_model_config
from lrc.method.reach import CORE_IMPLS
from lrc.names import ARMS, MAIN_ARMS, teacher_config_places
from lrc.options import check_choice, parse_args
from lrc.training.cost import GPU_PEAK_TFLOPS, gpu_cost, step_flops
from lrc.training.memory import CATEGORIES, StepSpec, trace_step
from lrc.training.weight_build import builds_once

GIB = 2**30


@dataclass(kw_only=True)
class PlanArgs:
    """Peak memory per GPU of each arm's training step (traced with fake tensors), and the largest
    micro-batch that fits."""

    workflow_config: Path | None = field(default=None, metadata={
        "help": "workflow config YAML (e.g. config/paper/llama3.2-3b.yaml): its distill settings are the defaults"})
    experiment: str | None = field(default=None, metadata={
        "help": "experiment of --workflow-config (default: its only one)"})
    teacher_config: Path | None = field(default=None, metadata={
        "help": "teacher config JSON (default with --workflow-config: config/teachers/<experiment>.json)"})
    student_hidden: int | None = field(default=None, metadata={"help": "student hidden size r"})
    arms: list[str] | None = field(default=None, metadata={
        "help": f"arms to plan, any of {', '.join(ARMS)} (default: the config's distill.arms, else "
                f"{' '.join(MAIN_ARMS)})"})
    micro_batch_size: int | None = field(default=None, metadata={"help": "sequences per forward on one GPU"})
    micro_batches: int | None = field(default=None, metadata={
        "help": "forwards per optimiser step on one GPU (gradient accumulation: the gradients live "
                "from the second on; default: the config's batch_size / (micro_batch_size x GPUs), else 1)"})
    seq_len: int | None = field(default=None, metadata={"help": "tokens per sequence"})
    precision: Literal["fp32", "bf16"] | None = field(default=None, metadata={
        "help": "fp32, or bf16 mixed precision (default: the config's; auto = bf16, as on a GPU)"})
    gpus: int | None = field(default=None, metadata={
        "help": "GPUs of the run (default: the config's resources.distill.gpu, else 1)"})
    sharding: Literal["ddp", "fsdp"] | None = field(default=None, metadata={
        "help": "ddp or fsdp (default: fsdp when the config's accelerate file is an FSDP one)"})
    memory_gib: float = field(default=80.0, metadata={"help": "memory of one GPU, GiB"})
    reserve_gib: float = field(default=0.0, metadata={
        "help": "GiB of it kept free (CUDA context, NCCL, fragmentation)"})
    search: bool = field(default=True, metadata={"help": "find the largest micro-batch that fits --memory-gib"})
    max_micro_batch: int = field(default=64, metadata={"help": "upper bound of the micro-batch search"})
    recipe: Literal["lrc", "kl"] = field(default="lrc", metadata={"help": "loss recipe"})
    core_impl: Literal["optimizer", "parametrized"] = field(default="optimizer", metadata={
        "help": "core/randcomp: where the basis change runs (as lrc distill)"})
    shard_optimizer: bool | None = field(default=None, metadata={
        "help": "DDP: AdamW's states divided between the GPUs, as lrc distill --shard-optimizer (default: the config's "
                "distill setting, else off)"})
    activation_checkpointing: bool | None = field(default=None, metadata={
        "help": "trace with each student decoder layer checkpointed, as lrc distill --activation-checkpointing "
                "(default: the config's distill setting, else off)"})
    recompute_teacher: bool | None = field(default=None, metadata={
        "help": "with checkpointing: the teacher's layers rerun inside the student's, as lrc distill "
                "--recompute-teacher (default: the config's distill setting, else off)"})
    weight_build: Literal["auto", "step", "micro_batch"] = field(default="auto", metadata={
        "help": "the student's weights built once per optimiser step or per micro-batch, as lrc distill "
                "--weight-build"})
    layers: int = field(default=0, metadata={"help": "trace a teacher with this many decoder layers (0: the config's)"})
    cost: bool = field(default=True, metadata={
        "help": "count each arm's FLOPs per step on the traced step (token work, weight-side, optimiser) and give "
                "the step time, tokens/s per GPU and GPU-hours at --mfu of --gpu's peak"})
    gpu: Literal["h100", "h200", "h800", "a100"] = field(default="h100", metadata={
        "help": "the GPU whose dense bf16 (fp32 runs: TF32) tensor-core peak sets the time"})
    mfu: float = field(default=0.4, metadata={
        "help": "share of that peak the counted FLOPs run at (the public LRC trainer: about 0.22 on H800s)"})
    tokens: int | None = field(default=None, metadata={
        "help": "tokens of one run, for its GPU-hours (default: the config's largest distill.tokens)"})
    out: Path | None = field(default=None, metadata={"help": "also write the plan as JSON here", "output": "file"})


@dataclass
class Setting:
    """What one plan is for, resolved from the options and the config."""

    teacher_config: Path
    student_hidden: int
    micro_batch_size: int
    seq_len: int
    precision: str
    gpus: int
    sharding: str
    activation_checkpointing: bool = False
    recompute_teacher: bool = False
    shard_optimizer: bool = False
    micro_batches: int = 1
    build_once: bool = False  # the student's weights built once per optimiser step (lrc.training.weight_build)
    arms: tuple[str, ...] = MAIN_ARMS
    tokens: int | None = None  # one run's budget (the config's largest distill.tokens)
    arm_tokens: int | None = None  # an arm's over the config's runs
    warmstart_tokens: int | None = None


def _experiment(args: PlanArgs) -> tuple[str, dict]:
    try:
        data = yaml.safe_load(args.workflow_config.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise LRCError(f"--workflow-config {args.workflow_config}: cannot read it ({err})") from err
    experiments = data.get("experiments") if isinstance(data, dict) else None
    if not isinstance(experiments, dict) or not experiments:
        raise LRCError(f"--workflow-config {args.workflow_config}: no `experiments:` mapping")
    name = args.experiment
    if name is None:
        if len(experiments) != 1:
            raise LRCError(f"--workflow-config {args.workflow_config} has experiments {', '.join(experiments)}: "
                           "choose one with --experiment")
        name = next(iter(experiments))
    if name not in experiments:
        raise LRCError(f"--experiment {name!r} is not in {args.workflow_config}; it has {', '.join(experiments)}")
    return name, experiments[name] or {}


def _dig(mapping: dict, *keys):
    for key in keys:
        if not isinstance(mapping, dict):
            return None
        mapping = mapping.get(key)
    return mapping


def _from_config(args: PlanArgs) -> dict:
    """The plan's settings that the workflow config states (missing ones are None)."""
    if args.workflow_config is None:
        return {}
    name, exp = _experiment(args)
    train = _dig(exp, "distill", "train") or {}
    teacher = next((p for p in teacher_config_places(name, exp.get("teacher") or {}) if p.is_file()), None)
    precision = train.get("precision")
    accelerate = str(_dig(exp, "resources", "distill", "accelerate") or "")
    return {
        "teacher_config": teacher,
        "student_hidden": _dig(exp, "student", "hidden_size"),
        "micro_batch_size": train.get("micro_batch_size"),
        "batch_size": train.get("batch_size"),
        "seq_len": _dig(exp, "data", "corpus", "seq_len"),
        "precision": "bf16" if precision == "auto" else precision,
        "gpus": _dig(exp, "resources", "distill", "gpu"),
        "sharding": "fsdp" if "fsdp" in Path(accelerate).name else None,
        "activation_checkpointing": train.get("activation_checkpointing"),
        "recompute_teacher": train.get("recompute_teacher"),
        "shard_optimizer": train.get("shard_optimizer"),
        "arms": _dig(exp, "distill", "arms"),
        **_budgets(exp),
    }


def _budgets(exp: dict) -> dict:
    """The config's token budgets: one run's (its largest), each arm's over its runs (budgets x seeds x
    recipes) and the warm start's."""
    budgets = _dig(exp, "distill", "tokens")
    budgets = [b for b in budgets if isinstance(b, int)] if isinstance(budgets, list) else []
    runs = len(_dig(exp, "distill", "seeds") or [0]) * len(_dig(exp, "distill", "recipes") or ["lrc"])
    return {"tokens": max(budgets, default=None), "arm_tokens": sum(budgets) * runs or None,
            "warmstart_tokens": _dig(exp, "warmstart", "tokens")}


def resolve(args: PlanArgs) -> Setting:
    """Options first, then the config, then defaults; a missing or bad value names its option."""
    known = _from_config(args)
    defaults = {"precision": "bf16", "gpus": 1, "sharding": "ddp", "activation_checkpointing": False,
                "shard_optimizer": False, "recompute_teacher": False}
    values = {}
    for name in ("teacher_config", "student_hidden", "micro_batch_size", "seq_len", "precision", "gpus", "sharding",
                 "activation_checkpointing", "shard_optimizer", "recompute_teacher"):
        value = getattr(args, name)
        value = known.get(name) if value is None else value
        value = defaults.get(name) if value is None else value
        if value is None:
            raise LRCError(f"--{name.replace('_', '-')} is needed (give it, or a --workflow-config that states it)")
        values[name] = value
    micro_batches, batch = args.micro_batches, known.get("batch_size")
    if micro_batches is None:  # the config's sequences per step at this micro-batch and GPUs, else 1
        fits = isinstance(batch, int) and all(isinstance(values[k], int) and values[k] > 0
                                              for k in ("micro_batch_size", "gpus"))
        micro_batches = max(1, batch // (values["micro_batch_size"] * values["gpus"])) if fits else 1
    values["micro_batches"] = micro_batches
    for name in ("tokens", "arm_tokens", "warmstart_tokens"):
        values[name] = known.get(name) if isinstance(known.get(name), int) else None
    values["arms"] = tuple(args.arms or known.get("arms") or MAIN_ARMS)
    for arm in values["arms"]:
        check_choice("--arms", arm, ARMS)
    for name in ("student_hidden", "micro_batch_size", "seq_len", "gpus", "micro_batches"):
        if not isinstance(values[name], int) or values[name] < 1:
            raise LRCError(f"--{name.replace('_', '-')} must be a positive integer, got {values[name]!r}")
    check_choice("--precision", values["precision"], ("fp32", "bf16"))
    check_choice("--sharding", values["sharding"], ("ddp", "fsdp"))
    values["build_once"] = builds_once(args.weight_build, micro_batches, values["sharding"] == "fsdp")
    for name in ("activation_checkpointing", "shard_optimizer", "recompute_teacher"):
        if not isinstance(values[name], bool):
            raise LRCError(f"--{name.replace('_', '-')} is true or false, got {values[name]!r}")
    if values["shard_optimizer"] and values["sharding"] == "fsdp":
        raise LRCError("--shard-optimizer is for DDP; FSDP2 shards the optimiser states itself (--sharding fsdp)")
    values["teacher_config"] = Path(values["teacher_config"])
    if not values["teacher_config"].is_file():
        raise LRCError(f"--teacher-config {values['teacher_config']}: no such file")
    return Setting(**values)


def check_args(args: PlanArgs) -> None:
    for arm in args.arms or ():
        check_choice("--arms", arm, ARMS)
    check_choice("--core-impl", args.core_impl, CORE_IMPLS)
    if not args.memory_gib > 0:
        raise LRCError(f"--memory-gib must be positive, got {args.memory_gib}")
    if not 0 <= args.reserve_gib < args.memory_gib:
        raise LRCError(f"--reserve-gib must be in [0, --memory-gib), got {args.reserve_gib}")
    if args.layers < 0 or args.max_micro_batch < 1:
        raise LRCError("--layers must be >= 0 and --max-micro-batch >= 1")
    check_choice("--gpu", args.gpu, GPU_PEAK_TFLOPS)
    if not 0 < args.mfu <= 1:
        raise LRCError(f"--mfu is a share of the GPU's peak, in (0, 1], got {args.mfu}")
    if args.tokens is not None and args.tokens < 1:
        raise LRCError(f"--tokens must be positive, got {args.tokens}")


def per_gpu(trace: dict, setting: Setting) -> dict:
    """The traced one-process breakdown as one GPU of the run holds it (see the module doc)."""
    parts = dict(trace["parts"])
    if setting.sharding == "ddp" and setting.gpus > 1:
        # DDP's all-reduce buckets hold every gradient (fp32, as the weights) for the whole run:
        # the gradients are views into them, and the buckets stay where the one-process trace
        # has none alive (set_to_none), as at the end of the loss.
        parts["gradients"] = max(parts["gradients"], parts["student_weights"])
    if setting.sharding == "fsdp" and setting.gpus > 1:
        gathered = trace["largest_group_bytes"]
        alive = {name: parts[name] > 0 for name in ("student_weights", "gradients")}
        for name in ("student_weights", "gradients", "optimizer"):
            parts[name] = parts[name] // setting.gpus
        for name in alive:  # a gathered gradient only where gradients are alive at the peak
            parts[name] += gathered if alive[name] else 0
    return {"peak": sum(parts.values()), "parts": parts}


class Planner:
    """Traces of one (teacher, arm) setting, memoised by micro-batch."""

    def __init__(self, args: PlanArgs, setting: Setting, arm: str):
        self.args, self.setting, self.arm = args, setting, arm
        self.cfg = load_model_config(setting.teacher_config)
        if args.layers:
            self.cfg.num_hidden_layers = args.layers
        self._memo: dict[int, dict] = {}

    def spec(self, micro_batch: int) -> StepSpec:
        return StepSpec(teacher_config=self.cfg, student_hidden=self.setting.student_hidden, arm=self.arm,
                        micro_batch_size=micro_batch, seq_len=self.setting.seq_len,
                        micro_batches=self.setting.micro_batches, precision=self.setting.precision,
                        recipe=self.args.recipe, core_impl=self.args.core_impl,
                        activation_checkpointing=self.setting.activation_checkpointing,
                        recompute_teacher=self.setting.recompute_teacher, shard_optimizer=self.setting.shard_optimizer,
                        processes=self.setting.gpus if self.setting.sharding == "ddp" else 1,
                        build_once=self.setting.build_once)

    def at(self, micro_batch: int) -> dict:
        if micro_batch not in self._memo:
            self._memo[micro_batch] = per_gpu(trace_step(self.spec(micro_batch)), self.setting)
        return self._memo[micro_batch]

    def cost(self) -> dict:
        """FLOPs of one GPU's step at the run's micro-batch, and what they take on --gpu at --mfu."""
        flops = step_flops(self.spec(self.setting.micro_batch_size))
        tokens = self.args.tokens or self.setting.tokens
        return {"flops": flops} | gpu_cost(flops, gpu=self.args.gpu, precision=self.setting.precision,
                                           mfu=self.args.mfu, gpus=self.setting.gpus, tokens=tokens)

    def fits(self, micro_batch: int) -> bool:
        return self.at(micro_batch)["peak"] <= (self.args.memory_gib - self.args.reserve_gib) * GIB

    def largest_fitting(self) -> int:
        """The largest micro-batch in [1, --max-micro-batch] that fits (0: not even 1).

        Two traces give the line peak(m); the micro-batch it names is traced. When that
        trace lies on the line (within 0.5 %), the line's answer for the next one is taken
        (the peak is affine in the micro-batch); otherwise the neighbours are traced."""
        top = self.args.max_micro_batch
        a = max(2, self.setting.micro_batch_size)
        b = a - 1
        slope = self.at(a)["peak"] - self.at(b)["peak"]
        budget = (self.args.memory_gib - self.args.reserve_gib) * GIB
        line = lambda m: self.at(b)["peak"] + slope * (m - b)  # noqa: E731
        m = max(1, min(top, b + int((budget - self.at(b)["peak"]) // slope))) if slope > 0 else top
        while m > 1 and not self.fits(m):
            m -= 1
        if not self.fits(m):
            return 0
        on_line = abs(self.at(m)["peak"] - line(m)) <= 0.005 * self.at(m)["peak"]
        while m < top and (line(m + 1) <= budget if on_line and m + 1 not in self._memo else self.fits(m + 1)):
            m += 1
        return m


def plan(args: PlanArgs) -> dict:
    check_args(args)
    setting = resolve(args)
    rows = []
    for arm in setting.arms:
        planner = Planner(args, setting, arm)
        row = {"arm": arm, "micro_batch_size": setting.micro_batch_size} | planner.at(setting.micro_batch_size)
        row["fits"] = planner.fits(setting.micro_batch_size)
        if args.search:
            row["largest_micro_batch"] = planner.largest_fitting()
        if args.cost:
            row["cost"] = planner.cost()
        rows.append(row)
    cost = {"gpu": args.gpu, "mfu": args.mfu, "workflow_gpu_hours": _workflow_hours(rows, setting)} if args.cost else {}
    return {"setting": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(setting).items()}
                       | {"layers": args.layers or None},
            "memory_gib": args.memory_gib, "reserve_gib": args.reserve_gib, "rows": rows} | cost


def _workflow_hours(rows: list[dict], setting: Setting) -> float | None:
    """GPU-hours of the config's distillation: each planned arm over its runs, and the warm start at
    slice's cost per token (it trains the slice student)."""
    if not setting.arm_tokens:
        return None
    per_token = {r["arm"]: r["cost"]["step_s"] / 3600 / r["cost"]["flops"]["tokens"] for r in rows}
    hours = sum(rate * setting.arm_tokens for rate in per_token.values())
    return hours + per_token.get("slice", 0.0) * (setting.warmstart_tokens or 0)


def format_table(result: dict) -> str:
    """The plan as a markdown table, GiB."""
    names = ["student weights", "teacher + frozen", "gradients", "optimizer", "activations", "loss workspace",
             "backward temp"]
    head = ("| arm | micro-batch | peak GiB | " + " | ".join(names)
            + f" | fits {result['memory_gib']:g} GiB | largest micro-batch |")
    lines = [head, "|" + "---|" * (len(names) + 5)]
    for r in result["rows"]:
        parts = [f"{r['parts'][c] / GIB:.1f}" for c in CATEGORIES[: len(names)]]
        largest = r.get("largest_micro_batch", "")
        lines.append(f"| {r['arm']} | {r['micro_batch_size']} | {r['peak'] / GIB:.1f} | " + " | ".join(parts)
                     + f" | {'yes' if r['fits'] else 'no'} | {largest} |")
    return "\n".join(lines)


def format_cost(result: dict) -> str:
    """Each arm's FLOPs per GPU and step, and the time they take, as a markdown table."""
    head = (f"| arm | TFLOP per GPU-step | token work | weight-side | optimizer | step s ({result['gpu']}, "
            f"MFU {result['mfu']:g}) | tokens/s per GPU | GPU-hours |")
    lines = [head, "|" + "---|" * 8]
    for r in result["rows"]:
        c, f = r["cost"], r["cost"]["flops"]
        share = lambda k: f"{f[k] / f['total']:.0%}"  # noqa: E731
        hours = f"{c['gpu_hours']:,.0f}" if "gpu_hours" in c else "-"
        lines.append(f"| {r['arm']} | {f['total'] / 1e12:,.1f} | {share('token_work')} | {share('weight_side')} | "
                     f"{share('optimizer')} | {c['step_s']:.2f} | {c['tokens_per_s_per_gpu']:,.0f} | {hours} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(PlanArgs, argv, prog="lrc plan")
    result = plan(args)
    s = result["setting"]
    print(f"teacher {s['teacher_config']}, r {s['student_hidden']}, seq {s['seq_len']}, {s['precision']}, "
          f"{s['gpus']} GPU(s) {s['sharding']}" + (", optimiser states sharded" if s["shard_optimizer"] else "")
          + (f", {s['micro_batches']} micro-batches per step" if s["micro_batches"] > 1 else "")
          + (", weights built once per step" if s["build_once"] else "")
          + (", activation checkpointing" if s["activation_checkpointing"] else "")
          + (" with the teacher recomputed" if s["recompute_teacher"] else "")
          + (f", {s['layers']} layers traced" if s["layers"] else ""))
    print(format_table(result))
    if args.cost:
        print(format_cost(result))
        if result["workflow_gpu_hours"]:
            print(f"the config's distillation (the planned arms over its seeds, budgets and recipes, and the warm "
                  f"start): {result['workflow_gpu_hours']:,.0f} GPU-hours")
    if args.out is not None:
        write_json_atomic(args.out, json.loads(json.dumps(result)))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
