"""Merge a trained LRC student into a plain Hugging Face checkpoint, verified (`lrc merge`).

:func:`merge_student` materialises every parametrised weight first (reading each one
through the student's own modules), and only then builds a fresh model of the student's
config and loads them; the training student is never modified (DESIGN.md "Known traps":
removing parametrisations one by one rewrites a shared tied factor). Tied stays tied
(one tensor, re-tied after loading), untied stays untied, and the trained RMSNorm eps is
the one in the saved config.

:func:`save_merged` writes the checkpoint (safetensors) to a temporary directory, reloads
it with :func:`lrc.io.hf.load_causal_lm` (plain ``from_pretrained``, no custom code), compares its
logits with the training student's on a check batch, and lets transformers' ``generate`` continue
a prompt greedily against the student's own greedy tokens; only when the max abs logit
difference is within ``atol`` and the tokens agree (up to a near-tie) is it renamed into place;
``merge_check.json`` records the result. The check runs in fp32; a bf16 or fp16 checkpoint is
the checked one cast once more and saved over it (its rounding recorded, not judged).
"""

from __future__ import annotations

import copy
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from transformers.initialization import no_init_weights

from lrc.errors import LRCError
from lrc.io.atomic import atomic_dir, write_json_atomic
from lrc.io.model_card import MERGE_CHECK, write_model_card
from lrc.io.hf import load_causal_lm, load_teacher, read_json_object, save_causal_lm, tokenizer_if_any
from lrc.io.provenance import write_settings
from lrc.io.tokens import TokenDataset
from lrc.method.spectral import load_bases
from lrc.method.student import load_lrc_state, read_lrc_meta
from lrc.options import parse_args

SAVE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# The generation check: GREEDY_TOKENS generated after the first PROMPT_TOKENS of the check batch's first row.
PROMPT_TOKENS, GREEDY_TOKENS = 8, 8


def _resolve(model, dotted: str) -> torch.Tensor:
    obj = model
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def plain_config(student):
    cfg = copy.deepcopy(student.config)
    cfg.tie_word_embeddings = (bool(student.lrc_info["tie_word_embeddings"]) if hasattr(student, "lrc_info")
                               else cfg.tie_word_embeddings)
    return cfg


@torch.no_grad()
def merge_student(student):
    """A new plain model (same class, student config) with the materialised weights."""
    cfg = plain_config(student)
    with no_init_weights():  # every weight is loaded below
        merged = type(student)(cfg)
    names = list(merged.state_dict().keys())
    # Materialise everything before touching anything (parametrised attributes compute W).
    values = {k: _resolve(student, k).detach().clone() for k in names}
    dtype = next(iter(values.values())).dtype
    merged = merged.to(dtype)
    merged.load_state_dict(values, strict=True)
    if cfg.tie_word_embeddings:
        merged.lm_head.weight = merged.model.embed_tokens.weight
    return merged.to(_resolve(student, "model.embed_tokens.weight").device).eval()


def default_check_ids(vocab_size: int, rows: int = 2, length: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (rows, length), generator=g)


@torch.no_grad()
def _logits(model, ids):
    return model(input_ids=ids.to(next(model.parameters()).device), use_cache=False).logits.float().cpu()


@torch.no_grad()
def greedy_tokens(model, prompt: torch.Tensor, steps: int = GREEDY_TOKENS) -> tuple[list[int], list[float]]:
    """Greedy continuation by full forwards (no cache): the tokens and each step's top-2 logit margin."""
    ids = prompt.to(next(model.parameters()).device)[None]
    tokens, margins = [], []
    for _ in range(steps):
        top = model(input_ids=ids, use_cache=False).logits[0, -1].float().topk(2)
        tokens.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        ids = torch.cat([ids, top.indices[:1].view(1, 1)], dim=1)
    return tokens, margins


