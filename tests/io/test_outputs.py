"""Outputs own their directory (issue 28): a command replaces only a directory that lrc wrote.

`--out` used to delete whatever directory it named: an experiment's results, a folder of other
files, the working directory. Now every directory written through `atomic_dir` carries a marker
naming its command, and a command refuses (exit 2, before any work, the directory untouched) to
replace anything else: a directory without the marker (other files, or an output of an earlier
lrc), another command's output, `.`, `..`, the working directory or an ancestor, the git checkout,
or a directory holding one of the command's own inputs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lrc.cli import COMMANDS
from lrc.cli import main as lrc
from lrc.errors import LRCError
from lrc.io.atomic import atomic_dir, atomic_file
from lrc.options import OUTPUT_MARKER, args_class, output_owner

ROOT = Path(__file__).resolve().parents[2]
# The smallest world `lrc world` makes: a fraction of a second once its imports are loaded.
TINY_WORLD = ["--size", "test", "--people", "5", "--cities", "4", "--docs-per-person", "1",
              "--valid-docs-per-person", "1", "--eval-docs", "5", "--vocab-size", "300"]
# Commands whose `--out` is a directory they write into file by file, never replace.
WRITES_INTO = {"svd", "recover"}


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None: a directory)."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = lrc(argv)
    return code, capsys.readouterr().err


def world(out: Path | str, *extra: str) -> list[str]:
    return ["world", "--out", str(out), *TINY_WORLD, *extra]


def merge(out: Path | str, state: Path | str = "no-such-state") -> list[str]:
    """`lrc merge` with inputs that do not exist: any work it started would fail on them."""
    return ["merge", "--state", str(state), "--teacher", "no-such-teacher", "--out", str(out)]


def foreign(directory: Path) -> Path:
    """A directory of files that lrc did not write."""
    (directory / "notes").mkdir(parents=True)
    (directory / "notes" / "a.txt").write_text("mine\n")
    (directory / "b.bin").write_bytes(b"\x00\x01")
    return directory


def assert_refused(argv: list[str], capsys, shown: str, why: str) -> str:
    code, err = run(argv, capsys)
    assert code == 2, err
    assert "refusing to replace" in err and shown in err and why in err, err
    assert "no-such" not in err  # refused before the command touched its inputs
    return err


# ---------------------------------------------------------------------------------------------
# A command's own output: marked, replaced by a rerun


def test_output_carries_a_marker_and_a_rerun_replaces_it(tmp_path, capsys):
    out = tmp_path / "world"
    assert run(world(out), capsys)[0] == 0
    assert output_owner(out) == "lrc world"
    assert (out / OUTPUT_MARKER).read_text().startswith("lrc world\n")
    first = tree(out)
    (out / "stale.txt").write_text("from before")
    assert run(world(out), capsys)[0] == 0
    assert tree(out) == first  # replaced: the same bytes, the stray file gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["world"]  # no temporary left


def test_an_empty_directory_is_accepted(tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    assert run(world(out), capsys)[0] == 0
    assert output_owner(out) == "lrc world"


def test_a_directory_of_other_files_is_refused_and_left_intact(tmp_path, capsys):
    out = foreign(tmp_path / "results")
    before = tree(tmp_path)
    err = assert_refused(merge(out), capsys, str(out), f"no {OUTPUT_MARKER} marker")
    assert "earlier version of lrc" in err and f"rm -r {out}" in err  # what an upgrading user does
    assert tree(tmp_path) == before


def test_an_empty_directory_gets_past_the_check(tmp_path, capsys):
    """The refusals above come from the output check, not from the bogus inputs: with an empty
    --out the same command goes on and fails on its inputs."""
    (tmp_path / "empty").mkdir()
    code, err = run(merge(tmp_path / "empty"), capsys)
    assert code != 0 and "refusing" not in err


def test_another_commands_output_is_refused(tmp_path, capsys):
    out = tmp_path / "world"
    assert run(world(out), capsys)[0] == 0
    before = tree(tmp_path)
    assert_refused(merge(out), capsys, str(out), "it is an output of `lrc world`, not of `lrc merge`")
    assert tree(tmp_path) == before


def test_a_file_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("a file")
    assert_refused(merge(out), capsys, str(out), "not a directory")
    assert out.read_text() == "a file"


# ---------------------------------------------------------------------------------------------
# Places never replaced


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """The working directory, two levels down a tree of files: tmp/a/b."""
    foreign(tmp_path / "a")
    cwd = foreign(tmp_path / "a" / "b")
    monkeypatch.chdir(cwd)
    return cwd


@pytest.mark.parametrize("given, why", [
    (".", "it is the current working directory"),
    ("..", "it holds the current working directory"),
    ("CWD", "it is the current working directory"),
    ("CWD/..", "it holds the current working directory"),
    ("CWD/../..", "it holds the current working directory"),
    ("/", "it holds the current working directory"),
])
def test_the_working_directory_and_its_ancestors_are_refused(workdir, given, why, capsys):
    given = given.replace("CWD", str(workdir))
    before = tree(workdir.parents[1])
    assert_refused(merge(given), capsys, given, why)
    assert_refused(world(given), capsys, given, why)
    assert tree(workdir.parents[1]) == before  # and no temporary left beside `..`


def test_a_link_to_the_working_directory_is_refused(workdir, capsys):
    link = workdir.parent / "link"
    link.symlink_to(workdir, target_is_directory=True)
    assert_refused(merge(link), capsys, str(link), "it is the current working directory")
    assert link.is_symlink()


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="lrc is not running from a git checkout")
@pytest.mark.parametrize("where, why", [(ROOT, "it is the git checkout"), (ROOT.parent, "it holds the git checkout")])
def test_the_checkout_is_refused(tmp_path, monkeypatch, capsys, where, why):
    if tmp_path.resolve().is_relative_to(where.resolve()):
        pytest.skip("the temporary directory lies inside the checkout's parent")
    monkeypatch.chdir(tmp_path)
    assert_refused(merge(where), capsys, str(where), why)
    assert (ROOT / "lrc" / "options.py").is_file()


# ---------------------------------------------------------------------------------------------
# An output never swallows an input


def test_a_parent_of_an_input_is_refused(tmp_path, capsys):
    out = tmp_path / "x"
    state = out / "students" / "a"
    state.mkdir(parents=True)
    (state / "lrc.json").write_text("{}")
    before = tree(tmp_path)
    assert_refused(merge(out, state), capsys, str(out), f"it holds --state {state}")
    assert_refused(merge(state, state), capsys, str(state), f"it holds --state {state}")  # the input itself
    assert tree(tmp_path) == before


def test_even_its_own_output_is_refused_when_it_holds_an_input(tmp_path, capsys):
    """The world's own previous output, marked, still may not swallow the config file read from it."""
    out = tmp_path / "world"
    assert run(world(out), capsys)[0] == 0
    config = out / "config.yaml"
    config.write_text("seed: 1\n")
    before = tree(tmp_path)
    assert_refused([*world(out), "--config", str(config)], capsys, str(out), f"it holds --config {config}")
    assert tree(tmp_path) == before


