"""The memory of one real LRC training step, traced with fake tensors (no memory, no GPU).

:func:`trace_step` builds the teacher (random weights of a config's shape), the student
(:func:`lrc.method.student.build_student`, :func:`lrc.method.reach.apply_arm`), the objective
(:class:`lrc.method.clone.CloneObjective`) and the optimiser (``lrc.training.loop.optimizer_and_schedule``'s AdamW or
CoordinateAdamW) under ``torch._subclasses.fake_tensor.FakeTensorMode``, and runs
:func:`lrc.training.loop.train_step` twice under PyTorch's ``MemTracker``
(``torch.distributed._tools.mem_tracker``): the second step has AdamW's states alive, as
every step of a run after the first. The peak and its breakdown are the tracker's: it
follows every tensor storage, tagged as parameter, buffer, gradient, activation, backward
temporary or optimiser state. One split is added here (:class:`_StepTracker`): activations
made while no module of teacher or student is running (the loss code: logit copies, CE, KL,
clone terms, the captured teacher activations' copies) are the *loss workspace*. Whatever
the step's code does, the trace follows it; nothing here knows where LRC's memory goes.

What differs from a GPU run, and why:

* Fake tensors live on the CPU here (a CPU build of torch makes no fake CUDA tensors), so
  bf16 runs under CPU autocast; its cast lists are close to, not identical with, CUDA's.
  The teacher is cast to bf16 as :func:`lrc.training.loop.place_teacher` does on a GPU.
* The accelerator is a stand-in (:class:`_TraceAccelerator`: autocast, backward, gradient
  clipping, as accelerate does them for one process), so no process group is needed. DDP
  (``gradient_as_bucket_view=True``: the gradients *are* the all-reduce buckets) holds the
  same per-GPU memory as this one process.
* What the tracker counts is allocated tensor memory (``torch.cuda.max_memory_allocated``'s
  measure); the CUDA context, NCCL buffers and allocator fragmentation come on top.
* The models are built with a ``.to()`` that replaces tensors instead of swapping them
  (:func:`_fake_safe`): ``nn.Module.to`` swaps fake parameters in place, which fails for
  the ones the fake-tensor converter holds weakly; on real tensors the two are the same.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType
from transformers import AutoModelForCausalLM

from lrc.io.hf import cast_weights
from lrc.method.clone import CloneObjective, RecipeArgs
from lrc.method.reach import BASIS_ARMS, apply_arm
from lrc.method.spectral import TeacherBases
from lrc.method.student import build_student
from lrc.names import MLP_KINDS
from lrc.training import recompute
from lrc.training.args import TrainArgs
from lrc.training.loop import (
    Run,
    optimizer_and_schedule,  # the loop's own AdamW / CoordinateAdamW and schedule
    train_step,
)

CATEGORIES = ("student_weights", "teacher", "gradients", "optimizer", "activations", "loss_workspace", "backward_temp",
              "other")


@dataclass(kw_only=True)
class StepSpec:
    """One training step to trace: the teacher's config and the run's settings."""

    teacher_config: object  # a transformers PretrainedConfig
    student_hidden: int
    arm: str = "slice"
    micro_batch_size: int = 1
    seq_len: int = 2048
    micro_batches: int = 1  # forwards per optimiser step (accumulation: the gradients live from the second on)
    precision: str = "fp32"  # fp32 | bf16 (mixed precision: fp32 master weights, autocast)
    recipe: str = "lrc"
    core_impl: str = "optimizer"
    # each student decoder layer checkpointed (lrc.training.recompute), as the loop does
    activation_checkpointing: bool = False
    recompute_teacher: bool = False  # ... with the teacher's layers rerun inside the student's (lrc.method.clone)
    steps: int = 2
    processes: int = 1  # DDP processes: core's basis changes (and bases) are divided between them
    shard_optimizer: bool = False  # ... and, with it, AdamW's states (ZeRO stage 1, lrc.training.optim)
    build_once: bool = False  # the parametrised weights built once per step (lrc.training.weight_build)


def _module_to(self, *args, **kwargs):
    """``nn.Module.to`` that replaces each tensor (ties and ``requires_grad`` kept)."""
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    memo: dict[int, torch.Tensor] = {}

    def convert(t: torch.Tensor, param: bool) -> torch.Tensor:
        if id(t) not in memo:
            new = t.to(device=device, dtype=dtype if t.is_floating_point() else None)
            memo[id(t)] = t if new is t else (nn.Parameter(new, requires_grad=t.requires_grad) if param else new)
        return memo[id(t)]

    for module in self.modules():
        for key, p in module._parameters.items():
            if p is not None:
                module._parameters[key] = convert(p, True)
        for key, b in module._buffers.items():
            if b is not None:
                module._buffers[key] = convert(b, False)
    return self


def _fake_safe(model: nn.Module) -> nn.Module:
    """``model`` as an instance of a subclass of its class with :func:`_module_to` as ``.to``
    (the student, built as ``type(teacher)(config)``, inherits it)."""
    cls = type(model)
    model.__class__ = type(cls.__name__, (cls,), {"to": _module_to})
    return model


def _shape_bases(cfg) -> TeacherBases:
    """Orthonormal teacher bases of the right shapes (the first columns of the identity):
    any bases time and weigh the same, and these cost no SVD."""
    H, F = cfg.hidden_size, cfg.intermediate_size
    keys = [f"{i}.{k}" for i in range(cfg.num_hidden_layers) for k in MLP_KINDS]
    columns = torch.eye(F)[:, :H]
    return TeacherBases(U={k: columns.clone() for k in keys}, S={k: torch.ones(H) for k in keys},
                        embed_V=torch.eye(H), embed_S=torch.ones(H), source="identity bases")


class _TraceAccelerator:
    """What :func:`lrc.training.loop.train_step` asks of accelerate, for one process."""

    device = torch.device("cpu")
    num_processes, process_index = 1, 0

    def __init__(self, precision: str):
        self.precision = precision

    def no_sync(self, _model):
        return contextlib.nullcontext()

    def autocast(self):
        if self.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()

    def clip_grad_norm_(self, params, max_norm):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def unscale_gradients(self):  # (no loss scaling in a trace)
        pass


class _StepTracker(MemTracker):
    """MemTracker that also counts, live and at the peak, the activations made outside
    every module's forward (the loss workspace)."""

    def __init__(self) -> None:
        super().__init__()
        self._loss_winfos: set[int] = set()
        self.loss_live = 0
        self.loss_at_peak = 0

    def _track(self, reftype, t: torch.Tensor) -> None:
        outside = reftype == _MemRefType.ACT and set(self._mod_tracker.parents) <= {"Global"}
        new = [st for st in get_untyped_storages(t) if st not in self._WINFO] if outside else []
        super()._track(reftype, t)
        for st in new:
            winfo = self._WINFO[st][0]
            self._loss_winfos.add(id(winfo))
            self.loss_live += winfo.mem_consumed

    def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True) -> tuple[int, int]:
        # The tracker hooks every parameter's gradient, and a frozen one (the teacher's)
        # refuses a hook: hook the trainable ones only.
        memory = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
        if install_grad_hooks:
            def grad_hook(grad):
                self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

            for p in module.parameters():
                if p.requires_grad and self._param_to_grad_hook_handles.get(p, None) is None:
                    self._param_to_grad_hook_handles[p] = (
                        p.register_hook(grad_hook), p.register_post_accumulate_grad_hook(lambda q: grad_hook(q.grad)))
        return memory

    # A module called inside the optimiser step (core's coordinate map) leaves backward hooks
    # behind that fire in the next step, after its stats were reset: nothing to record.
    def _pre_bw_hook(self, module, args) -> None:
        if module is not None and module in self.memory_tracking:
            super()._pre_bw_hook(module, args)

    def _post_bw_hook(self, module, args) -> None:
        if module is not None and module in self.memory_tracking:
            super()._post_bw_hook(module, args)

    def _delete_callback(self, winfo, w_st) -> None:
        if id(winfo) in self._loss_winfos:
            self._loss_winfos.discard(id(winfo))
            self.loss_live -= winfo.mem_consumed
        super()._delete_callback(winfo, w_st)

    def _update_peak_stats(self, peak_state) -> None:
        # The global peak only: the base class also updates every module's local peak at
        # every operation, which makes a 28-layer trace quadratic (minutes instead of seconds).
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                self._peak_mem[dev] = snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(snap)
                self.loss_at_peak = self.loss_live