@torch.no_grad()
def generation_check(student, reloaded, prompt: torch.Tensor, atol: float) -> dict:
    """transformers' own greedy ``generate`` (with its KV cache) on the reloaded model against the
    student's greedy tokens. A difference passes only at a near-tie of the student's (margin ≤ 2·atol)."""
    expected, margins = greedy_tokens(student, prompt)
    ids = prompt.to(next(reloaded.parameters()).device)[None]
    out = reloaded.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(expected),
                            min_new_tokens=len(expected), do_sample=False, num_beams=1, pad_token_id=0,
                            eos_token_id=None)
    got = out[0, ids.shape[1]:].tolist()
    first = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), None)
    return {"prompt_tokens": int(prompt.numel()), "student": expected, "merged": got,
            "passed": first is None or margins[first] <= 2 * atol}


def save_merged(student, out_dir, *, tokenizer=None, check_ids=None, atol: float = 1e-5,
                dtype: str = "fp32") -> dict:
    """Save the merged student (in ``dtype``) to ``out_dir`` and verify it by reloading; returns the check."""
    merged = merge_student(student)
    if check_ids is None:
        check_ids = default_check_ids(student.config.vocab_size)
    with atomic_dir(out_dir) as tmp:  # a failed check raises: nothing is left behind
        check, reference = _save_and_check(student, merged, tmp, tokenizer, check_ids, atol)
        if dtype != "fp32":
            check |= _save_cast(merged, tmp, tokenizer, check_ids, dtype, reference)
        write_json_atomic(tmp / MERGE_CHECK, check)
        return check


def _save_cast(merged, tmp: Path, tokenizer, check_ids, dtype: str, reference: torch.Tensor) -> dict:
    """Save the checked model again in ``dtype``: the reloaded tensors must equal the cast ones
    exactly; the logits' distance to the fp32 student is recorded (rounding, not an error)."""
    cast = merged.to(SAVE_DTYPES[dtype])
    save_causal_lm(cast, tmp, tokenizer)
    reloaded = load_causal_lm(tmp, dtype=SAVE_DTYPES[dtype], role="merged model")
    saved, wanted = reloaded.state_dict(), cast.state_dict()
    changed = [k for k in wanted if not torch.equal(saved[k], wanted[k])]
    if changed:
        raise LRCError(f"the {dtype} checkpoint reloads other tensors than were saved: {', '.join(changed[:5])}")
    drift = (_logits(reloaded.to(next(merged.parameters()).device), check_ids) - reference).abs().max().item()
    return {"saved_dtype": dtype, "saved_max_abs_diff": drift}


def _save_and_check(student, merged, tmp: Path, tokenizer, check_ids, atol: float) -> tuple[dict, torch.Tensor]:
    """Save into ``tmp``, reload, compare logits and greedy tokens; raise on a failed check.
    Returns the check and the student's logits on the check batch."""
    save_causal_lm(merged, tmp, tokenizer)
    was_training = student.training
    student.eval()
    try:
        reference = _logits(student, check_ids)
        reloaded = load_causal_lm(tmp, dtype=merged.dtype, role="merged model")
        reloaded.to(next(student.parameters()).device)  # same device as the reference logits
        diff = (_logits(reloaded, check_ids) - reference).abs().max().item()
        generation = generation_check(student, reloaded, check_ids[0, :PROMPT_TOKENS], atol)
    finally:
        student.train(was_training)
    check = {
        "max_abs_diff": diff,
        "atol": atol,
        "passed": diff <= atol,
        "check_batch_shape": list(check_ids.shape),
        "tie_word_embeddings": bool(reloaded.config.tie_word_embeddings),
        "rms_norm_eps": reloaded.config.rms_norm_eps,
        "hidden_size": reloaded.config.hidden_size,
        "arm": getattr(student, "lrc_info", {}).get("arm"),
        "generation": generation,
        "saved_dtype": "fp32",
    }
    if not check["passed"]:
        raise LRCError("merge check failed: reloaded logits differ from the training student's by "
                       f"{diff:.3g} > atol {atol:g}")
    if not generation["passed"]:
        raise LRCError(f"merge check failed: transformers' generate on the merged model gave {generation['merged']}, "
                       f"the training student's greedy tokens are {generation['student']}")
    return check, reference


