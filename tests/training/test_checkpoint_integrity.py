"""Nothing silently wrong in a checkpoint (issue 28): its directory is keyed by its inputs' content,
not their timestamps; a flipped bit in a saved file is caught before reuse; weights trained by other
code are reused with a warning and credited to the code that trained them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from lrc.io import provenance
from lrc.io.provenance import SETTINGS_FILE, write_settings
from lrc.io.tokens import open_token_data, write_tokens
from lrc.method.objectives import LMObjective
from lrc.training import checkpoint as ckpt
from lrc.training.loop import TrainArgs, train
from lrc.training.outputs import save_hf_output
from tests.helpers import SEQ, RandomTokens, tiny_llama

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
ARGS = dict(tokens=SEQ * 8 * STEPS, batch_size=8, micro_batch_size=4, lr=3e-3, warmup=0.1, log_every=1,
            checkpoint_every=2, progress=False)


def run(out: Path, **changes) -> tuple[dict, dict[str, torch.Tensor]]:
    model = tiny_llama()
    summary = train(LMObjective(model), model, RandomTokens(rows=24), TrainArgs(**(ARGS | changes)), out)
    return summary, {n: p.detach().clone() for n, p in model.named_parameters()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


# ---------------------------------------------------------------- A: the key hashes content


def ckpt_dir(*args) -> str:
    """The rules' shell helper, as a job runs it."""
    helpers = ROOT / "workflow" / "scripts" / "shell_helpers.sh"
    script = f'export LRC_REPO="{ROOT}"; source "{helpers}"; ckpt_dir "$@"'
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", script, "ckpt_dir", *args], capture_output=True, text=True, check=True,
                          env=env).stdout


@contextlib.contextmanager
def clock(when: str):
    """settings.json's ``created`` reads ``when``."""
    class Fixed:
        @staticmethod
        def now(tz=None):
            return datetime.fromisoformat(when).replace(tzinfo=timezone.utc)

    old, provenance.datetime = provenance.datetime, Fixed
    try:
        yield
    finally:
        provenance.datetime = old


def build_teacher(out: Path, when: str, tokens_per_s: float) -> None:
    """A teacher output as `lrc pretrain` writes it: same weights, other timings and creation time."""
    out.parent.mkdir(parents=True, exist_ok=True)
    metrics = out.parent / f"metrics-{tokens_per_s}.jsonl"
    metrics.write_text(json.dumps({"step": 1, "loss": 2.0, "tokens_per_s": tokens_per_s}) + "\n")
    summary = {"steps": 1, "tokens_per_s": tokens_per_s, "peak_memory_mib": tokens_per_s / 7,
               "metrics": str(metrics), "already_done": False}
    with clock(when):
        save_hf_output(tiny_llama(), None, out, command="pretrain", settings={"seed": 0}, summary=summary)
    (out / ".snakemake_timestamp").write_text(when)


def build_corpus(out: Path, when: str) -> None:
    """A token directory opened once (its verified.json stamp holds mtimes) with its settings.json."""
    rows = np.random.default_rng(0).integers(0, 90, size=(12, SEQ))
    write_tokens(out / "train", rows, source="random")
    open_token_data(out)
    with clock(when):
        write_settings(out, "tokenize", {"seed": 0})


def test_a_byte_identical_rebuilt_input_keeps_its_checkpoint_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    teacher, corpus = tmp_path / "results/x/teacher", tmp_path / "results/x/data/corpus"
    build_teacher(teacher, "2026-01-01T10:00:00", 1000.0)
    build_corpus(corpus, "2026-01-01T10:00:00")
    key = ckpt_dir("results/x/warmstart/lrc", "64", "--lr 0.1", "--", str(teacher), str(corpus))
    assert key.startswith("checkpoints/x/warmstart/lrc/") and len(key.rsplit("/", 1)[1]) == 12
    before = [(teacher / SETTINGS_FILE).read_text(), (corpus / "train" / "verified.json").read_text(),
              (corpus / SETTINGS_FILE).read_text()]
    shutil.rmtree(teacher)
    shutil.rmtree(corpus)
    build_teacher(teacher, "2026-03-04T11:12:13", 1234.5)  # rebuilt: the same bytes, other records
    build_corpus(corpus, "2026-03-04T11:12:13")
    assert (teacher / SETTINGS_FILE).read_text() != before[0]
    assert (corpus / "train" / "verified.json").read_text() != before[1]  # its mtimes
    assert (corpus / SETTINGS_FILE).read_text() != before[2]
    assert ckpt_dir("results/x/warmstart/lrc", "64", "--lr 0.1", "--", str(teacher), str(corpus)) == key
    # Every param still counts, and so does the order of the inputs.
    assert ckpt_dir("results/x/warmstart/lrc", "32", "--lr 0.1", "--", str(teacher), str(corpus)) != key
    assert ckpt_dir("results/x/warmstart/lrc", "64", "--lr 0.2", "--", str(teacher), str(corpus)) != key
    assert ckpt_dir("results/x/warmstart/lrc", "64", "--lr 0.1", "--", str(corpus), str(teacher)) != key