def _storage_bytes(tensors) -> int:
    storages = {}  # id -> storage, kept alive so that no id is reused while counting
    for t in tensors:
        for st in get_untyped_storages(t):
            storages[id(st)] = st
    return sum(st.nbytes() for st in storages.values())


def _build(spec: StepSpec):
    cfg = spec.teacher_config
    # fp32, as `lrc distill` loads it (lrc.io.hf.load_teacher); bf16 runs cast it when placed.
    teacher = _fake_safe(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)).eval()
    bases = _shape_bases(cfg) if spec.arm in BASIS_ARMS else None
    student = build_student(teacher, spec.student_hidden)
    apply_arm(student, teacher, spec.arm, bases=bases, core_impl=spec.core_impl)
    objective = CloneObjective(teacher, student, RecipeArgs(recipe=spec.recipe),
                               recompute_teacher=spec.recompute_teacher)
    if spec.activation_checkpointing:
        recompute.enable(student)  # what lrc.training.loop.setup does; train_step opens recompute.micro_batch
    if spec.precision == "bf16":
        cast_weights(teacher, torch.bfloat16)  # lrc.training.loop.place_teacher's cast on a GPU
    return teacher, student, objective


def _batches(spec: StepSpec, vocab: int):
    ids = torch.randint(0, vocab, (spec.micro_batch_size, spec.seq_len))
    return itertools.repeat({"input_ids": ids, "loss_mask": torch.ones_like(ids, dtype=torch.bool)})


