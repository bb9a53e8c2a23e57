"""`lrc evaluate`: one model, one suite, one JSON.

The multiple-choice suite runs through lm-eval's Python API (``simple_evaluate`` on an
``HFLM`` wrapping the loaded model). The suites (:mod:`lrc.io.suites`): ``paper`` (the paper's
nine zero-shot tasks with the metric docs/method.md names for each; needs the hub for the
datasets), ``tiny`` (the tiny world's local tasks), ``local`` (any local lm-eval task
directory, e.g. the held-out tasks `lrc tasks` writes; offline), ``lm-eval`` (any task or group
lm-eval knows, its own or in ``--include-path`` directories, named with ``--tasks``) and ``none``
(no lm-eval run: the held-out measures only, offline, for any teacher). lm-eval's own results
and per-document logs are kept beside the summary (:mod:`lrc.io.lm_eval_records`). Besides the suite, cheap
continuous measures that move before accuracy does: perplexity on a held-out token directory,
forward KL(teacher || model) on the same rows, the mean log-probability lm-eval gave the right
answer, and (tiny suite) the KL to the
teacher at the position where the answer is predicted.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
import yaml

from lrc.errors import LRCError
from lrc.io.atomic import write_json_atomic
from lrc.io.hf import has_tokenizer, load_causal_lm, load_tokenizer
from lrc.io.lm_eval_records import records_dir, write_records
from lrc.io.lm_eval_tasks import open_suite, task_index
from lrc.io.provenance import library_versions, provenance
from lrc.io.suites import load_suite, selected_tasks
from lrc.io.tokens import TokenDataset, check_vocab, tokenizer_fingerprint
from lrc.method.losses import kl_per_position, next_token_nll
from lrc.options import check_replaceable, parse_args


@dataclass(kw_only=True)
class EvaluateArgs:
    """Evaluate a checkpoint on a suite (lm-eval) plus held-out perplexity, KL to teacher, answer log-prob."""

    model: str = field(metadata={"help": "HF checkpoint directory (safetensors) to evaluate", "positional": True})
    out: Path = field(metadata={"help": "evaluation JSON to write", "output": "file"})
    suite: Literal["tiny", "paper", "local", "lm-eval", "none"] = field(default="tiny", metadata={
        "help": "task suite: tiny, paper (lrc/io/suites/<suite>.yaml), local (the lm-eval tasks in --tasks-dir), "
                "lm-eval (any lm-eval task or group named in --tasks), none (held-out measures only)"})
    tasks_dir: Path | None = field(default=None, metadata={
        "help": "tiny suite: the world's tasks/ directory; local suite: a directory of lm-eval task YAMLs"})
    tasks: list[str] | None = field(default=None, metadata={
        "help": "evaluate only these tasks of the suite; suite lm-eval: the tasks or groups to run, each scored with "
                "the first metric lm-eval lists for it or the one named as task:metric"})
    include_path: list[Path] | None = field(default=None, metadata={
        "help": "suite lm-eval: directories of task YAMLs added to lm-eval's own tasks (lm-eval's --include_path)"})
    model_args: str | None = field(default=None, metadata={
        "help": "more arguments of lm-eval's HF model, in its key=value,key=value form (e.g. max_length=4096)"})
    lm_eval_out: Path | None = field(default=None, metadata={
        "help": "directory for lm-eval's own results.json and per-document samples (default: --out's name with "
                ".lm_eval for .json)", "output": "dir"})
    teacher: str | None = field(default=None, metadata={
        "help": "teacher checkpoint: KL on the held-out rows and at the answer position (tiny suite)"})
    heldout: Path | None = field(default=None, metadata={"help": "held-out token directory (perplexity, KL)"})
    heldout_rows: int = field(default=64, metadata={"help": "rows of --heldout to use"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer directory (default: the model's)"})
    batch_size: int = field(default=16, metadata={"help": "lm-eval and held-out batch size"})
    limit: float | None = field(default=None, metadata={
        "help": "lm-eval limit: documents per task (or a fraction if < 1)"})
    num_fewshot: int = field(default=0, metadata={"help": "few-shot examples (the paper: 0)"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:N, or auto"})
    threads: int | None = field(default=None, metadata={"help": "CPU threads for torch (default: torch's own choice)"})
    name: str | None = field(default=None, metadata={"help": "model name in the JSON (default: the directory name)"})

    def __post_init__(self) -> None:
        if self.suite == "tiny" and self.tasks_dir is None:
            raise LRCError("--suite tiny needs --tasks-dir (the world's tasks/ directory)")
        if self.batch_size < 1 or self.heldout_rows < 1:
            raise LRCError("--batch-size and --heldout-rows must be positive")
        if self.num_fewshot < 0:
            raise LRCError(f"--num-fewshot must be >= 0, got {self.num_fewshot}")
        if self.suite == "none" and self.tasks:
            raise LRCError(f"--suite none runs no task; --tasks {self.tasks} asks for some")
        if self.suite == "none" and self.heldout is None:
            raise LRCError("--suite none measures only held-out rows: give --heldout (a token directory)")
        if self.suite == "lm-eval" and not self.tasks:
            raise LRCError("--suite lm-eval runs the tasks you name: give --tasks (lm-eval task or group names)")
        if self.include_path and self.suite != "lm-eval":
            raise LRCError(f"--include-path adds tasks to lm-eval's own (--suite lm-eval), not to suite {self.suite!r}")
        if self.lm_eval_out is None:
            self.lm_eval_out = records_dir(self.out)
            check_replaceable(self.lm_eval_out, what="--lm-eval-out")


# ---------------------------------------------------------------------------------------
# The lm-eval call


def prepare_include_dir(tasks_dir: Path, names: Sequence[str], into: Path, files: dict[str, str] | None = None) -> Path:
    """Copy the task YAMLs (``files``: task -> file name, default ``<task>.yaml``) into ``into``
    with absolute data paths in ``tasks_dir``.

    lm-eval resolves relative ``data_files`` against the working directory, and the world
    may have moved since it was written; so the data file is re-pointed here, by name (or,
    for a file in a subdirectory, by its path relative to ``tasks_dir``).
    """
    tasks_dir = Path(tasks_dir).resolve()
    if not tasks_dir.is_dir():
        raise LRCError(f"--tasks-dir {tasks_dir} is not a directory")
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        src = tasks_dir / (files or {}).get(name, f"{name}.yaml")
        if not src.is_file():
            raise LRCError(f"--tasks-dir {tasks_dir} has no task file {src.name}")
        config = yaml.safe_load(src.read_text())
        data_files = config.get("dataset_kwargs", {}).get("data_files", {})
        for split, path in (data_files.items() if isinstance(data_files, dict) else ()):
            inside = [tasks_dir / Path(path).name] + ([] if Path(path).is_absolute() else [tasks_dir / path])
            found = [p for p in inside if p.is_file()]
            if not found:
                raise LRCError(f"task {name}: data file {tasks_dir / Path(path).name} not found")
            data_files[split] = str(found[0])
        (into / src.name).write_text(yaml.safe_dump(config, sort_keys=False))
    return into


def task_manager(args: EvaluateArgs, include_dir: Path | None) -> Any:
    """lm-eval's task index for this evaluation (:func:`lrc.io.lm_eval_tasks.task_index`)."""
    return task_index(args.include_path, only=include_dir)


