"""The body of scripts/gpu-check (run by it, inside the venv it made): time every arm and plain
KD at Llama-3.2-3B widths, the CUDA `lrc svd`, a merge round trip; write a CSV and a table.

Everything goes through the package's commands (`lrc bench`, `lrc svd`, `lrc warmstart`,
`lrc distill`, `lrc merge`), each a subprocess, so what is measured is what a run does.
A time budget (``--budget-s``) is kept: a stage that the time left cannot hold (estimated from
the stages already run) is skipped and its row says so. The stages every check needs (the
2-layer bench and its plan, the svd, the round trip) are never skipped; past the budget each
still gets 120 s before it is killed, so a slow machine cannot turn them into budget skips.

Peak memory vs the planner: each arm's bench row carries `lrc plan`'s traced peak for the same
step (teacher config, r, micro-batch and micro-batches per step, sequence, precision, one GPU) and
the measured peak over it.
Measured is the bench's memory above what the process held before loading the models: on a GPU
CUDA's max allocated (what the planner predicts); on the CPU the rise of the peak RSS, which
carries the allocator's and the libraries' overhead, so the dry mode's ratio says only that the
columns are filled. Plain KD has no plan (the planner plans distillation arms).

MFU: model FLOPs per trained token = 6 · (student matmul parameters) + 2 · (teacher matmul
parameters) (forward+backward of the student, forward of the teacher; attention's
sequence-quadratic term and the clone losses left out), times tokens/s, over the GPU's dense
bf16 peak (H100/H200 989 TFLOP/s, A100 312; `GPU_PEAK_TFLOPS` overrides). None on the CPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ARMS = ["slice", "dense", "core", "confined", "randcomp"]
# Llama-3.2-3B (meta-llama/Llama-3.2-3B config.json) and the paper's student width r = 1536.
LLAMA_3B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 3072,
            "intermediate_size": 8192, "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 4096,
            "tie_word_embeddings": True, "hidden_act": "silu"}
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 192,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256, "tie_word_embeddings": True, "hidden_act": "silu"}
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def matmul_params(cfg: dict, hidden: int) -> int:
    """Weights in matmuls per token of a model of ``cfg``'s shape at width ``hidden`` (head included)."""
    H, d_ff, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return L * (hidden * (2 * q + 2 * kv) + 3 * hidden * d_ff) + cfg["vocab_size"] * hidden


def peak_flops(device: str) -> float | None:
    if os.environ.get("GPU_PEAK_TFLOPS"):
        return float(os.environ["GPU_PEAK_TFLOPS"]) * 1e12
    if device != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(0)
    return next((v * 1e12 for k, v in PEAK_TFLOPS.items() if k in name), None)


