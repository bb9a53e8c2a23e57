"""Config values that only a job would refuse, checked before any job runs (and so before Snakemake
deletes any output), each naming its key. Called by :func:`lrc.workflow.config.config_problems`
after the commands' own dataclass validation (:mod:`lrc.workflow.option_checks`), for what that
validation cannot see: values checked against each other across sections, against the job's GPU
count, or against the teacher's config where it is known before any job runs (the tiny world's
preset; a downloaded ``config.json``, ``config/teachers/<experiment>.json`` or a local teacher's
directory; otherwise the check is skipped):

* the student width against the teacher's attention heads (``lrc merge`` reloads the merged model
  through transformers, whose config class may refuse a width that is no multiple of them);
* each ``data.<kind>.seq_len`` against the teacher's ``max_position_embeddings``;
* a training section's ``batch_size`` against ``micro_batch_size`` times the stage's GPUs, and a
  token budget that buys no optimiser step;
* ``data.<kind>.text_field`` / ``messages_field`` against the records of a source known before the
  jobs, and ``separator`` against the tokenizer's vocabulary (or a misspelt ``auto``/``eos-bos``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
from pathlib import Path
from typing import Any

from lrc.cli import COMMANDS
from lrc.errors import LRCError
from lrc.names import teacher_config_places

# Training rules: (config section, resources stage, command, the budgets' source).
TRAINING = (("teacher.pretrain", "pretrain", "pretrain"), ("warmstart", "warmstart", "warmstart"),
            ("distill.train", "distill", "distill"), ("sft.train", "sft", "sft"))
# The tiny world's records (lrc/world/__init__.py `generate`): {"text": ...} and {"messages": [...]}.
WORLD_FIELDS = {"corpus": ("text_field", "text"), "sft": ("messages_field", "messages")}
SEPARATOR_RULES = ("auto", "eos-bos")  # lrc.commands.tokenize.resolve_separator's rules beside a token


def value_problems(exp: str, settings: dict, classes: dict[str, type], workdir: Path | str,
                   distill_tokens: list[int]) -> list[str]:
    """Every problem of the values above in one experiment, each starting with its dotted key."""
    problems = []
    try:
        teacher = known_teacher_config(exp, settings, workdir, classes.get("world"))
    except LRCError as err:
        teacher, problems = None, [str(err)]
    if teacher is not None:
        problems += head_problems(exp, settings, *teacher) + seq_len_problems(exp, settings, *teacher)
    problems += batch_problems(exp, settings, classes, distill_tokens)
    return problems + data_problems(exp, settings, workdir)


def _section(settings: dict, dotted: str) -> dict:
    node: Any = settings
    for key in dotted.split("."):
        node = (node or {}).get(key) or {}
    return node


# ------------------------------------------------------------------ the teacher's config


def known_teacher_config(exp: str, settings: dict, workdir: Path | str,
                         world_class: type | None = None) -> tuple[dict, str] | None:
    """The teacher's config (as a dict) and where it was read, when known before any job runs."""
    source = settings["teacher"]["source"]
    root = Path(workdir)
    if source == "world":
        built = root / "results" / exp / "world" / "teacher_config.json"
        if built.is_file():
            return _read_config(built), str(built)
        module = importlib.import_module(COMMANDS["world"][0])
        world_class = world_class or module.WorldArgs
        hints = {f.name: f.type for f in dataclasses.fields(world_class)}
        flags = {k: v for k, v in (settings.get("world") or {}).items() if k in hints and v is not None}
        try:
            world = world_class(**(flags | {"out": Path("world")}))
            sizes, vocab = world.teacher_sizes(), world.resolved_size().vocab_size
        except (LRCError, TypeError):
            return None  # the world section's own problem is reported by its dataclass check
        # The world's library (lrc.world, reached through its command): its teacher is a tied llama over
        # the world's tokenizer (the vocabulary it is trained to; its special tokens may add a few).
        library = inspect.getmodule(module.generate)
        limit = getattr(library, "MAX_POSITIONS", None)
        preset = {"model_type": "llama", **sizes, "vocab_size": vocab, "tie_word_embeddings": True}
        return preset | {"max_position_embeddings": limit}, "the world's teacher preset"
    for file in teacher_config_places(exp, settings["teacher"], root):
        if file.is_file():
            return _read_config(file), str(file)
    return None


def teacher_parameters(exp: str, settings: dict, workdir: Path | str) -> int | None:
    """The teacher's parameter count, from its config where it is known before any job runs, else None."""
    try:
        known = known_teacher_config(exp, settings, workdir)
    except LRCError:
        return None  # the config check names the problem
    if known is None or not known[0].get("model_type"):
        return None
    return llama_family_parameters(known[0]) or meta_parameters(known[0])


