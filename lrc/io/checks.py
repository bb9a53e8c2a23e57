"""What every weight file read must be: no weight is ever made up, cast from an integer, or non-finite.

The loaders (:func:`lrc.io.hf.load_causal_lm`, :func:`lrc.method.student.load_lrc_state`,
:func:`lrc.method.spectral.load_bases`) call these; each failure is an :class:`~lrc.errors.LRCError`
naming the file and the key or tensor:

* configs (llama/qwen2) state every size the architecture is built from
  (:data:`REQUIRED_CONFIG_KEYS`), as positive integers: transformers would otherwise fill in its own
  defaults (32 layers, hidden 4096, ...) and initialise the weights the file does not have at random;
* every tensor a loaded model needs is in its files, at its shape, and no file holds one it does not
  know (:func:`check_loading_info`, :func:`check_against`): a missing one would be randomly initialised;
* every stored tensor is floating point (:data:`FLOAT_DTYPES`): an int32 tensor would be cast and used;
  read from the headers (:func:`read_headers`) before any data is loaded;
* every loaded tensor is finite (:func:`check_finite`: one summing pass per tensor, in memory: NaN and Inf
  propagate through a sum; only a sum that overflows with finite values takes the exact ``isfinite`` pass);
* a basis has orthonormal columns (:func:`check_orthonormal`): ``max |UᵀU - I| <= 1e-3``, computed exactly
  when the Gram matrix is cheap (``rows * cols**2 <= EXACT_GRAM_LIMIT``); for larger bases the column
  norms are checked exactly and the off-diagonal part through ``max |(UᵀU - I) X|`` with
  :data:`PROBES` seeded Gaussian columns X (O(rows * cols * PROBES) instead of O(rows * cols**2): at
  Llama-3.1-8B's 14336 x 4096 a Gram matrix per basis would cost ~0.5 TFLOP, 96 of them per teacher).
  Off-diagonal errors of a valid float32 basis are ~1e-7, so the probe's sum over a row stays far below
  the tolerance; one bad entry e shows as ~e·|x|, missed only when all probes' |x| < 1 (p ~ 0.3**16).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from lrc.errors import LRCError

REQUIRED_CONFIG_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")  # safetensors' names
_TORCH_FLOATS = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64"}
ORTHONORMAL_TOL = 1e-3
EXACT_GRAM_LIMIT = 2**28
PROBES = 16
SHOWN = 5  # names listed in a message


@dataclass(frozen=True)
class TensorHeader:
    """Where a stored tensor lives and what it is, read without loading its data."""

    file: Path
    dtype: str  # safetensors' name ("F32", "I32", ...)
    shape: tuple[int, ...]


def check_config(config: dict, file: str | os.PathLike) -> dict:
    """``config`` (read from ``file``) with every key of :data:`REQUIRED_CONFIG_KEYS` a positive integer."""
    for key in REQUIRED_CONFIG_KEYS:
        if key not in config:
            raise LRCError(f"config {file} lacks {key!r} (required: {', '.join(REQUIRED_CONFIG_KEYS)}; "
                           "no default is assumed)")
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LRCError(f"config {file}: {key} must be a positive integer, got {value!r}")
    return config


def read_headers(files: Iterable[str | os.PathLike]) -> dict[str, TensorHeader]:
    """Every tensor's file, dtype and shape in ``files`` (safetensors: the header only; pickles: loaded
    onto the meta device, ``weights_only``); a tensor stored twice is an error naming both files."""
    headers: dict[str, TensorHeader] = {}
    for file in map(Path, files):
        for name, dtype, shape in _entries(file):
            if name in headers:
                raise LRCError(f"tensor {name!r} is stored twice: in {headers[name].file} and in {file}")
            headers[name] = TensorHeader(file, dtype, tuple(shape))
    return headers


def _entries(file: Path) -> list[tuple[str, str, list[int]]]:
    if file.suffix == ".safetensors":
        try:
            with safe_open(str(file), framework="pt") as f:
                slices = [(name, f.get_slice(name)) for name in f.keys()]
                return [(name, s.get_dtype(), list(s.get_shape())) for name, s in slices]
        except (SafetensorError, OSError) as err:
            raise LRCError(f"weights file {file} is truncated or not a safetensors file: {err}") from err
    try:
        state = torch.load(file, map_location="meta", weights_only=True, mmap=True)
    except Exception as err:  # torch raises pickle/zip/runtime errors alike
        raise LRCError(f"cannot read weights file {file}: {type(err).__name__}: {err}") from err
    if not isinstance(state, dict):
        raise LRCError(f"weights file {file} holds no state dict")
    return [(name, _TORCH_FLOATS.get(t.dtype, str(t.dtype).removeprefix("torch.")), list(t.shape))
            for name, t in state.items() if isinstance(t, torch.Tensor)]


def check_float_dtypes(headers: Mapping[str, TensorHeader], what: str) -> None:
    """Refuse a stored tensor that is not floating point (it would be cast and used), naming it."""
    for name, h in headers.items():
        if h.dtype not in FLOAT_DTYPES:
            raise LRCError(f"{what} file {h.file}: tensor {name!r} is {h.dtype}, not floating point "
                           f"({', '.join(FLOAT_DTYPES)}); refusing to cast it")


def check_against(expected: Mapping[str, torch.Tensor], headers: Mapping[str, TensorHeader], what: str) -> None:
    """Refuse stored tensors that ``expected`` (the model's state dict) does not have, or has at another
    shape, naming each; missing ones are the caller's (tied tensors are stored once)."""
    unexpected = sorted(name for name in headers if name not in expected)
    if unexpected:
        h = headers[unexpected[0]]
        raise LRCError(f"{what} file {h.file} holds tensors the model does not have: {unexpected[:SHOWN]}")
    for name, h in headers.items():
        want = tuple(expected[name].shape)
        if h.shape != want:
            raise LRCError(f"{what} file {h.file}: tensor {name!r} has shape {list(h.shape)}, expected {list(want)}")


def check_loading_info(info: Mapping, directory: str | os.PathLike, what: str,
                       headers: Mapping[str, TensorHeader]) -> None:
    """Refuse what ``from_pretrained(output_loading_info=True)`` reports: a missing tensor (it was
    randomly initialised), an unexpected one, a shape that does not fit, an error."""
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise LRCError(f"{what} {directory}: tensors missing from its weight files {missing[:SHOWN]} "
                       f"({len(missing)} in all; they would be randomly initialised)")
    unexpected = sorted(info.get("unexpected_keys") or ())
    if unexpected:
        file = headers[unexpected[0]].file if unexpected[0] in headers else directory
        raise LRCError(f"{what} {file} holds tensors its config's model does not have: {unexpected[:SHOWN]}")
    for name, got, want in sorted(info.get("mismatched_keys") or (), key=str):
        file = headers[name].file if name in headers else directory
        raise LRCError(f"{what} file {file}: tensor {name!r} has shape {list(got)}, expected {list(want)}")
    errors = info.get("error_msgs") or []
    if errors:
        raise LRCError(f"cannot load {what} {directory}: {errors[0]}")


def check_finite(tensors: Iterable[tuple[str, torch.Tensor]], headers: Mapping[str, TensorHeader], what: str,
                 default_file: str | os.PathLike) -> None:
    """Refuse a floating tensor holding NaN or Inf, naming its file (from ``headers``) and name.
    One summing pass per tensor (measured 0.013 s per 25M fp32 elements on one thread, against 0.25 s for
    ``isfinite``); a tensor shared under several names is checked once."""
    seen: set[tuple] = set()
    for name, t in tensors:
        key = (t.data_ptr(), tuple(t.shape), t.dtype)
        if not t.is_floating_point() or t.device.type == "meta" or key in seen:
            continue
        seen.add(key)
        # NaN and Inf propagate through a sum, 20x cheaper than isfinite (no bool copy); a sum that
        # overflows with finite values (fp16) falls through to the exact check.
        if bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all()):
            continue
        bad = int((~torch.isfinite(t)).sum())
        file = headers[name].file if name in headers else default_file
        raise LRCError(f"{what} file {file}: tensor {name!r} has {bad} non-finite value(s) (NaN or Inf)")


