"""Config values that a job would refuse (or silently misread) are refused before any job runs, naming
the key: the options dataclasses' own validation (lrc.training.args, lrc merge's options) through the
workflow check and the command line, the cross-checks of lrc.workflow.value_checks, and the YAML reader
that refuses a key given twice and names a non-UTF-8 file (lrc.options.read_yaml)."""

from __future__ import annotations

import pytest
import yaml

from lrc.cli import main
from lrc.workflow import config as wc
from tests.workflow_helpers import ROOT, default_config, rule_shells


def problems(edit, config=None, exp="tiny"):
    """The config check run from an empty project directory: results a quick start left in the checkout
    (its built tokenizer, its world) must not change what the check can know."""
    import tempfile

    config = config or default_config()
    edit(config["experiments"][exp])
    with tempfile.TemporaryDirectory() as workdir:
        return wc.config_problems(config, rule_shells(), workdir=workdir, repo=ROOT)


def paper(name="llama3.2-3b"):
    return yaml.safe_load((ROOT / "config" / "paper" / f"{name}.yaml").read_text())


BAD_VALUES = [
    ("warm-start lr", lambda x: x["warmstart"].update(lr=-0.1),
     "experiments.tiny.warmstart.lr: --lr must be a positive number, got -0.1"),
    ("negative grad clip", lambda x: x["distill"]["train"].update(grad_clip=-1),
     "experiments.tiny.distill.train.grad_clip: --grad-clip must be >= 0 (0: no clipping), got -1"),
    ("micro-batch not dividing", lambda x: x["warmstart"].update(micro_batch_size=3),
     "experiments.tiny.warmstart.batch_size: --batch-size 2 must be a multiple of --micro-batch-size 3"),
    ("negative eps", lambda x: x["sft"]["train"].update(eps=-1e-8),
     "experiments.tiny.sft.train.eps: --eps must be a positive number"),
    ("beta of 1", lambda x: x["teacher"]["pretrain"].update(betas=[0.9, 1.0]),
     "experiments.tiny.teacher.pretrain.betas: --betas must lie in [0, 1)"),
    ("negative merge atol", lambda x: x.update(merge={"atol": -1}),
     "experiments.tiny.merge.atol: --atol must be >= 0, got -1"),
    ("student width not a multiple of the heads", lambda x: x["student"].update(hidden_size=66),
     "experiments.tiny.student.hidden_size: 66 is not a multiple of the teacher's 4 attention heads"),
    ("seq_len beyond the world teacher's positions", lambda x: x["data"]["corpus"].update(seq_len=512),
     "experiments.tiny.data.corpus.seq_len: 512 exceeds the teacher's max_position_embeddings 256"),
    ("text_field typo", lambda x: x["data"]["corpus"].update(text_field="txt"),
     "experiments.tiny.data.corpus.text_field: the records of the world's corpus records have no field 'txt'"),
    ("messages_field typo", lambda x: x["data"]["sft"].update(messages_field="message"),
     "experiments.tiny.data.sft.messages_field: the records of the world's sft records have no field 'message'"),
    ("separator typo", lambda x: x["data"]["corpus"].update(separator="eos_bos"),
     "experiments.tiny.data.corpus.separator: 'eos_bos' is not a separator rule: did you mean 'eos-bos'?"),
    ("budget buying no step", lambda x: x["warmstart"].update(tokens=200),
     "experiments.tiny.warmstart.tokens: 200 buys no optimiser step"),
]


@pytest.mark.parametrize("what, edit, message", BAD_VALUES, ids=[w for w, *_ in BAD_VALUES])
def test_a_value_a_job_would_refuse_is_refused_before_any_job(what, edit, message):
    found = problems(edit)
    assert any(message in p for p in found), found


def test_good_neighbours_of_the_bad_values_pass():
    def edit(x):
        x["distill"]["train"].update(grad_clip=0)  # 0: no clipping, as documented
        x["student"].update(hidden_size=60)  # a multiple of the world teacher's 4 heads
        x["data"]["corpus"].update(seq_len=256, separator="eos-bos", text_field="text")
        x.update(merge={"atol": 0})
    assert problems(edit) == []