def test_a_text_option_naming_a_path_is_an_input(tmp_path, capsys):
    """`lrc tasks --tokenizer` is a text (a directory or a hub id): a directory inside --out counts."""
    out = tmp_path / "tasks"
    tokenizer = foreign(out / "tokenizer")
    code, err = run(["tasks", "--data", "no-such-data.jsonl", "--tokenizer", str(tokenizer), "--out", str(out)],
                    capsys)
    assert code == 2 and f"it holds --tokenizer {tokenizer}" in err, err


# ---------------------------------------------------------------------------------------------
# Other shapes of output


def test_tokenize_checks_the_directories_it_replaces(tmp_path, capsys):
    """`lrc tokenize --out X` replaces X/train and X/valid, not X."""
    out = tmp_path / "data"
    foreign(out / "train")
    before = tree(tmp_path)
    argv = ["tokenize", "--tokenizer", "no-such-tokenizer", "--source", "no-such.jsonl", "--seq-len", "8"]
    assert_refused([*argv, "--out", str(out)], capsys, str(out / "train"), f"no {OUTPUT_MARKER} marker")
    assert tree(tmp_path) == before
    code, err = run([*argv, "--out", "."], capsys)
    assert code == 2 and "it is the current working directory" in err, err


def test_a_file_output_may_not_be_a_directory(tmp_path, capsys):
    foreign(tmp_path / "table")
    before = tree(tmp_path)
    argv = ["aggregate", "--table", "table1", "--inputs", "no-such.json", "--out", str(tmp_path / "table")]
    code, err = run(argv, capsys)
    assert code == 2 and f"--out {tmp_path / 'table'}: is a directory" in err, err
    assert tree(tmp_path) == before