def meta_parameters(config: dict) -> int | None:
    """The parameter count of the model transformers builds from ``config``, on the meta device (no
    memory, transformers' own layer shapes); None where it cannot build one."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version")}
    try:
        model_config = AutoConfig.for_model(config["model_type"], **values)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_config)
    except Exception:  # noqa: BLE001 (an unusual config: the resources keep their plain defaults)
        return None
    return sum(p.numel() for p in model.parameters())


def llama_family_parameters(config: dict) -> int | None:
    """A Llama's or Qwen2's parameter count, read off its config: the count every dry run needs, without
    importing transformers (1.7 of a dry run's 5 s). Embeddings, the head unless tied; per layer q, k,
    v, o (Qwen2: q, k and v biases; Llama: ``attention_bias`` on all four), the gated MLP (``mlp_bias``)
    and two norms; the final norm. None for another model type or a config that leaves a size to
    transformers' defaults: :func:`meta_parameters` counts those, and a test holds both equal."""
    sizes = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "vocab_size", "tie_word_embeddings")
    kind = config.get("model_type")
    if kind not in ("llama", "qwen2") or any(config.get(k) is None for k in sizes):
        return None
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, config["num_key_value_heads"] * head_dim
    attention = 2 * hidden * q + 2 * hidden * kv
    if kind == "qwen2":
        attention += q + 2 * kv
    elif config.get("attention_bias"):
        attention += q + 2 * kv + hidden
    width = config["intermediate_size"]
    mlp = 3 * hidden * width + (2 * width + hidden if kind == "llama" and config.get("mlp_bias") else 0)
    embeddings = config["vocab_size"] * hidden * (1 if config["tie_word_embeddings"] else 2)
    return embeddings + config["num_hidden_layers"] * (attention + mlp + 2 * hidden) + hidden


def _read_config(file: Path) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise LRCError(f"{file}: not a model config ({err})") from err
    if not isinstance(data, dict):
        raise LRCError(f"{file}: not a model config (a JSON object)")
    return data


def head_problems(exp: str, settings: dict, teacher: dict, where: str) -> list[str]:
    """The student width against the teacher's attention heads. The student's config is the teacher's
    with hidden_size r and head_dim written explicitly (lrc.method.student.student_config, whose
    teacher_head_dim this repeats), so the student itself takes any r; `lrc merge` reloads the merged
    model through transformers, whose config class is the arbiter (LlamaConfig: r a multiple of the
    heads; Qwen2Config, in transformers 5, takes any r)."""
    r, heads = settings["student"]["hidden_size"], teacher.get("num_attention_heads")
    if not isinstance(heads, int) or heads < 1 or r % heads == 0 or not teacher.get("model_type"):
        return []
    head_dim = teacher.get("head_dim") or teacher["hidden_size"] // heads
    try:
        from transformers import AutoConfig

        AutoConfig.for_model(teacher["model_type"], hidden_size=r, num_attention_heads=heads, head_dim=head_dim,
                             num_key_value_heads=teacher.get("num_key_value_heads") or heads)
    except Exception as err:  # noqa: BLE001 (transformers' own validation error types vary)
        below = r - r % heads
        return [f"experiments.{exp}.student.hidden_size: {r} is not a multiple of the teacher's {heads} attention "
                f"heads (from {where}): `lrc merge` could not reload the merged {teacher['model_type']} model "
                f"({str(err).strip().splitlines()[-1].strip()}); use a multiple, e.g. {below or heads} or "
                f"{below + heads}"]
    return []


def seq_len_problems(exp: str, settings: dict, teacher: dict, where: str) -> list[str]:
    """Each tokenised sequence must fit the teacher's positions."""
    limit = teacher.get("max_position_embeddings")
    if not isinstance(limit, int):
        return []
    problems = []
    for kind, flags in ((settings.get("data") or {}).items()):
        seq_len = (flags or {}).get("seq_len")
        if isinstance(seq_len, int) and seq_len > limit:
            problems.append(f"experiments.{exp}.data.{kind}.seq_len: {seq_len} exceeds the teacher's "
                            f"max_position_embeddings {limit} (from {where})")
    return problems


# ------------------------------------------------------------------ batches and budgets


