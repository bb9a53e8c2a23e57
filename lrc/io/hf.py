"""Hugging Face I/O in one place: tokenizers, causal LMs on disk, teachers, and which
parameters train.

Every command that reads a model or a tokenizer from disk comes through here, so the
safety defaults and the error messages are the same everywhere:

* :func:`load_causal_lm` is the one loader of a model from a local directory: the dtype is
  an explicit argument (callers used to pick four different conventions), remote code is
  never run, and the weights must be safetensors. Pickled weights (``pytorch_model.bin``,
  ``*.pt``, ...) can run code when unpickled: they are refused with a message naming the
  file unless the caller passes ``allow_pickle=True`` (commands: ``--allow-pickle``), and
  then transformers reads them with ``torch.load(weights_only=True)``.
* Bad files become :class:`~lrc.errors.LRCError` naming the file: a ``config.json`` that is
  not JSON, a truncated or corrupt safetensors file (its header and size are checked
  before anything is loaded, which costs one header read per file), a missing directory.
* No weight is made up (:mod:`lrc.io.checks`): a llama/qwen2 config must state its sizes, every
  tensor the model needs must be in the files at its shape (a missing one would be randomly
  initialised), every stored tensor floating point (from the headers, before loading) and every
  loaded one finite (one ``isfinite`` pass per tensor); each refusal names the file and the key.
* Where the teacher is frozen: :func:`freeze_teacher` is the one implementation, called
  where a model *becomes* a teacher: :func:`lrc.method.student.build_student` (the LRC student's
  parametrisations read the teacher's own weight tensors, so the teacher must never train once a
  student is built on it) and :class:`lrc.method.objectives.KDObjective` (the plain-KD baseline,
  which has no LRC student). Not the loader: the same loader loads models that train
  (``lrc sft``), and the objectives and the loop receive a teacher already frozen. Each
  run therefore freezes its teacher exactly once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from lrc.errors import LRCError
from lrc.io.checks import check_config, check_finite, check_float_dtypes, check_loading_info, read_headers

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")
CONFIG_FILE = "config.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def has_tokenizer(directory: str | os.PathLike) -> bool:
    """True when ``directory`` holds a saved tokenizer."""
    return any((Path(directory) / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(path_or_id: str | os.PathLike) -> Any:
    """AutoTokenizer from a local directory (or a hub id when online); never remote code."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path_or_id), trust_remote_code=False)
    except Exception as err:  # transformers raises OSError/ValueError/HF errors alike
        raise LRCError(f"cannot load tokenizer {str(path_or_id)!r}: {err}") from err


def tokenizer_if_any(directory: str | os.PathLike) -> Any:
    """The tokenizer saved in ``directory``, or None when it has none."""
    return load_tokenizer(directory) if has_tokenizer(directory) else None


def read_config(directory: str | os.PathLike, role: str = "model") -> dict:
    """``directory/config.json`` as a dict; an LRCError naming the file when absent or not JSON."""
    d = Path(directory)
    if not d.is_dir():
        raise LRCError(f"{role} {d} is not a checkpoint directory")
    file = d / CONFIG_FILE
    if not file.is_file():
        raise LRCError(f"{role} {d} has no {CONFIG_FILE}")
    config = read_json_object(file, f"{role} config")
    if config.get("model_type") in SUPPORTED_MODEL_TYPES:
        check_config(config, file)
    return config


