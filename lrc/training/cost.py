"""What one training step costs in floating-point operations, counted on the traced step.

The step of :mod:`lrc.training.memory` (the real ``build_student``, ``apply_arm``, objective,
optimiser and ``train_step``, on fake tensors: no memory, seconds at any width) runs under
PyTorch's ``FlopCounterMode``, which counts the matrix products and attention of every op that
runs: the teacher's forward, the student's forward and backward, the loss, the optimiser step.
Elementwise ops count nothing there; at LLM widths the products are nearly all of a step.

The split the planner reports:

* ``weight_side``: building the student's weights from their factors (``W = T·A``, ``E_t·Pᵀ``,
  core's complement path, ...) and differentiating those products. It does not depend on the
  tokens: every parametrised weight is built once per step (``build_once``, the default with
  gradient accumulation outside FSDP2, :mod:`lrc.training.weight_build`; whole on every process: the
  division between DDP processes, opt-in, is not counted) or in every forward of every
  micro-batch (and its layer's once more in the backward under activation checkpointing). Counted by
  building each parametrised weight once and back-propagating a gradient through it, times the builds
  (built once per step, a tied head reads the embedding's product: counted once).
* ``optimizer``: the optimiser step (core's basis change when it runs there).
* ``token_work``: the rest, what a plain student of the deployed shape would also do.
"""

from __future__ import annotations

import math

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils import parametrize
from torch.utils.flop_counter import FlopCounterMode

from lrc.training.loop import train_step
from lrc.training.memory import StepSpec, _batches, _prepared
from lrc.training.weight_build import StepWeights


def _parametrised(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if parametrize.is_parametrized(m, "weight")]


def _count(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _counting(method, into: list[int]):
    def counted(*args, **kwargs):
        with FlopCounterMode(display=False) as inner:
            result = method(*args, **kwargs)
        into.append(inner.get_total_flops())
        return result

    return counted


def step_flops(spec: StepSpec) -> dict:
    """FLOPs of one optimiser step of ``spec`` on one process (all its micro-batches), split into
    token work, weight-side work and the optimiser step (see the module doc)."""
    with FakeTensorMode():
        _, student, objective, run = _prepared(spec)
        trainable = [p for p in student.parameters() if p.requires_grad]
        batches = _batches(spec, spec.teacher_config.vocab_size)
        train_step(run, objective, batches, trainable)  # the first step creates the optimiser's states
        optimizer_flops: list[int] = []
        # The optimiser's own work: its step, and core's clipping in coordinates (a map of the gradients).
        for owner, name in ((run.optimizer, "step"), (run.optimizer, "clip_grad_norm_")):
            if hasattr(owner, name):
                setattr(owner, name, _counting(getattr(owner, name), optimizer_flops))
        total = _count(lambda: train_step(run, objective, batches, trainable))
        for name in ("step", "clip_grad_norm_"):
            vars(run.optimizer).pop(name, None)  # the class's methods again
        modules = _parametrised(student)
        weights: list[torch.Tensor] = []
        if spec.build_once:  # as the step builds them: a tied head reads the embedding's product
            build = _count(lambda: weights.extend(StepWeights(student).built))
        else:
            build = _count(lambda: weights.extend(m.weight for _, m in modules))
        rebuilt = _count(lambda: [m.weight for name, m in modules if ".layers." in name])
        differentiate = _count(lambda: torch.autograd.backward(
            [w for w in weights if w.requires_grad], [torch.ones_like(w) for w in weights if w.requires_grad]))
        objective.close()
    per_forward = build + differentiate + (rebuilt if spec.activation_checkpointing else 0)
    weight_side = (1 if spec.build_once else spec.micro_batches) * per_forward if modules else 0
    optimizer = sum(optimizer_flops)
    return {"total": total, "token_work": total - weight_side - optimizer, "weight_side": weight_side,
            "optimizer": optimizer, "tokens": spec.micro_batches * spec.micro_batch_size * spec.seq_len}


# Dense tensor-core peaks, TFLOP/s, from NVIDIA's datasheets (SXM boards, without sparsity): bf16 for
# mixed-precision runs, TF32 for fp32 ones (what PyTorch's matmuls use with TF32 allowed).
GPU_PEAK_TFLOPS = {"h100": {"bf16": 989.4, "fp32": 494.7}, "h200": {"bf16": 989.4, "fp32": 494.7},
                   "h800": {"bf16": 989.4, "fp32": 494.7}, "a100": {"bf16": 312.0, "fp32": 156.0}}


def gpu_cost(flops: dict, *, gpu: str, precision: str, mfu: float, gpus: int, tokens: int | None) -> dict:
    """Step time, tokens/s per GPU and GPU-hours for ``tokens`` from one GPU's counted step: its FLOPs
    run at ``mfu`` of the GPU's peak (the same share for every arm: the counted FLOPs already hold
    LRC's extra products)."""
    step_s = flops["total"] / (GPU_PEAK_TFLOPS[gpu][precision] * 1e12 * mfu)
    out = {"step_s": step_s, "tokens_per_s_per_gpu": flops["tokens"] / step_s}
    if tokens:
        steps = math.ceil(tokens / (flops["tokens"] * gpus))
        out |= {"steps": steps, "gpu_hours": steps * step_s * gpus / 3600}
    return out
