"""Reachability audit: the paper's stranded fractions, occupancy and knockout."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from lrc.cli import main as lrc_main
from lrc.commands.merge import save_merged
from lrc.errors import LRCError
from lrc.method.reach import apply_arm
from lrc.method.reachability import (
    mlp_stranded_fraction,
    occupancy,
    reachability_table,
    read_teacher_config,
)
from lrc.method.student import build_student, trainable_parameters
from tests.helpers import make_teacher

TEACHERS = Path(__file__).resolve().parents[2] / "config" / "teachers"


@pytest.mark.parametrize(
    "name, r, stranded",
    [("llama3.2-3b", 1536, "62.5%"), ("llama3.1-8b", 2560, "71.4%"), ("qwen2.5-3b", 1200, "81.4%")],
)
def test_audit_prints_the_paper_stranded_fractions(name, r, stranded, tmp_path, capsys):
    path = TEACHERS / f"{name}.json"
    assert lrc_main(["audit", str(path), "--student-hidden", str(r), "--csv", str(tmp_path / "a.csv")]) == 0
    out = capsys.readouterr().out
    assert f"MLP stranded fraction under plain LRC: {stranded}" in out
    rows = {row["weight"]: row for row in csv.DictReader((tmp_path / "a.csv").open())}
    for w in ("gate_proj", "up_proj", "down_proj"):
        assert f"{100 * float(rows[w]['stranded']):.1f}%" == stranded
        assert (int(rows[w]["reach_slice"]) == int(rows[w]["reach_confined"])
                < int(rows[w]["reach_dense"]) == int(rows[w]["deployed"]))
    assert float(rows["q_proj"]["u"]) == 1.0  # n_h * h_d = H


def test_shipped_teacher_configs_have_the_published_dimensions():
    want = {
        "llama3.2-3b": (3072, 8192, 28, 24, 8, 128256, True),
        "llama3.1-8b": (4096, 14336, 32, 32, 8, 128256, False),
        "qwen2.5-3b": (2048, 11008, 36, 16, 2, 151936, True),
    }
    for name, dims in want.items():
        c = read_teacher_config(TEACHERS / f"{name}.json")
        got = (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"],
               c["num_key_value_heads"], c["vocab_size"], c["tie_word_embeddings"])
        assert got == dims, name
    assert read_teacher_config(TEACHERS / "qwen2.5-3b.json")["rms_norm_eps"] == 1e-6


def test_table_numbers_follow_the_definitions():
    cfg = read_teacher_config(TEACHERS / "llama3.2-3b.json")
    rows = {row["weight"]: row for row in reachability_table(cfg, 1536)}
    assert rows["gate_proj"]["reach_slice"] == 3072 * 1536 and rows["gate_proj"]["deployed"] == 8192 * 1536
    assert rows["embed_tokens"]["u"] == pytest.approx(3072 / 128256)
    assert rows["k_proj"]["u"] == 1.0
    assert mlp_stranded_fraction(cfg, 1536) == pytest.approx(1 - 3072 / 8192)


def test_bad_audit_input(tmp_path):
    with pytest.raises(LRCError, match="3072"):
        reachability_table(read_teacher_config(TEACHERS / "llama3.2-3b.json"), 3072)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "hidden_size": 8}')
    with pytest.raises(LRCError, match="gpt2"):
        read_teacher_config(tmp_path)
    assert lrc_main(["audit", str(TEACHERS / "llama3.2-3b.json"), "--student-hidden", "16",
                     "--knockout", str(tmp_path / "k")]) == 2
    assert lrc_main(["audit", str(TEACHERS / "llama3.2-3b.json"), "--student-hidden", "16",
                     "--occupancy-csv", str(tmp_path / "o.csv")]) == 2
    assert not (tmp_path / "o.csv").exists()


def test_occupancy_and_knockout(tmp_path, token_batch, capsys):
    teacher = make_teacher("llama-untied")
    teacher.save_pretrained(tmp_path / "teacher")
    student = build_student(teacher, 16, seed=1)
    apply_arm(student, teacher, "dense")
    with torch.no_grad():
        for name, p in trainable_parameters(student):
            if "mlp" in name:
                p.add_(0.01 * torch.randn_like(p))
    save_merged(student, tmp_path / "merged", check_ids=token_batch)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    occ = occupancy(teacher, merged)
    assert len(occ) == 2 * 3 and all(0.05 < r["occupancy"] < 1 for r in occ)
    argv = ["audit", str(tmp_path / "teacher"), "--student-hidden", "16", "--student", str(tmp_path / "merged"),
            "--knockout", str(tmp_path / "ko"), "--occupancy-csv", str(tmp_path / "occ" / "run.csv")]
    assert lrc_main(argv) == 0
    assert "student MLP energy outside the teacher's spaces" in capsys.readouterr().out
    with (tmp_path / "occ" / "run.csv").open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == ("layer", "weight", "energy", "outside", "occupancy")
        rows = list(reader)
    assert [(int(r["layer"]), r["weight"]) for r in rows] == [(i, w) for i in (0, 1)
                                                              for w in ("gate_proj", "up_proj", "down_proj")]
    for row, want in zip(rows, occ):  # the rows occupancy() measures, at full precision
        assert float(row["energy"]) == want["energy"] and float(row["outside"]) == want["outside"]
        assert float(row["occupancy"]) == pytest.approx(float(row["outside"]) / float(row["energy"]), rel=1e-12)
    ko = AutoModelForCausalLM.from_pretrained(tmp_path / "ko", dtype=torch.float32)
    assert all(r["occupancy"] < 1e-10 for r in occupancy(teacher, ko))
    assert (tmp_path / "ko" / "settings.json").is_file()
    # the knockout only removed the MLP complement: attention is untouched
    torch.testing.assert_close(ko.model.layers[0].self_attn.q_proj.weight,
                               merged.model.layers[0].self_attn.q_proj.weight)
    # a slice student has nothing outside, so its knockout changes nothing
    plain = build_student(teacher, 16, seed=1)
    save_merged(plain, tmp_path / "plain", check_ids=token_batch)
    plain_merged = AutoModelForCausalLM.from_pretrained(tmp_path / "plain", dtype=torch.float32)
    assert max(r["occupancy"] for r in occupancy(teacher, plain_merged)) < 1e-10
    # a config file alone has no weights to measure against
    assert lrc_main(["audit", str(tmp_path / "teacher" / "config.json"), "--student-hidden", "16",
                     "--student", str(tmp_path / "merged")]) == 2
    assert "checkpoint directory" in capsys.readouterr().err