def batch_problems(exp: str, settings: dict, classes: dict[str, type], distill_tokens: list[int]) -> list[str]:
    """batch_size a multiple of micro_batch_size x the stage's GPUs (the loop's check, which needs the
    process count), and every token budget buying at least one step of batch_size x seq_len tokens."""
    problems = []
    seq_len = _section(settings, "data.corpus").get("seq_len")
    for dotted, stage, command in TRAINING:
        if command not in classes or (stage == "pretrain" and settings["teacher"]["source"] != "world"):
            continue
        flags = _section(settings, dotted)
        defaults = {f.name: f.default for f in dataclasses.fields(classes[command])}
        batch = flags.get("batch_size", defaults.get("batch_size"))
        micro = flags.get("micro_batch_size", defaults.get("micro_batch_size"))
        gpus = ((settings.get("resources") or {}).get(stage) or {}).get("gpu") or 0
        key = f"experiments.{exp}.{dotted}"
        if all(isinstance(v, int) and v > 0 for v in (batch, micro, gpus)) and batch % (micro * gpus):
            problems.append(f"{key}.batch_size: {batch} must be a multiple of micro_batch_size {micro} times the "
                            f"{gpus} GPUs of resources.{stage}.gpu (one micro-batch per process per accumulation)")
        budgets = {"pretrain": [flags.get("tokens")], "warmstart": [flags.get("tokens")],
                   "distill": distill_tokens}.get(stage, [])
        for tokens in budgets:
            if all(isinstance(v, int) and v > 0 for v in (tokens, batch, seq_len)) and tokens < batch * seq_len:
                where = f"{key}.tokens" if stage != "distill" else f"experiments.{exp}.distill.tokens"
                problems.append(f"{where}: {tokens} buys no optimiser step: one step of {key}.batch_size {batch} x "
                                f"data.corpus.seq_len {seq_len} takes {batch * seq_len} tokens")
    return problems


# ------------------------------------------------------------------ the records and the separator


def data_problems(exp: str, settings: dict, workdir: Path | str) -> list[str]:
    """text_field / messages_field and separator of each tokenised data set, where knowable."""
    problems = []
    root = Path(workdir)
    world = settings["teacher"]["source"] == "world"
    for kind, flags in (settings.get("data") or {}).items():
        flags = flags or {}
        key = f"experiments.{exp}.data.{kind}"
        chat = kind == "sft" or bool(flags.get("chat"))
        option = "messages_field" if chat else "text_field"
        field_name = flags.get(option, "messages" if chat else "text")
        record = None
        if world and kind in WORLD_FIELDS:
            source = root / "results" / exp / "world" / kind / "train.jsonl"
            record = _first_record(source) or {WORLD_FIELDS[kind][1]: ""}
            source_name = f"the world's {kind} records"
        elif flags.get("source") and str(flags["source"]).endswith(".jsonl"):
            source = Path(flags["source"]) if Path(flags["source"]).is_absolute() else root / flags["source"]
            record, source_name = _first_record(source), str(flags["source"])
        if record is not None and isinstance(field_name, str) and not _has_field(record, field_name):
            problems.append(f"{key}.{option}: the records of {source_name} have no field {field_name!r} "
                            f"(they hold {', '.join(map(repr, record))})")
        if "separator" in flags:
            problem = separator_problem(flags["separator"], _tokenizer_file(exp, settings, root))
            if problem:
                problems.append(f"{key}.separator: {problem}")
    return problems


def _first_record(path: Path) -> dict | None:
    try:
        with path.open(encoding="utf-8") as f:
            line = next((line for line in f if line.strip()), None)
        record = json.loads(line) if line else None
    except (OSError, ValueError):
        return None  # the job names an unreadable file itself
    return record if isinstance(record, dict) else None


def _has_field(record: dict, dotted: str) -> bool:
    value: Any = record
    for part in dotted.split("."):  # lrc.io.sources.record_field's dotted lookup
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


def _tokenizer_file(exp: str, settings: dict, root: Path) -> Path | None:
    source = settings["teacher"]["source"]
    places = [root / "results" / exp / ("world/tokenizer" if source == "world" else "teacher")]
    path = (settings["teacher"].get("local") or {}).get("path") if source == "local" else None
    if path:
        places.append(Path(path) if Path(path).is_absolute() else root / path)
    return next((p / "tokenizer.json" for p in places if (p / "tokenizer.json").is_file()), None)


def separator_problem(value: Any, tokenizer_file: Path | None) -> str | None:
    """A separator that is neither a rule nor (where the tokenizer is known) a token of its vocabulary;
    without the tokenizer, a misspelt rule (``eos_bos``, ``Auto``)."""
    text = str(value)
    if text in SEPARATOR_RULES:
        return None
    if tokenizer_file is not None:
        try:
            data = json.loads(tokenizer_file.read_text(encoding="utf-8"))
            vocab = data.get("model", {}).get("vocab") or {}
            tokens = set(vocab) if isinstance(vocab, dict) else {v[0] for v in vocab}
            tokens |= {t.get("content") for t in data.get("added_tokens") or []}
        except (OSError, ValueError, AttributeError, TypeError, IndexError):
            return None  # the job reads the tokenizer itself
        if text not in tokens:
            return (f"{text!r} is not a token of the tokenizer {tokenizer_file} (give a token of its vocabulary, "
                    f"{' or '.join(map(repr, SEPARATOR_RULES))})")
        return None
    normal = text.strip().lower().replace("_", "-").replace("+", "-").replace(" ", "-")
    if normal in SEPARATOR_RULES:
        return f"{text!r} is not a separator rule: did you mean {normal!r}?"
    return None