def lm_eval_call(args: EvaluateArgs, tasks: dict[str, dict[str, Any]], manager: Any) -> dict[str, Any]:
    """The keyword arguments for ``lm_eval.simple_evaluate`` (all but the model)."""
    limit = args.limit
    if limit is not None and limit >= 1:
        limit = int(limit)
    return {
        "tasks": list(tasks),
        "num_fewshot": args.num_fewshot,
        "batch_size": args.batch_size,
        "limit": limit,
        "task_manager": manager,
        "log_samples": True,  # per-document log-likelihoods, for the answer log-prob
        "bootstrap_iters": 1000,
        "random_seed": 0,
        "numpy_random_seed": 1234,
        "torch_random_seed": 1234,
        "fewshot_random_seed": 1234,
    }


def check_tasks_known(manager: Any, tasks: dict[str, dict[str, Any]]) -> None:
    """Refuse, before any dataset is fetched, a task lm-eval does not know or a metric it
    does not compute for that task (a group's aggregate metric counts)."""
    for name, spec in tasks.items():
        entry = manager.task_index.get(name)
        if entry is None:
            raise LRCError(f"lm-eval has no task or group named {name!r}")
        cfg = entry.cfg or {}
        metrics = [m.get("metric") for m in (cfg.get("metric_list") or cfg.get("aggregate_metric_list") or [])]
        if spec["metric"] not in metrics:
            raise LRCError(f"lm-eval task {name!r} does not compute {spec['metric']!r} (it computes {metrics})")