def test_every_out_option_says_what_it_writes():
    """A command's `out` declares itself a replaced directory or a file, so parse_args checks it
    (svd and recover write into their directory file by file and replace nothing)."""
    import importlib

    for command, (module, _) in COMMANDS.items():
        mod = importlib.import_module(module)
        fields = args_class(getattr(mod, f"main_{command}", None) or mod.main).__dataclass_fields__
        if "out" in fields and command not in WRITES_INTO:
            assert fields["out"].metadata.get("output") in ("dir", "file"), command


# ---------------------------------------------------------------------------------------------
# atomic_dir and atomic_file themselves


def test_atomic_dir_refuses_a_foreign_directory(tmp_path):
    out = foreign(tmp_path / "out")
    before = tree(tmp_path)
    with pytest.raises(LRCError, match=f"{out}.*no {OUTPUT_MARKER} marker"):
        with atomic_dir(out):
            pytest.fail("the body must not run")
    assert tree(tmp_path) == before


def test_atomic_dir_marks_and_replaces_its_own(tmp_path):
    out = tmp_path / "out"
    for text in ("one", "two"):
        with atomic_dir(out, command="lrc test") as tmp:
            (tmp / "f.txt").write_text(text)
    assert (out / "f.txt").read_text() == "two" and output_owner(out) == "lrc test"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_dir_refuses_a_directory_that_appeared_while_it_worked(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(LRCError, match="no .* marker"):
        with atomic_dir(out) as tmp:
            (tmp / "f.txt").write_text("new")
            foreign(out)
    assert (out / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the temporary is gone


@pytest.mark.parametrize("given", [".", ".."])
def test_atomic_dir_refuses_the_working_directory_and_leaves_nothing(workdir, given):
    before = tree(workdir.parents[1])
    with pytest.raises(LRCError, match="current working directory"):
        with atomic_dir(given):
            pytest.fail("the body must not run")
    assert tree(workdir.parents[1]) == before


@pytest.fixture
def read_only(tmp_path):
    """A directory no write can enter: chmod for a user; for root (who ignores modes) a read-only
    bind mount of it, or a skip where root may not mount."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0
    if not mounted or subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode:
        if mounted:
            subprocess.run(["umount", str(folder)])
        pytest.skip("running as root without the right to mount: no read-only directory to test with")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("out", ["world", "deeper/world"])
def test_a_read_only_place_is_refused_before_any_work(read_only, capsys, out):
    code, err = run(world(read_only / out), capsys)
    assert code == 2 and f"--out {read_only / out}: cannot write there: {read_only} is not writable" in err, err
    code, err = run(["probe", "--teacher", "no-such-teacher", "--data", "no-such-data", "--student-hidden", "4",
                     "--out", str(read_only / "probe.csv")], capsys)
    assert code == 2 and f"{read_only} is not writable" in err and "no-such" not in err, err


def test_atomic_file_refuses_a_directory(tmp_path):
    foreign(tmp_path / "d")
    with pytest.raises(LRCError, match="is a directory"):
        with atomic_file(tmp_path / "d"):
            pytest.fail("the body must not run")
    assert (tmp_path / "d" / "b.bin").exists() and os.listdir(tmp_path) == ["d"]