def test_a_changed_input_changes_the_key_even_with_its_size_and_mtime_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    teacher = tmp_path / "results/x/teacher"
    build_teacher(teacher, "2026-01-01T10:00:00", 1000.0)
    args = ("results/x/distill/r", "--lr 0.1", "--", str(teacher))
    key = ckpt_dir(*args)
    assert ckpt_dir(*args) == key  # the second time from the hash cache
    weights = teacher / "model.safetensors"
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight
    with open(weights, "r+b") as fh:  # rewritten in place: same inode and size, mtime set back
        fh.write(data)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    changed = ckpt_dir(*args)
    assert changed != key
    assert (tmp_path / "checkpoints" / ".content-hashes.json").is_file()  # (the cache was there, and missed it)
    (teacher / "extra.json").write_text("{}")  # a new file counts; a new record does not
    assert ckpt_dir(*args) not in (key, changed)
    (teacher / "extra.json").unlink()
    (teacher / "metrics.jsonl").write_text('{"step": 1, "tokens_per_s": 5}\n')
    assert ckpt_dir(*args) == changed


# ---------------------------------------------------------------- B: bit rot is caught before reuse


def flip_last_float(path: Path) -> None:
    """Set the last fp32 value of a safetensors file to 3e38: it still loads, with every name and shape."""
    data = bytearray(path.read_bytes())
    data[-4:] = struct.pack("<f", 3e38)
    path.write_bytes(bytes(data))
    assert max(float(t.abs().max()) for t in load_file(str(path)).values()) == pytest.approx(3e38, rel=1e-6)


def flip_in_optimizer(path: Path) -> None:
    """Change one byte inside a tensor of accelerate's optimizer.bin (a stored zip): it still loads."""
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if "/data/" in i.filename and i.file_size >= 4)
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len] ^= 0x40
    path.write_bytes(bytes(data))
    torch.load(path, map_location="cpu", weights_only=False)


def test_a_flipped_float_in_a_finished_checkpoint_is_caught_and_the_run_retrained(tmp_path, capsys):
    _, straight = run(tmp_path / "out", keep_checkpoints="final")
    final = tmp_path / "out.ckpt" / ckpt.step_dir_name(STEPS)
    flip_last_float(final / ckpt.TRAINABLE_FILE)
    capsys.readouterr()
    again, weights = run(tmp_path / "out", keep_checkpoints="final")
    err = capsys.readouterr().err
    assert f"checkpoint {final} is damaged: {final / ckpt.TRAINABLE_FILE} content changed since it was saved" in err
    assert "starting afresh" in err and "training already finished" not in err
    assert not again["already_done"] and again["resumed_from"] is None
    assert same(straight, weights)  # retrained: the rot never reaches the output
    assert (tmp_path / "out.ckpt" / ("damaged-" + final.name) / ckpt.TRAINABLE_FILE).is_file()
    # Every file was hashed when saved; stripping to the final weights keeps the record.
    assert set(ckpt.read_state(final)["files"]) == {ckpt.TRAINABLE_FILE, ckpt.OPTIMIZER_FILE, ckpt.SCHEDULER_FILE,
                                                    ckpt.RNG_FILE.format(0)}


@pytest.mark.parametrize("name, damage", [(ckpt.TRAINABLE_FILE, flip_last_float),
                                          (ckpt.OPTIMIZER_FILE, flip_in_optimizer)])
def test_a_flipped_value_in_the_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys, name, damage):
    _, straight = run(tmp_path / "out", keep_checkpoints="all")
    ckpt_dir_ = tmp_path / "out.ckpt"
    (ckpt_dir_ / ckpt.DONE_FILE).unlink()  # killed just before DONE
    bad = ckpt_dir_ / ckpt.step_dir_name(STEPS) / name
    damage(bad)
    capsys.readouterr()
    again, weights = run(tmp_path / "out", keep_checkpoints="all")
    err = capsys.readouterr().err
    assert f"{bad} content changed since it was saved" in err and "falling back to step-000004" in err
    assert again["resumed_from"] == str(ckpt_dir_ / ckpt.step_dir_name(4)) and same(straight, weights)


