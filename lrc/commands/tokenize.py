"""`lrc tokenize`: a corpus (or a chat set) into ``OUT/train`` and ``OUT/valid`` token directories.

Plain text follows the LRC recipe: each document becomes ``eos + text + bos``, tokenised
without special tokens, concatenated and cut into rows of ``seq_len`` (the tail that does
not fill a row is dropped). Chat data is rendered with the tokenizer's own chat template.

The document separator (``--separator``, :func:`resolve_separator`): ``eos-bos`` is that
recipe; a token (``--separator '<|endoftext|>'``) puts just that token before each document;
``auto`` (the default) takes the tokenizer's end-of-text token, the first of
:data:`END_OF_TEXT_TOKENS` in its vocabulary, else its eos. When that token *is* its eos (a
base model's tokenizer: Llama-3, Qwen2.5, the tiny world) ``auto`` is ``eos-bos``, so those
corpora are unchanged; when it is not (an instruct tokenizer whose eos ends a chat turn, as
SmolLM2-Instruct's ``<|im_end|>`` beside ``<|endoftext|>``), documents are ``token + text``
and never wrapped in chat markers.

The records come from one source or a mixture of several (lrc.io.sources); each source's
dataset revision, filter and counts go into the manifest. The directory format is
lrc.io.tokens's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Sequence

import numpy as np

from lrc.errors import LRCError
from lrc.io.hf import load_tokenizer
from lrc.io.provenance import write_settings
from lrc.io.sources import (
    BUILTIN_SOURCES,
    SourceSpec,
    builtin_source_info,
    in_valid_split,
    iter_records,
    load_mixture,
    mix,
    record_field,
)
from lrc.io.tokens import TokenWriter, check_vocab, read_manifest
from lrc.options import parse_args

# ---------------------------------------------------------------------------------------
# Documents -> token ids (+ mask)


# Names a tokenizer gives its end-of-text token (GPT-2/SmolLM/Qwen, Llama-3, SentencePiece).
END_OF_TEXT_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>")
EOS_BOS = "eos-bos"


@dataclass(frozen=True)
class Separator:
    """What goes around each document: ``head + text + tail`` (token ids)."""

    head: tuple[int, ...]
    tail: tuple[int, ...]
    layout: str  # for the manifest, e.g. "eos+text+bos" or "<|endoftext|>+text"

    def wrap(self, ids: Sequence[int]) -> list[int]:
        return [*self.head, *ids, *self.tail]


def resolve_separator(tokenizer: Any, rule: str = "auto") -> Separator:
    """The document separator of ``--separator rule`` (see the module doc)."""
    vocab = tokenizer.get_vocab()
    if rule == "auto":
        token = next((t for t in END_OF_TEXT_TOKENS if t in vocab), tokenizer.eos_token)
        rule = EOS_BOS if token is None or vocab.get(token) == tokenizer.eos_token_id else token
    if rule == EOS_BOS:
        if tokenizer.eos_token_id is None:
            raise LRCError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no eos token; "
                           "--separator eos-bos needs one")
        tail = (tokenizer.bos_token_id,) if tokenizer.bos_token_id is not None else ()  # Qwen has no bos
        return Separator((tokenizer.eos_token_id,), tail, "eos+text+bos" if tail else "eos+text")
    if rule not in vocab:
        raise LRCError(f"--separator {rule!r}: not a token of tokenizer {getattr(tokenizer, 'name_or_path', '')!r} "
                       f"(give a token of its vocabulary, {EOS_BOS!r} or 'auto')")
    return Separator((vocab[rule],), (), f"{rule}+text")


def text_ids(tokenizer: Any, text: str, separator: Separator | None = None) -> list[int]:
    """One document's ids: METHOD.md's recipe eos + text + bos unless ``separator`` says otherwise."""
    separator = separator or resolve_separator(tokenizer, EOS_BOS)
    return separator.wrap(tokenizer(text, add_special_tokens=False)["input_ids"])


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
            raise LRCError("the chat template does not render conversations prefix-consistently; "
                           "cannot locate assistant turns")
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


# ---------------------------------------------------------------------------------------
# The command


@dataclass(kw_only=True)
class TokenizeArgs:
    """Tokenise a corpus (or a chat set with --chat) into OUT/train and OUT/valid token directories."""

    tokenizer: str = field(metadata={"help": "tokenizer directory (or hub id) whose ids to write"})
    source: str | None = field(default=None, metadata={
        "help": "local .jsonl/.json/.txt/.parquet file, a `datasets` hub id, or a local dataset repository "
                "directory (or give --mixture)"})
    mixture: Path | None = field(default=None, metadata={
        "help": "instead of --source: YAML file whose 'sources' list mixes several sources (keys: source, split, "
                "dataset_config, revision, text_field, messages_field, chat, filter_field, filter_min, share)"})
    out: Path = field(metadata={"help": "output directory; gets train/ and valid/", "output": "dir",
                                "parts": ("train", "valid")})
    seq_len: int = field(metadata={"help": "tokens per row"})
    valid_source: str | None = field(default=None, metadata={
        "help": "a separate source for valid/ (else split off --source)"})
    split: str = field(default="train", metadata={"help": "dataset split (hub sources)"})
    dataset_config: str | None = field(default=None, metadata={"help": "dataset configuration name (hub sources)"})
    revision: str | None = field(default=None, metadata={
        "help": "dataset revision: branch, tag or commit (hub sources)"})
    filter_field: str | None = field(default=None, metadata={
        "help": "keep only records whose numeric field (dotted for nested, e.g. metadata.int_score) "
                "is >= --filter-min"})
    filter_min: float | None = field(default=None, metadata={"help": "threshold of --filter-field"})
    text_field: str = field(default="text", metadata={"help": "record field holding the document text"})
    messages_field: str = field(default="messages", metadata={"help": "record field holding the conversation (--chat)"})
    chat: bool = field(default=False, metadata={
        "help": "chat data: render with the chat template, mask = assistant tokens"})
    chat_layout: Literal["pack", "pad"] = field(default="pack", metadata={
        "help": "chat rows: pack conversations, or one padded (truncated) conversation per row"})
    max_tokens: int | None = field(default=None, metadata={"help": "stop when train/ holds this many tokens"})
    valid_fraction: float = field(default=0.01, metadata={
        "help": "fraction of documents split off into valid/ (no --valid-source)"})
    valid_rows: int | None = field(default=None, metadata={
        "help": "instead: the first documents fill this many valid rows"})
    model_vocab: int | None = field(default=None, metadata={
        "help": "refuse a tokenizer larger than this embedding size"})
    separator: str = field(default="auto", metadata={
        "help": "document separator: 'auto' (the tokenizer's end-of-text token, <|endoftext|> / <|end_of_text|> / "
                "</s>, else eos; eos-bos when that is its eos), 'eos-bos' (eos + text + bos, the LRC recipe) or a "
                "token of the vocabulary put before each document"})

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


Document = tuple[list[int], "list[int] | None", "str | None"]  # ids, assistant mask, split name


def _documents(spec: SourceSpec, tokenizer: Any, *, masked_chat: bool, separator: Separator) -> Iterator[Document]:
    """Token ids of each kept record: with ``masked_chat`` (SFT data) a rendered conversation
    and its assistant mask; otherwise ``separator``-wrapped text, where a chat source's text is
    its conversation rendered with the chat template. The third item is the name that assigns
    the document to valid/ (a built-in corpus's document name; None: its index does)."""
    if spec.chat and not getattr(tokenizer, "chat_template", None):
        raise LRCError(f"source {spec.source}: a chat source needs a tokenizer with a chat template; "
                       f"{getattr(tokenizer, 'name_or_path', '')!r} has none")
    records = (r for r in iter_records(spec.source, split=spec.split, dataset_config=spec.dataset_config,
                                       revision=spec.revision) if spec.keeps(r))
    if masked_chat:
        for record in records:
            yield *chat_ids(tokenizer, _messages(record, spec)), None
        return
    for batch in _batched(_texts(records, spec, tokenizer), 256):
        names, texts = zip(*batch)
        if sum(map(len, texts)) <= PIECE_CHARS:  # one call: the fast tokenizer uses its own threads
            for name, ids in zip(names, tokenizer(list(texts), add_special_tokens=False)["input_ids"]):
                yield separator.wrap(ids), None, name
            continue
        for name, text in batch:  # a long text in pieces: one call on a 20 MB line took 4 GB
            yield separator.wrap([i for piece in text_pieces(text)
                                  for i in tokenizer(piece, add_special_tokens=False)["input_ids"]]), None, name


PIECE_CHARS = 1 << 20


def text_pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """``text`` cut into pieces of at most ``size`` characters, each cut just before a space where the
    second half of the piece has one (a byte-level BPE tokenizer then gives the ids of the whole)."""
    pieces, start = [], 0
    while len(text) - start > size:
        cut = text.rfind(" ", start + size // 2, start + size)
        cut = cut if cut > start else start + size
        pieces.append(text[start:cut])
        start = cut
    return pieces + [text[start:]]


def _texts(records: Iterable[dict], spec: SourceSpec, tokenizer: Any) -> Iterator[tuple[str | None, str]]:
    named = spec.source in BUILTIN_SOURCES  # its documents are split by name, not by position
    for record in records:
        if spec.chat:
            text = _render(tokenizer, _messages(record, spec), add_generation_prompt=False)
        else:
            text = record_field(record, spec.text_field, spec.source)
            if not isinstance(text, str):
                raise LRCError(f"source {spec.source}: field {spec.text_field!r} must be a string, got "
                               f"{type(text).__name__}")
        if text:
            yield (record["name"] if named else None), text


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


def _split_rule(args: TokenizeArgs, specs: list[SourceSpec]) -> str:
    """How valid/ was split from train/, in words, for the manifest."""
    if args.valid_source is not None:
        return f"valid/ from --valid-source {args.valid_source}"
    if args.valid_rows is not None:
        return f"the first documents fill {args.valid_rows} valid rows"
    keys = sorted({"document name" if s.source in BUILTIN_SOURCES else "document index" for s in specs})
    return f"crc32({' / '.join(keys)}) / 2**32 < {args.valid_fraction}"


def _source_records(which_specs: list[SourceSpec], counts: list[list[int]], corpus: dict) -> list[dict]:
    """The manifest's ``sources``: each source's settings and counts; a built-in corpus adds
    its licence, Python version and text hash; every entry the separator and split rule."""
    return [{**asdict(s), "documents": d, "document_tokens": t, **corpus, **(builtin_source_info(s.source) or {})}
            for s, (d, t) in zip(which_specs, counts)]


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
    separator = resolve_separator(tokenizer, args.separator)
    corpus = {"separator": args.separator, "document_layout": "chat template" if args.chat else separator.layout,
              "valid_split": _split_rule(args, specs)}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = Path(args.out)
    common = dict(seq_len=args.seq_len, vocab_size=len(tokenizer), with_mask=args.chat, tokenizer=tokenizer)
    train_cap = args.max_tokens // args.seq_len if args.max_tokens else None
    # Per split and source: documents and their tokens (before cutting into rows).
    counts = {"train": [[0, 0] for _ in specs], "valid": [[0, 0] for _ in valid_specs]}

    def stream(which_specs: list[SourceSpec]) -> Iterator[tuple[int, Document]]:
        docs = [_documents(s, tokenizer, masked_chat=args.chat, separator=separator) for s in which_specs]
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

        for i, (k, (ids, mask, doc_name)) in enumerate(stream(specs)):
            if args.valid_source is not None:
                which = "train"
            elif args.valid_rows is not None:
                which = "train" if valid.full else "valid"
            else:
                which = "valid" if in_valid_split(i if doc_name is None else doc_name, args.valid_fraction) else "train"
            feed(which, k, ids, mask)
            if train.full:
                break
        if args.valid_source is not None:
            for k, (ids, mask, _) in stream(valid_specs):
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
        # Both are renamed into place only when this block ends without error.
        return {"train": train.commit(_source_records(specs, counts["train"], corpus)),
                "valid": valid.commit(_source_records(valid_specs, counts["valid"], corpus))}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(TokenizeArgs, argv, prog="lrc tokenize")
    written = tokenize(args)
    manifests = {k: read_manifest(v) for k, v in written.items()}
    write_settings(args.out, "tokenize", args, rows={k: m["rows"] for k, m in manifests.items()},
                   tokens={k: m["tokens"] for k, m in manifests.items()})
    for k, m in manifests.items():
        print(f"{written[k]}: {m['rows']} rows x {m['seq_len']} tokens ({m['dtype']})")
    return 0