def orthonormality_error(u: torch.Tensor, *, exact_limit: int = EXACT_GRAM_LIMIT, probes: int = PROBES) -> float:
    """``max |UᵀU - I|``, exact for small U; for large U the column norms exactly and the off-diagonal
    part through seeded probes (module doc)."""
    rows, cols = u.shape
    if rows * cols * cols <= exact_limit:
        v = u.detach().to("cpu", torch.float64)
        return float((v.T @ v - torch.eye(cols, dtype=torch.float64)).abs().max())
    v = u.detach().to("cpu", torch.float32)
    norms = float(((v * v).sum(0) - 1).abs().max())
    x = torch.randn(cols, probes, generator=torch.Generator().manual_seed(0))
    return max(norms, float((v.T @ (v @ x) - x).abs().max()))


def check_orthonormal(u: torch.Tensor, name: str, file: str | os.PathLike, tol: float = ORTHONORMAL_TOL) -> None:
    """Refuse a basis (``[rows, cols]``, rows >= cols) whose columns are not orthonormal within ``tol``."""
    if u.ndim != 2 or u.shape[0] < u.shape[1]:
        raise LRCError(f"teacher bases file {file}: {name} has shape {list(u.shape)}, not a basis [rows >= cols]")
    err = orthonormality_error(u)
    if not err <= tol:
        raise LRCError(f"teacher bases file {file}: {name} is not orthonormal (max |UᵀU - I| = {err:.3g} > {tol:g}); "
                       "rerun `lrc svd`")