# ---------------------------------------------------------------- command line


@dataclass(kw_only=True)
class MergeArgs:
    """Materialise a trained LRC student into a plain HF checkpoint and verify its logits."""

    state: Path = field(metadata={"help": "LRC state directory (student.safetensors + lrc.json)"})
    teacher: Path = field(metadata={"help": "teacher checkpoint directory"})
    out: Path = field(metadata={"help": "output directory for the merged checkpoint", "output": "dir"})
    bases: Path | None = field(default=None, metadata={
        "help": "teacher bases directory (core/confined/randcomp; computed if omitted)"})
    data: Path | None = field(default=None, metadata={
        "help": "token directory whose first rows form the check batch (default: seeded random ids)"})
    check_rows: int = field(default=2, metadata={"help": "rows of --data in the check batch"})
    check_len: int = field(default=128, metadata={
        "help": "tokens per row of the check batch (logits are rows x len x vocab)"})
    atol: float = field(default=1e-5, metadata={"help": "max abs logit difference allowed"})
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = field(default="auto", metadata={
        "help": "precision of the saved weights; auto: the training's (bf16 after bf16 mixed precision, else fp32)"})
    allow_pickle: bool = field(default=False, metadata={
        "help": "accept a teacher stored as pickled weights (pytorch_model.bin; can run code when loaded)"})

    def __post_init__(self) -> None:
        if not 0 <= self.atol < float("inf"):
            raise LRCError(f"--atol must be >= 0, got {self.atol}")
        if self.check_rows < 1 or self.check_len < 2:
            raise LRCError(f"--check-rows {self.check_rows} / --check-len {self.check_len}: "
                           "need at least 1 row of 2 tokens")


def check_batch_from_tokens(directory: Path, rows: int, length: int) -> torch.Tensor:
    ds = TokenDataset(directory)
    if len(ds) == 0:
        raise LRCError(f"token directory {directory} has no rows")
    return torch.stack([ds[i]["input_ids"][:length] for i in range(min(rows, len(ds)))])


def save_dtype(requested: str, state: Path) -> str:
    """``auto``: bf16 where the state was trained under bf16 mixed precision (its settings.json), else fp32."""
    if requested != "auto":
        return requested
    settings = state / "settings.json"
    training = read_json_object(settings, "LRC state settings").get("training", {}) if settings.is_file() else {}
    return "bf16" if training.get("mixed_precision") == "bf16" else "fp32"


def main(argv=None) -> int:
    args = parse_args(MergeArgs, argv, prog="lrc merge")
    teacher = load_teacher(args.teacher, allow_pickle=args.allow_pickle)
    bases = load_bases(args.bases, teacher) if args.bases is not None else None
    student = load_lrc_state(args.state, teacher, bases)
    if args.check_rows < 1 or args.check_len < 2:
        raise LRCError(f"--check-rows {args.check_rows} / --check-len {args.check_len}: "
                       "need at least 1 row of 2 tokens")
    if args.data is not None:
        check_ids = check_batch_from_tokens(args.data, args.check_rows, args.check_len)
    else:
        check_ids = default_check_ids(student.config.vocab_size, args.check_rows, args.check_len)
    if int(check_ids.max()) >= student.config.vocab_size:
        raise LRCError(f"--data {args.data}: token id {int(check_ids.max())} outside the vocabulary "
                       f"({student.config.vocab_size})")
    check = save_merged(student, args.out, tokenizer=tokenizer_if_any(args.teacher), check_ids=check_ids,
                        atol=args.atol, dtype=save_dtype(args.dtype, args.state))
    write_settings(args.out, "merge", args, merge_check=check)
    write_model_card(args.out, teacher=args.teacher, state_meta=read_lrc_meta(args.state), check=check,
                     command=shlex.join(["lrc", "merge", *(sys.argv[1:] if argv is None else argv)]))
    print(f"merged {check['arm']} student to {args.out}: max |logit diff| = {check['max_abs_diff']:.3g}")
    return 0