class Check:
    def __init__(self, args):
        self.args, self.t0, self.rows = args, time.monotonic(), []
        self.out = Path(args.out)
        self.work = Path(args.work) if args.work else self.out / "work"
        self.out.mkdir(parents=True, exist_ok=True)
        self.env = os.environ | {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        self.durations: dict[str, float] = {}

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def lrc(self, name: str, *argv: str, estimate: float = 0.0, timeout: float | None = None) -> float | None:
        """Run ``lrc argv...``; its wall time, or None if skipped for the budget or failed (row written)."""
        if estimate and estimate > self.left():
            self.rows.append({"stage": name, "status": f"skipped: needs ~{estimate:.0f} s, {self.left():.0f} s left"})
            print(f"[gpu-check] skip {name}: needs ~{estimate:.0f} s, {self.left():.0f} s left", flush=True)
            return None
        write_csv(self)
        print(f"[gpu-check] {name}: lrc {' '.join(argv)}", flush=True)
        t = time.monotonic()
        log = self.out / f"{name}.log"
        limit = max(10.0 if estimate else 120.0, timeout or self.left())  # (estimate 0: a stage every check needs)
        with open(log, "w") as fh:  # own session: a stage over the budget is killed with its workers
            proc = subprocess.Popen([sys.executable, "-m", "lrc.cli", *argv], stdout=fh, stderr=subprocess.STDOUT,
                                    env=self.env, start_new_session=True)
            try:
                proc.wait(limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self.rows.append({"stage": name, "status": f"skipped: killed at the budget ({limit:.0f} s)"})
                print(f"[gpu-check] {name}: killed at the budget ({limit:.0f} s)", flush=True)
                return None
        wall = time.monotonic() - t
        self.durations[name] = wall
        if proc.returncode != 0:
            self.rows.append({"stage": name, "status": f"failed (exit {proc.returncode}, see {log.name})",
                              "wall_s": round(wall, 1)})
            print(f"[gpu-check] {name} FAILED; last lines of {log}:\n" + "\n".join(log.read_text().splitlines()[-15:]),
                  flush=True)
            return None
        return wall


def write_config(path: Path, base: dict, layers: int) -> dict:
    cfg = base | {"num_hidden_layers": layers}
    path.write_text(json.dumps(cfg))
    return cfg


def bench_rows(check: Check, cfg: dict, cfg_path: Path, layers: int, arms: list[str], tag: str, estimate: float,
               bases: Path | None = None) -> None:
    """`lrc bench` of kd and ``arms`` on the random teacher of ``cfg_path``; ``bases``: its `lrc svd`
    (else each basis arm's process computes the SVDs on the CPU, minutes at these widths)."""
    a = check.args
    csv_path = check.out / f"bench-{tag}.csv"
    wall = check.lrc(f"bench-{tag}", "bench", "--teacher", str(cfg_path), "--student-hidden", str(a.student_hidden),
                     "--out", str(csv_path), *(["--bases", str(bases)] if bases else []),
                     "--arms", *arms, "--batch-size", str(a.batch_size), "--micro-batches", str(a.micro_batches),
                     "--seq-len", str(a.seq_len), "--steps", str(a.steps), "--warmup-steps", str(a.warmup_steps),
                     "--repeats", "1", "--threads", str(a.threads), "--precision", a.precision, estimate=estimate)
    if wall is None:
        return
    planned = plan_peaks(check, cfg_path, cfg, [arm for arm in arms if arm != "kd"], tag, required=layers == 2)
    flops_per_token = 6 * matmul_params(cfg, a.student_hidden) + 2 * matmul_params(cfg, cfg["hidden_size"])
    peak = peak_flops(a.device)
    with open(csv_path) as fh:
        for r in csv.DictReader(fh):
            if any(row.get("stage") == "bench" and row.get("layers") == layers and row.get("arm") == r["arm"]
                   for row in check.rows):
                continue  # kd again in a second call
            tps, measured, plan = float(r["tokens_per_s"]), float(r["step_memory_mib"]), planned.get(r["arm"])
            check.rows.append({"stage": "bench", "status": "ok", "layers": layers, "arm": r["arm"],
                               "step_time_ms": float(r["step_time_ms"]), "optimizer_ms": float(r["optimizer_ms"]),
                               "tokens_per_s": round(tps, 1), "peak_memory_mib": float(r["peak_memory_mib"]),
                               "step_memory_mib": measured, "planned_peak_mib": round(plan, 1) if plan else None,
                               "peak_vs_plan": round(measured / plan, 3) if plan else None,
                               "mfu": round(flops_per_token * tps / peak, 4) if peak else None,
                               "time_ratio_to_kd": float(r["time_ratio_to_kd"]), "wall_s": round(wall, 1)})


def plan_peaks(check: Check, cfg_path: Path, cfg: dict, arms: list[str], tag: str, required: bool) -> dict[str, float]:
    """`lrc plan`'s traced peak (MiB) of each arm's step as the bench ran it; {} if skipped or failed."""
    a = check.args
    if not arms:
        return {}
    out = check.out / f"plan-{tag}.json"
    # The 2-layer plan (of every arm) is never skipped; a plan's time per arm grows about as
    # layers / 4 from it (on one CPU core at these widths: 2 layers 22 s for 5 arms, 28 layers 62 s for 2).
    per_arm_2l = check.durations.get("plan-2l", 20.0) / len(a.arms)
    estimate = 0.0 if required else per_arm_2l * len(arms) * cfg["num_hidden_layers"] / 4
    wall = check.lrc(f"plan-{tag}", "plan", "--teacher-config", str(cfg_path),
                     "--student-hidden", str(a.student_hidden), "--arms", *arms,
                     "--micro-batch-size", str(a.batch_size), "--micro-batches", str(a.micro_batches),
                     "--seq-len", str(a.seq_len), "--precision", a.precision, "--gpus", "1", "--no-search",
                     "--out", str(out), estimate=estimate)
    if wall is None:
        return {}
    return {r["arm"]: r["peak"] / 2**20 for r in json.loads(out.read_text())["rows"]}


def teacher_and_bases(check: Check, cfg: dict, cfg_path: Path) -> Path | None:
    """The random teacher of ``cfg_path`` saved (the weights `lrc bench` makes from the config:
    seed 0), random token rows, and the teacher's CUDA `lrc svd`; the bases' directory, or None."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from lrc.io.hf import load_model_config
    from lrc.io.tokens import write_tokens

    a, work = check.args, check.work
    torch.manual_seed(0)  # as lrc.commands.bench.load_bench_teacher: the bases fit the bench's teacher
    AutoModelForCausalLM.from_config(load_model_config(cfg_path)).save_pretrained(work / "teacher")
    rows = np.random.default_rng(0).integers(0, cfg["vocab_size"], size=(4 * a.batch_size, a.seq_len))
    write_tokens(work / "data" / "train", rows, source="random")
    dev = ["--device", "cuda"] if a.device == "cuda" else []
    wall = check.lrc("svd", "svd", "--teacher", str(work / "teacher"), "--out", str(work / "bases"), *dev)
    if wall is None:
        return None
    check.rows.append({"stage": "svd", "status": "ok", "layers": cfg["num_hidden_layers"], "wall_s": round(wall, 1)})
    return work / "bases"


def round_trip(check: Check, cfg: dict, bases: Path) -> None:
    """The saved teacher -> warm start (0 tokens) -> core, 2 steps -> merge (verified)."""
    a, work = check.args, check.work
    teacher, data = work / "teacher", work / "data"
    common = ["--teacher", str(teacher), "--data", str(data), "--batch-size", str(a.batch_size),
              "--micro-batch-size", str(a.batch_size), "--threads", str(a.threads), "--no-progress",
              "--precision", a.precision]
    ok = check.lrc("warmstart", "warmstart", *common, "--student-hidden", str(a.student_hidden), "--tokens", "0",
                   "--out", str(work / "ws"))
    ok = ok is not None and check.lrc("distill-core", "distill", *common, "--warmstart", str(work / "ws"),
                                      "--bases", str(bases), "--arm", "core",
                                      "--tokens", str(2 * a.batch_size * a.seq_len),
                                      "--out", str(work / "core")) is not None
    if not ok:
        return
    wall = check.lrc("merge", "merge", "--state", str(work / "core"), "--teacher", str(teacher), "--bases", str(bases),
                     "--data", str(data / "train"), "--out", str(work / "merged"),
                     "--check-len", str(min(128, a.seq_len)))
    if wall is not None:
        m = json.loads((work / "merged" / "merge_check.json").read_text())
        check.rows.append({"stage": "merge", "status": "ok" if m["passed"] else "FAILED",
                           "layers": cfg["num_hidden_layers"], "max_abs_diff": m["max_abs_diff"],
                           "wall_s": round(wall, 1)})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--work",
                   help="scratch directory: the saved teacher, bases, states (GBs on a GPU; default OUT/work)")
    p.add_argument("--budget-s", type=float, default=420.0)
    p.add_argument("--arms", nargs="+", default=ARMS, choices=ARMS, help="arms to time (kd always)")
    args = p.parse_args()
    gpu = args.device == "cuda"
    if gpu:
        import torch

        if not torch.cuda.is_available():
            print("[gpu-check] --device cuda but torch sees no GPU", file=sys.stderr)
            return 2
    base = LLAMA_3B if gpu else TINY
    args.student_hidden = 1536 if gpu else 32
    args.seq_len, args.batch_size = (2048, 4) if gpu else (64, 2)
    args.steps, args.warmup_steps = (4, 2) if gpu else (2, 1)
    args.micro_batches = 4 if gpu else 2  # per optimiser step: core/dense's speed target is stated at 4
    args.threads = min(16, os.cpu_count() or 1) if gpu else 1
    args.precision = "bf16" if gpu else "fp32"
    full_layers = 28 if gpu else 4
    check = Check(args)

    cfg2 = write_config(check.out / "teacher-2l.json", base, 2)
    bases = teacher_and_bases(check, cfg2, check.out / "teacher-2l.json")
    bench_rows(check, cfg2, check.out / "teacher-2l.json", 2, args.arms, "2l", 0.0, bases)
    per_arm_2l = check.durations.get("bench-2l", 60.0) / (len(args.arms) + 1)
    if bases:
        round_trip(check, cfg2, bases)
    cfgf = write_config(check.out / f"teacher-{full_layers}l.json", base, full_layers)
    # All-layer estimate: a 2-layer run is mostly fixed cost (start, embedding, head); the
    # students are built on the CPU, and core/randcomp's QR and rotations grow with the layers.
    scale = 3.0
    # All layers: the cheap arms first (kd, slice, dense), then the basis arms if the time left holds them.
    cheap = [a for a in args.arms if a in ("slice", "dense")]
    basis = [a for a in args.arms if a not in cheap]
    for part, arms in (("a", cheap), ("b", basis)):
        if arms:
            bench_rows(check, cfgf, check.out / f"teacher-{full_layers}l.json", full_layers, arms,
                       f"{full_layers}l-{part}",
                       (len(arms) + 1) * per_arm_2l * scale * (4 if part == "b" and gpu else 1))
    write_report(check)
    failed = [r for r in check.rows if r.get("status", "").startswith(("failed", "FAILED"))]
    return 1 if failed else 0


def add_ratios_to_dense(rows: list[dict]) -> None:
    """Each bench row's step time over dense's at the same depth (core/dense: the basis change's cost)."""
    dense = {r["layers"]: r["step_time_ms"] for r in rows if r.get("stage") == "bench" and r["arm"] == "dense"}
    for r in rows:
        if r.get("stage") == "bench" and r["layers"] in dense:
            r["time_ratio_to_dense"] = round(r["step_time_ms"] / dense[r["layers"]], 4)


def write_csv(check: Check) -> Path:
    """OUT/gpu-check.csv of the rows so far (written before every stage too: a killed check keeps them)."""
    add_ratios_to_dense(check.rows)
    fields = ["stage", "status", "layers", "arm", "step_time_ms", "optimizer_ms", "tokens_per_s", "peak_memory_mib",
              "step_memory_mib", "planned_peak_mib", "peak_vs_plan", "mfu", "time_ratio_to_kd", "time_ratio_to_dense",
              "max_abs_diff", "wall_s"]
    path = check.out / "gpu-check.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in check.rows:
            w.writerow({k: r.get(k) for k in fields})
    return path


def write_report(check: Check) -> None:
    path = write_csv(check)
    print(f"\n{'stage':<10}{'layers':>7} "
          f"{'arm':<9}{'step ms':>10}{'opt ms':>9}{'tok/s':>10}{'peak MiB':>10}{'plan MiB':>10}{'x plan':>7}"
          f"{'MFU':>7}{'x kd':>6}{'x dense':>8}  status")
    for r in check.rows:
        num = lambda k, f: format(r[k], f) if r.get(k) is not None else "-"  # noqa: E731
        print(f"{r['stage']:<10}{num('layers', 'd'):>7} "
              f"{r.get('arm') or '-':<9}{num('step_time_ms', '.1f'):>10}{num('optimizer_ms', '.1f'):>9}"
              f"{num('tokens_per_s', '.0f'):>10}"
              f"{num('peak_memory_mib', '.0f'):>10}{num('planned_peak_mib', '.0f'):>10}{num('peak_vs_plan', '.2f'):>7}"
              f"{num('mfu', '.3f'):>7}"
              f"{num('time_ratio_to_kd', '.2f'):>6}{num('time_ratio_to_dense', '.3f'):>8}  {r.get('status')}"
              + (f" (max |diff| {r['max_abs_diff']:.2e})" if r.get("max_abs_diff") is not None else ""))
    print(f"wrote {path} ({time.monotonic() - check.t0:.0f} s)")


if __name__ == "__main__":
    raise SystemExit(main())
