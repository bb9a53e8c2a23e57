"""`lrc <command> --help`: the command's own options first, then one section per options class it
takes from the library (training, recipe), each option once."""

from __future__ import annotations

import dataclasses
import re

import pytest

from lrc.cli import COMMANDS, main
from lrc.commands.distill import DistillArgs


def help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main([command, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_distill_help_puts_its_own_options_before_the_training_and_recipe_sections(capsys):
    text = help_text("distill", capsys)
    sections = re.findall(r"^(\S[^\n]*):$", text, flags=re.MULTILINE)
    assert sections == ["options", "lrc.training.args.TrainArgs", "lrc.method.clone.RecipeArgs"]
    own = text.split("\noptions:\n")[1].split("\nlrc.training.args.TrainArgs:")[0]
    assert "--arm ARM" in own and "--warmstart" in own
    assert "--lr " not in own and "--recipe " not in own  # in their own sections
    for f in dataclasses.fields(DistillArgs):
        flag = "--" + f.name.replace("_", "-")
        assert len(re.findall(rf"^  {re.escape(flag)}[ ,\n]", text, flags=re.MULTILINE)) == 1, flag


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_prints_its_help(command, capsys):
    text = help_text(command, capsys)
    assert text.startswith(f"usage: lrc {command}") and "\noptions:\n" in text