def read_json_object(file: Path, what: str) -> dict:
    """A JSON object from ``file``, or an LRCError naming it (``what`` says what it is)."""
    try:
        data = json.loads(Path(file).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LRCError(f"{what} {file} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise LRCError(f"{what} {file} is not a JSON object")
    return data


def check_safetensors(path: str | os.PathLike, role: str = "weights") -> Path:
    """Raise an LRCError naming ``path`` when it is not a complete safetensors file.

    safetensors checks the header and that the tensors exactly cover the file, so a
    truncated file is caught here (bit flips inside the data are not: no checksum)."""
    p = Path(path)
    try:
        with safe_open(str(p), framework="pt"):
            pass
    except (SafetensorError, OSError) as err:
        raise LRCError(f"{role} file {p} is truncated or not a safetensors file: {err}") from err
    return p


def weight_files(directory: str | os.PathLike, role: str = "model", *, allow_pickle: bool = False) -> list[Path]:
    """The weight files a checkpoint directory is loaded from, each checked.

    Safetensors files when there are any; otherwise pickled files, which are refused
    (naming the file) unless ``allow_pickle``."""
    d = Path(directory)
    for index in sorted(d.glob("*.index.json")):  # a sharded checkpoint's map of shards
        try:
            json.loads(index.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise LRCError(f"{role} weights index {index} is not valid JSON: {err}") from err
    safetensors = sorted(d.glob("*.safetensors"))
    for f in safetensors:
        check_safetensors(f, role)
    if safetensors:
        return safetensors
    pickles = sorted(f for f in d.iterdir() if f.is_file() and f.suffix in PICKLE_SUFFIXES)
    if not pickles:
        raise LRCError(f"{role} {d} has no weights (no *.safetensors file)")
    if not allow_pickle:
        raise LRCError(f"{role} {d}: refusing pickled weights {pickles[0].name} (a pickle can run code when loaded); "
                       "convert them to safetensors, or pass --allow-pickle if you trust the file")
    return pickles


def load_causal_lm(path: str | os.PathLike, *, dtype: torch.dtype, role: str = "model",
                   allow_pickle: bool = False) -> nn.Module:
    """The one loader of a causal LM from a local directory, in eval mode, on the CPU.

    ``dtype`` is explicit; no remote code; safetensors only unless ``allow_pickle``
    (then read with ``torch.load(weights_only=True)``). ``role`` names the model in errors
    (``"--teacher"``, ``"--merged"``, ...)."""
    from transformers import AutoModelForCausalLM

    d = Path(path)
    read_config(d, role)
    files = weight_files(d, role, allow_pickle=allow_pickle)
    pickled = files[0].suffix != ".safetensors"
    headers = read_headers(files)
    check_float_dtypes(headers, role)
    try:
        # Mismatched shapes are reported (and refused below) rather than raised without naming the tensor.
        model, info = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, trust_remote_code=False,
                                                           use_safetensors=not pickled, output_loading_info=True,
                                                           ignore_mismatched_sizes=True)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as err:
        raise LRCError(f"cannot load {role} {d}: {type(err).__name__}: {err}") from err
    check_loading_info(info, d, role, headers)
    check_finite(model.state_dict().items(), headers, role, d)
    return model.eval()


def cast_weights(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast ``model``'s floating-point parameters to ``dtype`` in place; its buffers keep theirs.

    ``Module.to(dtype)`` casts the buffers too, RoPE's ``inv_freq`` among them: in bf16 its
    rounding turns the rotary angle at position 2047 by up to 3.7 rad (theta 5e5, head_dim 128,
    as Llama-3.2). ``from_pretrained(dtype=torch.bfloat16)`` keeps that buffer in fp32; so does
    this. The Parameter objects stay (what reads them, :class:`lrc.method.teacher_tensor.TeacherTensor`, follows)."""
    for param in model.parameters():
        if param.is_floating_point():
            param.data = param.data.to(dtype)
    return model


def load_teacher(path: str | os.PathLike, dtype: torch.dtype = torch.float32, *,
                 allow_pickle: bool = False) -> nn.Module:
    """A teacher checkpoint (llama or qwen2) via :func:`load_causal_lm`; float32 by default.

    Not frozen here (see the module doc): the student built on it freezes it."""
    config = read_config(path, "teacher")
    if config.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise LRCError(f"unsupported teacher model_type {config.get('model_type')!r} in {path}; supported: "
                       f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    return load_causal_lm(path, dtype=dtype, role="teacher", allow_pickle=allow_pickle)


def save_causal_lm(model: nn.Module, directory: str | os.PathLike, tokenizer: Any = None) -> None:
    """Write ``model`` (safetensors) and, when given, its tokenizer into ``directory``; its config
    also carries RoPE under the keys transformers 4.x reads (:func:`add_legacy_rope_keys`)."""
    model.save_pretrained(directory, safe_serialization=True)
    add_legacy_rope_keys(Path(directory) / "config.json")
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


def add_legacy_rope_keys(config_file: Path) -> None:
    """transformers 5 writes RoPE only as ``rope_parameters``; 4.x reads ``rope_theta`` and
    ``rope_scaling`` and, without them, silently takes theta 10000 and no scaling (a wrong model for
    Llama-3.x and Qwen2.5 in every tool still on 4.x). Both forms are written; 5.x reads its own."""
    config = json.loads(config_file.read_text())
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope or "rope_theta" in config:
        return
    config["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default":
        config["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def freeze_teacher(teacher: nn.Module) -> nn.Module:
    """Eval mode, no gradients: the one implementation of freezing a teacher."""
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The named parameters the optimiser sees (``requires_grad``)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def load_model_config(path: Path):
    from transformers import AutoConfig

    data = read_json_object(Path(path), "--model-config")
    model_type = data.pop("model_type", None)
    if not model_type:
        raise LRCError(f"--model-config {path}: no model_type (e.g. \"llama\")")
    if model_type in SUPPORTED_MODEL_TYPES:
        check_config(data, path)
    try:
        return AutoConfig.for_model(model_type, **data)
    except ValueError as err:
        raise LRCError(f"--model-config {path}: {err}") from err