def _prepared(spec: StepSpec):
    """Models, objective and a :class:`lrc.training.loop.Run` for ``spec`` (fake or real tensors,
    whichever mode is active)."""
    teacher, student, objective = _build(spec)
    targs = TrainArgs(batch_size=spec.micro_batch_size * spec.micro_batches, micro_batch_size=spec.micro_batch_size,
                      precision=spec.precision, warmup=0.0, progress=False,
                      activation_checkpointing=spec.activation_checkpointing, recompute_teacher=spec.recompute_teacher,
                      shard_optimizer=spec.shard_optimizer)
    student.train()
    optimizer, scheduler = optimizer_and_schedule(student, targs, spec.steps)
    if spec.processes > 1 and hasattr(optimizer, "plan_share"):
        # rank 0's share of core's bases and, sharded, of the states (lrc.training.optim)
        optimizer.plan_share(spec.processes)
    run = Run(args=targs, accelerator=_TraceAccelerator(spec.precision), wrapped=student, bare=student,
              optimizer=optimizer, scheduler=scheduler, fsdp=False, mixed="bf16" if spec.precision == "bf16" else "no",
              steps=spec.steps, accum=spec.micro_batches, seq_len=spec.seq_len, n_rows=1, ckpt_dir=Path("."),
              fingerprint={}, build_once=spec.build_once)
    return teacher, student, objective, run


def trace_step(spec: StepSpec) -> dict:
    """Peak bytes of one steady-state training step and its breakdown (:data:`CATEGORIES`)."""
    with FakeTensorMode():
        teacher, student, objective, run = _prepared(spec)
        trainable = [p for p in student.parameters() if p.requires_grad]
        batches = _batches(spec, spec.teacher_config.vocab_size)
        tracker = _StepTracker()
        tracker.track_external(teacher, student, run.optimizer)
        if spec.micro_batches > 1:  # MemTracker follows one call of a module between resets; its peak is kept
            loss = objective.loss

            def loss_of_one_micro_batch(*args, **kwargs):
                tracker.reset_mod_stats()
                return loss(*args, **kwargs)

            objective.loss = loss_of_one_micro_batch
        with tracker:
            for _ in range(spec.steps):
                train_step(run, objective, batches, trainable)
                tracker.reset_mod_stats()  # the next step calls the same root modules again
        objective.close()
        peak = tracker.get_tracker_snapshot("peak").get(run.device, {})
        result = _breakdown(peak, tracker.loss_at_peak, _storage_bytes(trainable), trainable)
        # What FSDP gathers at once: one decoder layer's trainable tensors (or the embedding).
        groups = [student.model.layers[0], student.model.embed_tokens, student.lm_head]
        result["largest_group_bytes"] = max(_storage_bytes(p for p in g.parameters() if p.requires_grad)
                                            for g in groups)
        return result


def measure_step_rss(spec: StepSpec) -> dict:
    """The same steps on real tensors, measured: the process's peak resident memory above
    what it held before the models were built (Linux: the kernel's high-water mark, reset
    first). Meant for a fresh process (``python -m lrc.training.memory SPEC.json``)."""
    
    torch.manual_seed(0)
    base = reset_peak_rss()
    teacher, student, objective, run = _prepared(spec)
    trainable = [p for p in student.parameters() if p.requires_grad]
    batches = _batches(spec, spec.teacher_config.vocab_size)
    for _ in range(spec.steps):
        train_step(run, objective, batches, trainable)
    objective.close()
    return {"peak": int((peak_rss_mib() - base) * 2**20), "base_mib": base}


def _breakdown(peak: dict, loss_bytes: int, student_bytes: int, trainable) -> dict:
    get = lambda ref: int(peak.get(ref, 0))  # noqa: E731
    weights = get(_MemRefType.PARAM) + get(_MemRefType.BUFFER)
    parts = {
        "student_weights": student_bytes,
        "teacher": weights - student_bytes,
        "gradients": get(_MemRefType.GRAD),
        "optimizer": get(_MemRefType.OPT),
        "activations": get(_MemRefType.ACT) - loss_bytes,
        "loss_workspace": loss_bytes,
        "backward_temp": get(_MemRefType.TEMP),
        "other": get(_MemRefType.OTH),
    }
    return {"peak": int(peak.get("Total", 0)), "parts": parts, "trainable_params": sum(p.numel() for p in trainable)}


def _measure_main(spec_file: str) -> None:
    """``python -m lrc.training.memory SPEC.json``: print the measured peak of the spec's steps as JSON
    (SPEC.json: StepSpec's fields, ``teacher_config`` a config JSON path)."""
    from lrc.io.hf import load_model_config

    values = json.loads(Path(spec_file).read_text())
    values["teacher_config"] = load_model_config(Path(values["teacher_config"]))
    print(json.dumps(measure_step_rss(StepSpec(**values))))


def proc_status_mib(key: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def reset_peak_rss() -> float:
    """Reset the kernel's peak-RSS mark (Linux) and return the current RSS in MiB.

    Without it the peak would include the transient memory of the imports. Elsewhere the
    process's lifetime max RSS is used, which only overstates the baseline.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    now = proc_status_mib("VmRSS")
    return now if now is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_rss_mib() -> float:
    peak = proc_status_mib("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    _measure_main(sys.argv[1])