def test_a_checkpoint_without_hashes_still_verifies_with_a_warning(tmp_path, capsys):
    run(tmp_path / "out", keep_checkpoints="all")
    step_dir = tmp_path / "out.ckpt" / ckpt.step_dir_name(STEPS)
    state = ckpt.read_state(step_dir)
    (step_dir / ckpt.TRAINER_STATE_FILE).write_text(json.dumps({k: v for k, v in state.items() if k != "files"}))
    expect = dict(trainable={n: tuple(p.shape) for n, p in tiny_llama().named_parameters()}, optimizer_params=None,
                  processes=1)
    capsys.readouterr()
    ckpt.verify_checkpoint(step_dir, **expect)
    assert "records no content hashes" in capsys.readouterr().err


# ---------------------------------------------------------------- C: weights of other code


def as_code(monkeypatch, revision: str, source: str) -> None:
    monkeypatch.setattr(provenance, "git_revision", lambda: revision)
    monkeypatch.setattr(provenance, "source_sha256", lambda: source * 64, raising=False)


def settings_of(tmp_path: Path, summary: dict) -> dict:
    out = tmp_path / "written"
    write_settings(out, "distill", {"seed": 0}, training=summary)
    return json.loads((out / SETTINGS_FILE).read_text())


def test_a_finished_run_of_other_code_is_reused_with_a_warning_and_credited_to_that_code(tmp_path, capsys,
                                                                                           monkeypatch):
    as_code(monkeypatch, "aaaa111", "a")
    first, straight = run(tmp_path / "out")
    as_code(monkeypatch, "bbbb222", "b")  # a code change, then `--forcerun`
    capsys.readouterr()
    again, weights = run(tmp_path / "out")
    err = capsys.readouterr().err
    assert again["already_done"] and same(straight, weights)
    assert "finished training with other code (revision aaaa111" in err and "this is revision bbbb222" in err
    assert f"delete {tmp_path / 'out.ckpt'}" in err
    record = settings_of(tmp_path, again)
    assert record["git_revision"] == "aaaa111" and record["source_sha256"] == "a" * 64
    assert record["written_by"]["git_revision"] == "bbbb222"
    assert record["training"]["trained_by"][0]["git_revision"] == "aaaa111"
    as_code(monkeypatch, "aaaa111", "a")  # the first run's own record
    assert [c["git_revision"] for c in first["trained_by"]] == ["aaaa111"]
    assert settings_of(tmp_path, first)["git_revision"] == "aaaa111"
    assert "written_by" not in settings_of(tmp_path, first)
    # The same code again (a commit that changes no source is the same code): silent, nothing credited elsewhere.
    as_code(monkeypatch, "cccc333", "a")
    capsys.readouterr()
    third, _ = run(tmp_path / "out")
    assert third["already_done"] and "other code" not in capsys.readouterr().err
    assert settings_of(tmp_path, third)["git_revision"] == "cccc333"


def test_a_run_resumed_across_a_code_change_lists_both_codes(tmp_path, capsys, monkeypatch):
    as_code(monkeypatch, "aaaa111", "a")
    _, straight = run(tmp_path / "out", keep_checkpoints="all")
    ckpt_dir_ = tmp_path / "out.ckpt"
    (ckpt_dir_ / ckpt.DONE_FILE).unlink()  # killed after step 4: only that one left
    shutil.rmtree(ckpt_dir_ / ckpt.step_dir_name(STEPS))
    as_code(monkeypatch, "bbbb222", "b")
    capsys.readouterr()
    again, weights = run(tmp_path / "out", keep_checkpoints="all")
    err = capsys.readouterr().err
    assert "resuming checkpoint" in err and "aaaa111" in err and "bbbb222" in err
    assert not again["already_done"] and same(straight, weights)
    assert [c["git_revision"] for c in again["trained_by"]] == ["aaaa111", "bbbb222"]
    record = settings_of(tmp_path, again)
    assert record["git_revision"] == "aaaa111+bbbb222" and record["written_by"]["git_revision"] == "bbbb222"


def test_the_source_hash_names_the_code_that_runs():
    identity = provenance.code_identity()
    assert len(identity["source_sha256"]) == 64 and identity["lrc_version"]
    assert provenance.same_code(identity, dict(identity, git_revision="other"))  # no code changed
    assert not provenance.same_code(identity, dict(identity, source_sha256="0" * 64))
    # A reused run whose DONE predates the record: its code is unknown, and settings.json says so.
    fields = provenance.weights_code({"already_done": True}, identity)
    assert fields["git_revision"] == "unrecorded" and fields["written_by"] == identity
