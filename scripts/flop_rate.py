"""Does `lrc plan`'s FLOP count predict the step time? The counted FLOPs of each arm's step
(lrc.training.cost, fake tensors) against the step time `lrc bench` measures for the same step on
this CPU (fp32, one thread, median of its repeats). If the count is right, every arm runs at about
the same FLOP rate; the planner's GPU times assume exactly that.

    python scripts/flop_rate.py --out flop-rate.md     # H 1024, 2 layers, r 512: about 3 min

Writes a markdown table: per arm the counted GFLOP per step (token work, weight-side, optimiser),
the measured step time, the rate and its ratio to the arms' mean.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from transformers import LlamaConfig

from lrc.training.cost import step_flops
from lrc.training.memory import StepSpec


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
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--arms", nargs="+", default=["slice", "dense", "core"])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    sizes = dict(hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers, num_attention_heads=16,
                 num_key_value_heads=8, vocab_size=a.vocab, tie_word_embeddings=True, max_position_embeddings=a.seq)
    with tempfile.TemporaryDirectory() as tmp:
        teacher = Path(tmp) / "teacher.json"
        teacher.write_text(json.dumps({"model_type": "llama", **sizes}))
        bench = Path(tmp) / "bench.csv"
        cmd = [sys.executable, "-m", "lrc.cli", "bench", "--teacher", str(teacher), "--student-hidden", str(a.r),
               "--arms", *a.arms, "--no-baseline", "--batch-size", str(a.batch), "--micro-batches",
               str(a.micro_batches), "--seq-len", str(a.seq), "--steps", "3", "--warmup-steps", "1",
               "--repeats", str(a.repeats), "--threads", "1", "--precision", "fp32", "--out", str(bench)]
        subprocess.run(cmd, check=True)
        measured = {row["arm"]: float(row["step_time_ms"]) / 1000 for row in csv.DictReader(bench.open())}
    config = LlamaConfig(**sizes)
    rows = []
    for arm in a.arms:
        flops = step_flops(StepSpec(teacher_config=config, student_hidden=a.r, arm=arm, micro_batch_size=a.batch,
                                    seq_len=a.seq, micro_batches=a.micro_batches, precision="fp32"))
        rows.append((arm, flops, measured[arm], flops["total"] / measured[arm]))
    mean = statistics.mean(rate for *_, rate in rows)
    lines = [f"H {a.hidden}, d_ff {a.ffn}, {a.layers} layers, vocabulary {a.vocab}, r {a.r}; {a.micro_batches} "
             f"micro-batches of {a.batch} x {a.seq} tokens; fp32, one thread, median of {a.repeats} runs", "",
             "| arm | GFLOP per step | token work | weight-side | optimizer | measured step s | GFLOP/s | x mean |",
             "|---|---|---|---|---|---|---|---|"]
    for arm, f, seconds, rate in rows:
        g = {k: f[k] / 1e9 for k in ("total", "token_work", "weight_side", "optimizer")}
        lines.append(f"| {arm} | {g['total']:.1f} | {g['token_work']:.1f} | {g['weight_side']:.1f} | "
                     f"{g['optimizer']:.1f} | {seconds:.3f} | {rate / 1e9:.1f} | {rate / mean:.3f} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
