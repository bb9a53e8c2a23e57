"""`lrc tokenize`: a corpus (or a chat set) into ``OUT/train`` and ``OUT/valid`` token directories.

Plain text follows the LRC recipe: each document becomes ``eos + text + bos``, tokenised
without special tokens, concatenated and cut into rows of ``seq_len`` (the tail that does
not fill a row is dropped). Chat data is rendered with the tokenizer's own chat template.

The records come from one source or a mixture of several (lrc.sources); each source's
dataset revision, filter and counts go into the manifest. The directory format is
lrc.tokens's.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Sequence

import numpy as np

from lrc.errors import LRCError
from lrc.hf import load_tokenizer
from lrc.options import parse_args
from lrc.provenance import write_settings
from lrc.sources import SourceSpec, iter_records, load_mixture, mix, record_field
from lrc.tokens import TokenWriter, check_vocab, read_manifest

# ---------------------------------------------------------------------------------------
# Documents -> token ids (+ mask)


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """METHOD.md's recipe for one document: eos + text + bos, no special tokens added."""
    return _wrap_document(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"])


def _wrap_document(tokenizer: Any, ids: Sequence[int]) -> list[int]:
    tail = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []  # Qwen has no bos
    return [tokenizer.eos_token_id] + list(ids) + tail


def chat_ids(tokenizer: Any, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
    """Render a conversation with the chat template; mask 1 on the assistant turns' tokens.

    Each assistant turn's span is the text that rendering up to and including it adds to
    the rendering of the conversation before it with the generation prompt; so the header
    the template writes before an answer is not trained on, its end-of-turn token is.
    """
    full = _render(tokenizer, messages, add_generation_prompt=False)
    spans = []
    for k, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        start = len(_render(tokenizer, messages[:k], add_generation_prompt=True)) if k else 0
        upto = _render(tokenizer, messages[: k + 1], add_generation_prompt=False)
        if not full.startswith(upto):
            raise LRCError("the chat template does not render conversations prefix-consistently; cannot locate assistant turns")
        spans.append((start, len(upto)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def _render(tokenizer: Any, messages: Sequence[dict], *, add_generation_prompt: bool) -> str:
    if not messages:
        return ""
    if not getattr(tokenizer, "chat_template", None):
        raise LRCError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; cannot use --chat")
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)


class _Packer:
    """Concatenates token streams and emits full rows of ``seq_len`` (drops the tail)."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len
        self.ids: list[int] = []
        self.mask: list[int] = []

    def add(self, ids: Sequence[int], mask: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray | None] | None:
        self.ids.extend(ids)
        if mask is not None:
            self.mask.extend(mask)
        n = len(self.ids) // self.seq_len
        if n == 0:
            return None
        cut = n * self.seq_len
        rows = np.asarray(self.ids[:cut], dtype=np.int64).reshape(n, self.seq_len)
        masks = None
        if mask is not None:
            masks = np.asarray(self.mask[:cut], dtype=np.uint8).reshape(n, self.seq_len)
            del self.mask[:cut]
        del self.ids[:cut]
        return rows, masks


def _pad_row(ids: list[int], mask: list[int], seq_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    ids, mask = ids[:seq_len], mask[:seq_len]
    fill = seq_len - len(ids)
    return (np.asarray(ids + [pad_id] * fill, dtype=np.int64)[None],
            np.asarray(mask + [0] * fill, dtype=np.uint8)[None])


def _in_valid(index: int, fraction: float) -> bool:
    # A fixed hash of the document index: a deterministic, streaming-friendly split.
    return zlib.crc32(index.to_bytes(8, "little")) / 2**32 < fraction


# ---------------------------------------------------------------------------------------
# The command


@dataclass(kw_only=True)
class TokenizeArgs:
    """Tokenise a corpus (or a chat set with --chat) into OUT/train and OUT/valid token directories."""

    tokenizer: str = field(metadata={"help": "tokenizer directory (or hub id) whose ids to write"})
    source: str | None = field(default=None, metadata={"help": "local .jsonl/.json/.txt/.parquet file, a `datasets` hub id, or a local dataset repository directory (or give --mixture)"})
    mixture: Path | None = field(default=None, metadata={"help": "instead of --source: YAML file whose 'sources' list mixes several sources (keys: source, split, dataset_config, revision, text_field, messages_field, chat, filter_field, filter_min, share)"})
    out: Path = field(metadata={"help": "output directory; gets train/ and valid/"})
    seq_len: int = field(metadata={"help": "tokens per row"})
    valid_source: str | None = field(default=None, metadata={"help": "a separate source for valid/ (else split off --source)"})
    split: str = field(default="train", metadata={"help": "dataset split (hub sources)"})
    dataset_config: str | None = field(default=None, metadata={"help": "dataset configuration name (hub sources)"})
    revision: str | None = field(default=None, metadata={"help": "dataset revision: branch, tag or commit (hub sources)"})
    filter_field: str | None = field(default=None, metadata={"help": "keep only records whose numeric field (dotted for nested, e.g. metadata.int_score) is >= --filter-min"})
    filter_min: float | None = field(default=None, metadata={"help": "threshold of --filter-field"})
    text_field: str = field(default="text", metadata={"help": "record field holding the document text"})
    messages_field: str = field(default="messages", metadata={"help": "record field holding the conversation (--chat)"})
    chat: bool = field(default=False, metadata={"help": "chat data: render with the chat template, mask = assistant tokens"})
    chat_layout: Literal["pack", "pad"] = field(default="pack", metadata={"help": "chat rows: pack conversations, or one padded (truncated) conversation per row"})
    max_tokens: int | None = field(default=None, metadata={"help": "stop when train/ holds this many tokens"})
    valid_fraction: float = field(default=0.01, metadata={"help": "fraction of documents split off into valid/ (no --valid-source)"})
    valid_rows: int | None = field(default=None, metadata={"help": "instead: the first documents fill this many valid rows"})
    model_vocab: int | None = field(default=None, metadata={"help": "refuse a tokenizer larger than this embedding size"})

    def __post_init__(self) -> None:
        if (self.source is None) == (self.mixture is None):
            raise LRCError("give exactly one of --source and --mixture")
        if self.mixture is not None and (self.chat or self.valid_source is not None):
            raise LRCError("--mixture builds a plain-text corpus: it takes neither --chat nor --valid-source "
                           "(mark chat sources with 'chat: true' in the mixture file)")
        if self.source is not None:
            self.spec(self.source).check("lrc tokenize")
        if self.seq_len < 2:
            raise LRCError(f"--seq-len must be at least 2, got {self.seq_len}")
        if not 0.0 < self.valid_fraction < 1.0:
            raise LRCError(f"--valid-fraction must lie in (0, 1), got {self.valid_fraction}")
        if self.valid_rows is not None and self.valid_rows < 1:
            raise LRCError(f"--valid-rows must be positive, got {self.valid_rows}")
        if self.max_tokens is not None and self.max_tokens < self.seq_len:
            raise LRCError(f"--max-tokens ({self.max_tokens}) is less than one row of --seq-len {self.seq_len}")


    def spec(self, source: str) -> SourceSpec:
        """A source read with the per-source flags given on the command line."""
        return SourceSpec(source=source, split=self.split, dataset_config=self.dataset_config,
                          revision=self.revision, text_field=self.text_field, messages_field=self.messages_field,
                          chat=self.chat, filter_field=self.filter_field, filter_min=self.filter_min)

    def specs(self) -> list[SourceSpec]:
        return load_mixture(self.mixture) if self.mixture is not None else [self.spec(self.source)]


def _documents(spec: SourceSpec, tokenizer: Any, *, masked_chat: bool) -> Iterator[tuple[list[int], list[int] | None]]:
    """Token ids of each kept record: with ``masked_chat`` (SFT data) a rendered conversation
    and its assistant mask; otherwise ``eos + text + bos``, where a chat source's text is its
    conversation rendered with the chat template."""
    if spec.chat and not getattr(tokenizer, "chat_template", None):
        raise LRCError(f"source {spec.source}: a chat source needs a tokenizer with a chat template; "
                       f"{getattr(tokenizer, 'name_or_path', '')!r} has none")
    records = (r for r in iter_records(spec.source, split=spec.split, dataset_config=spec.dataset_config,
                                       revision=spec.revision) if spec.keeps(r))
    if masked_chat:
        for record in records:
            yield chat_ids(tokenizer, _messages(record, spec))
        return
    for texts in _batched(_texts(records, spec, tokenizer), 256):
        # Batched calls let the fast tokenizer use its own threads.
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            yield _wrap_document(tokenizer, ids), None


def _texts(records: Iterable[dict], spec: SourceSpec, tokenizer: Any) -> Iterator[str]:
    for record in records:
        if spec.chat:
            text = _render(tokenizer, _messages(record, spec), add_generation_prompt=False)
        else:
            text = record_field(record, spec.text_field, spec.source)
            if not isinstance(text, str):
                raise LRCError(f"source {spec.source}: field {spec.text_field!r} must be a string, got {type(text).__name__}")
        if text:
            yield text


# ShareGPT-style turns ({"from": "human", "value": ...}, as in OpenHermes-2.5) -> chat-template roles.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def _messages(record: dict, spec: SourceSpec) -> list[dict]:
    messages = record_field(record, spec.messages_field, spec.source, option="--messages-field")
    if not isinstance(messages, list) or not messages:
        raise LRCError(f"source {spec.source}: field {spec.messages_field!r} must be a non-empty list of messages")
    out = []
    for msg in messages:
        if isinstance(msg, dict) and "role" in msg and "content" in msg:
            out.append(msg)
        elif isinstance(msg, dict) and msg.get("from") in SHAREGPT_ROLES and "value" in msg:
            out.append({"role": SHAREGPT_ROLES[msg["from"]], "content": msg["value"]})
        else:
            raise LRCError(f"source {spec.source}: a message in {spec.messages_field!r} is neither "
                           f"{{role, content}} nor {{from: {'/'.join(SHAREGPT_ROLES)}, value}}: {str(msg)[:200]}")
    return out


def _batched(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def tokenize(args: TokenizeArgs) -> dict[str, Path]:
    """Run `lrc tokenize`; returns the written ``train`` and ``valid`` directories."""
    tokenizer = load_tokenizer(args.tokenizer)
    if tokenizer.eos_token_id is None:
        raise LRCError(f"tokenizer {args.tokenizer!r} has no eos token; the corpus recipe needs one")
    if args.model_vocab is not None:
        check_vocab(len(tokenizer), args.model_vocab)
    specs = args.specs()
    valid_specs = [args.spec(args.valid_source)] if args.valid_source is not None else specs
    name = args.source or str(args.mixture)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = Path(args.out)
    common = dict(seq_len=args.seq_len, vocab_size=len(tokenizer), with_mask=args.chat, tokenizer=tokenizer)
    train_cap = args.max_tokens // args.seq_len if args.max_tokens else None
    # Per split and source: documents and their tokens (before cutting into rows).
    counts = {"train": [[0, 0] for _ in specs], "valid": [[0, 0] for _ in valid_specs]}

    def stream(which_specs: list[SourceSpec]) -> Iterator[tuple[int, tuple[list[int], list[int] | None]]]:
        docs = [_documents(s, tokenizer, masked_chat=args.chat) for s in which_specs]
        return mix(docs, [s.share for s in which_specs], size=lambda doc: len(doc[0]))

    with (TokenWriter(out / "train", source=name, cap=train_cap, **common) as train,
          TokenWriter(out / "valid", source=args.valid_source or name, cap=args.valid_rows, **common) as valid):
        writers = {"train": train, "valid": valid}
        packers = {"train": _Packer(args.seq_len), "valid": _Packer(args.seq_len)}

        def feed(which: str, k: int, ids: list[int], mask: list[int] | None) -> None:
            counts[which][k][0] += 1
            counts[which][k][1] += len(ids)
            if args.chat and args.chat_layout == "pad":
                writers[which].append(*_pad_row(ids, mask, args.seq_len, pad_id))
                return
            got = packers[which].add(ids, mask)
            if got is not None:
                writers[which].append(*got)

        for i, (k, (ids, mask)) in enumerate(stream(specs)):
            if args.valid_source is not None:
                which = "train"
            elif args.valid_rows is not None:
                which = "train" if valid.full else "valid"
            else:
                which = "valid" if _in_valid(i, args.valid_fraction) else "train"
            feed(which, k, ids, mask)
            if train.full:
                break
        if args.valid_source is not None:
            for k, (ids, mask) in stream(valid_specs):
                feed("valid", k, ids, mask)
                if valid.full:
                    break
        if train.rows == 0 and valid.rows == 0:
            raise LRCError(f"source {name!r} gave no complete row of {args.seq_len} tokens (empty corpus?)")
        if valid.rows == 0:
            raise LRCError(f"no validation rows from {args.valid_source or name!r}: "
                           "raise --valid-fraction or --valid-rows, or give --valid-source")
        if train.rows == 0:
            raise LRCError(f"source {name!r}: no training rows left after the validation split")

        def records(which: str, which_specs: list[SourceSpec]) -> list[dict]:
            return [{**asdict(s), "documents": d, "document_tokens": t}
                    for s, (d, t) in zip(which_specs, counts[which])]

        # Both are renamed into place only when this block ends without error.
        return {"train": train.commit(records("train", specs)),
                "valid": valid.commit(records("valid", valid_specs))}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(TokenizeArgs, argv, prog="lrc tokenize")
    written = tokenize(args)
    manifests = {k: read_manifest(v) for k, v in written.items()}
    write_settings(args.out, "tokenize", args, rows={k: m["rows"] for k, m in manifests.items()},
                   tokens={k: m["tokens"] for k, m in manifests.items()})
    for k, m in manifests.items():
        print(f"{written[k]}: {m['rows']} rows x {m['seq_len']} tokens ({m['dtype']})")
    return 0
