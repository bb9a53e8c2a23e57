"""Where an LRC step's time goes, next to plain KD's: torch.profiler over `lrc bench`'s own runs.

Each arm (kd first) runs in this process as `lrc bench` runs it (`lrc.commands.bench.run_one`: the
real student, objective and training loop); the loop's `train_step` is wrapped so that the steps
after the warm-up run under the profiler. Every op's self CPU time (one thread, so the parts add up
to the step) is put into one of a few kinds, and the table gives milliseconds per step per kind and
each arm's difference to kd.

    python scripts/step_profile.py --out step-profile.md     # H 1024, 2 layers, r 512: about 4 min
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import lrc.training.loop as loop
from lrc.commands.bench import BenchArgs, run_one

KINDS = {  # op name -> kind: the first kind one of whose fragments the name contains
    "matrix products": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::dot"),
    "attention": ("scaled_dot_product", "flash_attention"),
    "Householder (ormqr)": ("ormqr", "geqrf", "householder"),
    "copies and fills": ("copy_", "clone", "contiguous", "_to_copy", "cat", "stack", "fill_", "zero_", "index",
                         "gather", "scatter", "embedding", "empty", "resize"),
}
OTHER = "elementwise, reductions, other"


OPTIMISER = "optimiser step"


def kind_of(event) -> str:
    """An op inside the optimiser's step (PyTorch labels it ``Optimizer.step#...``) counts as the
    optimiser's, whatever it is; any other by its name."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("Optimizer.step"):
            return OPTIMISER
        parent = parent.cpu_parent
    return next((kind for kind, parts in KINDS.items() if any(p in event.name for p in parts)), OTHER)


def profiled(arm: str, args: BenchArgs) -> dict[str, float]:
    """Milliseconds of self CPU time per measured step, by kind, for one run of ``arm``."""
    totals: dict[str, float] = defaultdict(float)
    calls = [0]
    plain = loop.train_step

    def step(*a, **k):
        calls[0] += 1
        if calls[0] <= args.warmup_steps:
            return plain(*a, **k)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            result = plain(*a, **k)
        for event in prof.events():
            totals[kind_of(event)] += event.self_cpu_time_total / 1e3
        return result

    loop.train_step = step
    try:
        with tempfile.TemporaryDirectory() as work:
            run_one(arm, args, Path(work))
    finally:
        loop.train_step = plain
    return {kind: ms / args.steps for kind, ms in totals.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2816)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--r", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2, help="sequences per micro-batch")
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=2, help="profiled steps per arm (after one warm-up step)")
    ap.add_argument("--arms", nargs="+", default=["kd", "slice", "dense", "core"])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    sizes = dict(model_type="llama", hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                 num_attention_heads=16, num_key_value_heads=8, vocab_size=a.vocab, tie_word_embeddings=True,
                 max_position_embeddings=a.seq)
    with tempfile.TemporaryDirectory() as tmp:
        teacher = Path(tmp) / "teacher.json"
        teacher.write_text(json.dumps(sizes))
        args = BenchArgs(teacher=teacher, student_hidden=a.r, out=Path(tmp) / "unused.csv", batch_size=a.batch,
                         micro_batches=a.micro_batches, seq_len=a.seq, steps=a.steps, warmup_steps=1, threads=1,
                         precision="fp32")
        rows = {}
        for arm in a.arms:
            rows[arm] = profiled(arm, args)
            print(f"{arm}: {sum(rows[arm].values()):.0f} ms per step", flush=True)
    kinds = [*KINDS, OTHER, OPTIMISER]
    base = rows.get("kd")
    lines = [f"H {a.hidden}, d_ff {a.ffn}, {a.layers} layers, vocabulary {a.vocab}, r {a.r}; {a.micro_batches} "
             f"micro-batches of {a.batch} x {a.seq} tokens; fp32, one thread; self CPU ms per step, mean of "
             f"{a.steps} profiled steps" + ("; in brackets: minus kd's" if base else ""), "",
             "| arm | " + " | ".join(kinds) + " | step |", "|---|" + "---|" * (len(kinds) + 1)]
    for arm, parts in rows.items():
        cells = [parts.get(k, 0.0) for k in kinds] + [sum(parts.values())]
        if base and arm != "kd":
            ref = [base.get(k, 0.0) for k in kinds] + [sum(base.values())]
            lines.append(f"| {arm} | " + " | ".join(f"{c:,.0f} ({c - r:+,.0f})" for c, r in zip(cells, ref)) + " |")
        else:
            lines.append(f"| {arm} | " + " | ".join(f"{c:,.0f}" for c in cells) + " |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