def read_lm_eval_results(results: dict[str, Any], tasks: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pick each task's reported metric (and stderr) out of lm-eval's results."""
    out = {}
    for name, spec in tasks.items():
        row = results["results"].get(name)
        key = f"{spec['metric']},none"
        if row is None or key not in row:
            raise LRCError(f"lm-eval returned no {spec['metric']!r} for task {name!r} (got {sorted(row or {})})")
        stderr = row.get(f"{spec['metric']}_stderr,none")
        entry = {
            "metric": spec["metric"],
            "value": float(row[key]),
            "stderr": float(stderr) if isinstance(stderr, (int, float)) and math.isfinite(stderr) else None,
            "chance": spec["chance"],
        }
        for other in ("acc", "acc_norm"):
            if f"{other},none" in row:
                entry[other] = float(row[f"{other},none"])
        logprob = answer_logprob(results.get("samples", {}), name)
        if logprob is not None:
            entry["answer_logprob"] = logprob
        out[name] = entry
    return out


def answer_logprob(samples: dict[str, list[dict]], task: str) -> float | None:
    """Mean log-likelihood lm-eval gave the gold choice (groups: over their subtasks)."""
    names = [task] if task in samples else [t for t in samples if t.startswith(task + "_") or t.startswith(task + ".")]
    values = []
    for name in names:
        for s in samples.get(name, []):
            gold = s.get("target")
            resps = s.get("filtered_resps") or s.get("resps")
            if isinstance(gold, int) and resps and 0 <= gold < len(resps):
                ll = resps[gold]
                ll = ll[0] if isinstance(ll, (list, tuple)) else ll
                values.append(float(ll[0] if isinstance(ll, (list, tuple)) else ll))
    return sum(values) / len(values) if values else None


# ---------------------------------------------------------------------------------------
# Models and held-out measures


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_model(path: str, device: torch.device, *, role: str = "--model"):
    """A causal LM from a safetensors checkpoint, no remote code, fp32 on CPU."""
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    return load_causal_lm(path, dtype=dtype, role=role).to(device).eval()


@torch.no_grad()
def heldout_measures(model, rows: torch.Tensor, masks: torch.Tensor, *, teacher=None,
                     batch_size: int = 16) -> dict[str, Any]:
    """Perplexity of ``model`` on ``rows`` and, with a teacher, the mean per-token forward
    KL(p_teacher || p_model) at temperature 1 and the share of positions where both predict the
    same next token (top-1 agreement), over the positions the mask counts. ``heldout_rows`` keeps
    each row's sums (counted tokens, NLL, KL, agreements): `lrc compare` pairs two models on them."""
    per_row: dict[str, list[float]] = {"tokens": [], "nll": [], "kl_to_teacher": [], "top1_agreement": []}
    device = next(model.parameters()).device
    for start in range(0, rows.shape[0], batch_size):
        ids = rows[start:start + batch_size].to(device)
        counted = masks[start:start + batch_size, 1:].to(device)
        logits = model(ids).logits
        per_row["tokens"] += counted.sum(1).tolist()
        per_row["nll"] += (next_token_nll(logits, ids) * counted).sum(1).tolist()
        if teacher is not None:
            teacher_logits = teacher(ids).logits[:, :-1]
            per_row["kl_to_teacher"] += (kl_per_position(teacher_logits, logits[:, :-1]) * counted).sum(1).tolist()
            agree = teacher_logits.argmax(-1) == logits[:, :-1].argmax(-1)
            per_row["top1_agreement"] += (agree & counted).sum(1).tolist()
    count = sum(per_row["tokens"])
    if count == 0:
        raise LRCError("the held-out rows have no counted positions")
    out: dict[str, Any] = {"perplexity": math.exp(sum(per_row["nll"]) / count), "heldout_tokens": count}
    if teacher is not None:
        out["kl_to_teacher"] = sum(per_row["kl_to_teacher"]) / count
        out["top1_agreement"] = sum(per_row["top1_agreement"]) / count
    out["heldout_rows"] = {k: v for k, v in per_row.items() if v}
    return out


@torch.no_grad()
def answer_kl(model, teacher, tokenizer, contexts: Sequence[str], *, batch_size: int = 16) -> float:
    """Mean forward KL(p_teacher || p_model) of the next-token distribution right after each
    question's context, where the answer's first token is predicted (the tiny world's facts)."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    total = 0.0
    for start in range(0, len(contexts), batch_size):
        encoded = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in contexts[start:start + batch_size]]
        width = max(map(len, encoded))
        # Right padding: the causal mask keeps every real position independent of the pads.
        ids = torch.tensor([e + [pad] * (width - len(e)) for e in encoded], device=device)
        attention = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in encoded], device=device)
        last = torch.tensor([len(e) - 1 for e in encoded], device=device)
        rows = torch.arange(len(encoded), device=device)
        student_logits = model(ids, attention_mask=attention).logits[rows, last]
        teacher_logits = teacher(ids, attention_mask=attention).logits[rows, last]
        total += kl_per_position(teacher_logits, student_logits).sum().item()
    return total / len(contexts)


def task_contexts(include_dir: Path, names: Sequence[str], limit: float | None) -> list[str]:
    """The question contexts of the tiny suite's tasks (the first ``limit`` per task), unique."""
    contexts: dict[str, None] = {}
    for name in names:
        config = yaml.safe_load((include_dir / f"{name}.yaml").read_text())
        lines = Path(config["dataset_kwargs"]["data_files"]["test"]).read_text().splitlines()
        if limit is not None:
            lines = lines[: int(limit) if limit >= 1 else max(1, int(len(lines) * limit))]
        contexts.update({json.loads(line)["context"]: None for line in lines if line.strip()})
    return list(contexts)


def check_tokenizer(args: EvaluateArgs, tokenizer: Any) -> None:
    """Refuse a --tokenizer whose ids mean other tokens than those of the tokenizer saved with
    --model or --teacher (a same-size vocabulary would score garbage without an error)."""
    fingerprint = tokenizer_fingerprint(tokenizer)
    others = [("--model", args.model)] if args.tokenizer is not None else []
    others += [("--teacher", args.teacher)] if args.teacher is not None else []
    for role, directory in others:
        if not has_tokenizer(directory):
            continue
        own = tokenizer_fingerprint(load_tokenizer(directory))
        if own != fingerprint:
            raise LRCError(f"the tokenizer {args.tokenizer or args.model} (fingerprint {fingerprint}) is not "
                           f"the one saved with {role} {directory} (fingerprint {own}): the same ids would "
                           "mean other tokens; evaluate with the model's own tokenizer")


def heldout_rows(ds: TokenDataset, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    items = [ds[i] for i in range(min(n, len(ds)))]
    return torch.stack([i["input_ids"] for i in items]), torch.stack([i["loss_mask"] for i in items])


# ---------------------------------------------------------------------------------------
# The command


def hf_model_args(text: str | None) -> dict[str, Any]:
    """--model-args as lm-eval reads them (key=value pairs, comma-separated); the model, tokenizer,
    device, batch size and remote code stay this command's."""
    from lm_eval.utils import simple_parse_args_string

    values = simple_parse_args_string(text) if text else {}
    owned = sorted(set(values) & {"pretrained", "tokenizer", "device", "batch_size", "trust_remote_code"})
    if owned:
        raise LRCError(f"--model-args {text!r}: {', '.join(owned)} are set by lrc evaluate's own options")
    return values


def run_suite(args: EvaluateArgs, suite: dict[str, Any], tasks: dict[str, dict[str, Any]], model, tokenizer,
              device: torch.device, manager: Any = None
              ) -> tuple[dict[str, dict[str, Any]], list[str], int | float | None, dict]:
    """lm-eval on the chosen tasks (``manager``: lm-eval's task index, when already built): (task results,
    the tiny suite's question contexts, the limit used, lm-eval's own results with its samples)."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    local = args.suite in ("tiny", "local")
    files = {name: suite["tasks"][name].get("file", f"{name}.yaml") for name in tasks}
    with tempfile.TemporaryDirectory(prefix="lrc-eval-") as tmp:
        include = prepare_include_dir(args.tasks_dir, list(tasks), Path(tmp), files) if local else None
        call = lm_eval_call(args, tasks, manager or task_manager(args, include))
        check_tasks_known(call["task_manager"], tasks)
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.batch_size, device=str(device),
                  trust_remote_code=False, **hf_model_args(args.model_args))
        contexts = task_contexts(include, list(tasks), args.limit) if args.suite == "tiny" else []
        try:
            results = lm_eval.simple_evaluate(model=lm, **call)
        except Exception as err:  # most often: a hub dataset that cannot be fetched offline
            raise LRCError(f"lm-eval failed on suite {args.suite!r} (tasks {', '.join(tasks)}): "
                           f"{type(err).__name__}: {err}"
                           + (" -- the paper suite needs the hub's datasets (network, or a populated "
                              "HF_DATASETS_CACHE)" if args.suite in ("paper", "lm-eval") else "")) from err
    return read_lm_eval_results(results, tasks), contexts, call["limit"], results


def evaluate(args: EvaluateArgs) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Run the evaluation: (the summary JSON record, lm-eval's own results or None), nothing written."""
    if args.threads:
        # On a shared CPU, fewer threads than torch's default avoid oversubscription stalls.
        torch.set_num_threads(args.threads)
    manager = task_manager(args, None) if args.suite == "lm-eval" else None
    # Suite lm-eval is the named tasks themselves (task:metric already read); another suite is narrowed to them.
    suite = open_suite(args.tasks, manager) if manager is not None else load_suite(args.suite, args.tasks_dir)
    tasks = selected_tasks(suite, None if manager is not None else args.tasks)
    device = resolve_device(args.device)
    model = load_model(args.model, device)
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    check_vocab(len(tokenizer), model)
    check_tokenizer(args, tokenizer)
    # Opened (and verified) before lm-eval runs, so a wrong held-out set fails fast.
    heldout = TokenDataset(args.heldout, expect_tokenizer=tokenizer) if args.heldout is not None else None
    if heldout is not None:
        check_vocab(heldout, model)
    task_results, contexts, limit, raw = (run_suite(args, suite, tasks, model, tokenizer, device, manager) if tasks
                                          else ({}, [], None, None))
    values = [t["value"] for t in task_results.values()]
    logprobs = [t["answer_logprob"] for t in task_results.values() if "answer_logprob" in t]
    extra: dict[str, Any] = {"answer_logprob": sum(logprobs) / len(logprobs) if logprobs else None}
    teacher = load_model(args.teacher, device, role="--teacher") if args.teacher else None
    if teacher is not None:
        if teacher.get_output_embeddings().weight.shape[0] != model.get_output_embeddings().weight.shape[0]:
            raise LRCError(f"--teacher {args.teacher} and --model {args.model} have different vocabularies")
        if contexts:
            extra["answer_kl"] = answer_kl(model, teacher, tokenizer, contexts, batch_size=args.batch_size)
    if heldout is not None:
        rows, masks = heldout_rows(heldout, args.heldout_rows)
        extra.update(heldout_measures(model, rows, masks, teacher=teacher, batch_size=args.batch_size))
    summary = {
        "model": args.name or Path(args.model).resolve().name,
        "suite": args.suite,
        "tasks": task_results,
        # No task (suite none): no aggregate value; the held-out measures in `extra` stand alone.
        "aggregate": {"name": suite["aggregate"], "value": sum(values) / len(values) if values else None},
        "extra": extra,
        "lm_eval": {"version": library_versions()["lm_eval"],
                    "num_fewshot": args.num_fewshot, "batch_size": args.batch_size, "limit": limit},
        "settings": provenance("evaluate", args),
        # lm-eval's own records: a directory of their own, named relative to the summary.
        "lm_eval_records": os.path.relpath(args.lm_eval_out.resolve(), args.out.resolve().parent),
    }
    return summary, raw


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(EvaluateArgs, argv, prog="lrc evaluate")
    record, raw = evaluate(args)
    write_records(raw, args.lm_eval_out)
    write_json_atomic(args.out, record)
    parts = [f"{k} {v['metric']} {v['value']:.3f}" for k, v in record["tasks"].items()]
    parts += [f"{k} {record['extra'][k]:.4f}" for k in ("perplexity", "kl_to_teacher") if k in record["extra"]]
    aggregate = record["aggregate"]
    head = f"{aggregate['name']} {aggregate['value']:.4f} " if aggregate["value"] is not None else ""
    print(f"{record['model']}: {head}({', '.join(parts)})")
    return 0
