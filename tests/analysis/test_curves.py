"""`lrc curves`: each run's metrics.jsonl, one panel per logged term, one line per run."""

from __future__ import annotations

import json

import pytest

from lrc.analysis.curves import draw_curves, read_metrics
from lrc.cli import main as lrc
from lrc.errors import LRCError


def write_run(directory, records):
    directory.mkdir(parents=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def test_each_run_is_a_line_of_its_logged_values(tmp_path):
    lrc_run = write_run(tmp_path / "lrc-dense-s0-t800", [
        {"step": 2, "tokens": 200, "loss": 3.0, "ce": 2.0, "mlp_out": 0.5},
        {"step": 1, "tokens": 100, "loss": 4.0, "ce": 2.5, "mlp_out": 0.7}])
    kl_run = write_run(tmp_path / "kl-slice-s0-t800", [{"step": 1, "tokens": 100, "loss": 0.2, "ce": 2.6}])
    runs = {p.name: read_metrics(p) for p in (lrc_run, kl_run)}
    assert [r["step"] for r in runs["lrc-dense-s0-t800"]] == [1, 2]  # in step order
    figure = draw_curves(runs, ("loss", "ce", "mlp_out", "never_logged"))
    axes = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["loss", "ce", "mlp_out"]
    loss = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axes[0].lines}
    assert loss == {"lrc-dense-s0-t800": ([100, 200], [4.0, 3.0]), "kl-slice-s0-t800": ([100], [0.2])}
    assert [line.get_label() for line in axes[2].lines] == ["lrc-dense-s0-t800"]  # the kl run has no clone term
    assert axes[0].lines[1].get_linestyle() == "--"  # the kl recipe dashed

    out = tmp_path / "curves.png"
    assert lrc(["curves", "--runs", str(lrc_run), str(kl_run / "metrics.jsonl"), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(LRCError, match="no metrics.jsonl"):
        read_metrics(tmp_path)
    run = write_run(tmp_path / "run", [{"step": 1, "tokens": 10, "loss": 1.0}])
    (run / "metrics.jsonl").write_text('{"step": 1}\nnot json\n')
    with pytest.raises(LRCError, match=r"metrics.jsonl:2: not a JSON line"):
        read_metrics(run)
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(LRCError, match="no logged step"):
        read_metrics(run)
    with pytest.raises(LRCError, match="none of the terms loss was logged"):
        draw_curves({"run": [{"step": 1, "tokens": 1, "ce": 1.0}]}, ("loss",))