def test_a_paper_teacher_is_checked_from_its_known_config():
    found = problems(lambda x: x["student"].update(hidden_size=1540), paper(), "llama3.2-3b")
    assert any(p.startswith("experiments.llama3.2-3b.student.hidden_size: 1540 is not a multiple of the teacher's "
                            "24 attention heads (from") and "llama3.2-3b.json" in p for p in found), found
    found = problems(lambda x: x["data"]["corpus"].update(seq_len=40000), paper("qwen2.5-3b"), "qwen2.5-3b")
    assert any(p.startswith("experiments.qwen2.5-3b.data.corpus.seq_len: 40000 exceeds the teacher's "
                            "max_position_embeddings 32768") for p in found), found


def test_a_batch_must_split_over_the_stages_gpus():
    # 24 sequences = 3 per GPU x 8 GPUs; 12 cannot be split so (the loop's check, at the job).
    found = problems(lambda x: x["distill"]["train"].update(batch_size=12), paper(), "llama3.2-3b")
    assert any(p.startswith("experiments.llama3.2-3b.distill.train.batch_size: 12 must be a multiple of "
                            "micro_batch_size 3 times the 8 GPUs of resources.distill.gpu") for p in found), found


# ---------------------------------------------------------------- the command line


def test_the_command_line_refuses_the_same_values_before_any_work(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["merge", "--state", "s", "--teacher", "t", "--out", str(out), "--atol", "-1"]) == 2
    assert "--atol must be >= 0, got -1.0" in capsys.readouterr().err
    common = ["--teacher", "t", "--data", "d", "--out", str(out), "--student-hidden", "8"]
    assert main(["warmstart", *common, "--lr", "-0.1"]) == 2
    assert "--lr must be a positive number, got -0.1" in capsys.readouterr().err
    assert main(["warmstart", *common, "--grad-clip", "-1"]) == 2
    assert "--grad-clip must be >= 0" in capsys.readouterr().err
    assert main(["warmstart", *common, "--batch-size", "8", "--micro-batch-size", "3"]) == 2
    assert "--batch-size 8 must be a multiple of --micro-batch-size 3" in capsys.readouterr().err
    assert not out.exists()


# ---------------------------------------------------------------- YAML files


def test_a_key_given_twice_is_refused_naming_the_key_and_file(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("atol: 1e-5\ncheck_rows: 2\natol: 1e-3\n")
    assert main(["merge", "--config", str(config), "--state", "s", "--teacher", "t", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"invalid config file {config}, line 3" in err and "key 'atol' given twice" in err, err
    workflow = tmp_path / "w.yaml"
    workflow.write_text("experiments:\n  tiny:\n    student: {hidden_size: 64}\n    student: {hidden_size: 32}\n")
    problem = wc.yaml_syntax_problem(workflow)
    assert problem and problem.startswith(f"invalid config file {workflow}, line 4") and "'student'" in problem


def test_a_non_utf8_file_is_refused_naming_the_file(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_bytes("# settings\natol: 1e-5 # caf\u00e9\n".encode("latin-1"))
    assert main(["merge", "--config", str(config), "--state", "s", "--teacher", "t", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"invalid config file {config}, line 2: not UTF-8 text (byte 0xe9)" in err, err
    assert wc.yaml_syntax_problem(config) == f"invalid config file {config}, line 2: not UTF-8 text (byte 0xe9); " \
                                             "save it as UTF-8"


def test_yaml_merge_keys_and_the_shipped_configs_still_read(tmp_path):
    from lrc.options import read_yaml

    merged = tmp_path / "m.yaml"
    merged.write_text("base: &b {lr: 0.1, seed: 0}\nrun:\n  <<: *b\n  lr: 0.2\n")
    assert read_yaml(merged)["run"] == {"lr": 0.2, "seed": 0}  # an override of a merged key is no duplicate
    for path in [*(ROOT / "config").glob("*.yaml"), *(ROOT / "config" / "paper").glob("*.yaml")]:
        assert wc.yaml_syntax_problem(path) is None, path
