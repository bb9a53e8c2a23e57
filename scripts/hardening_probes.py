"""Probe every item of the hardening round as a hostile user would, on a built test world, and check
that nothing is lost: every refusal exits non-zero with a message naming the problem, and every
earlier output (results/ and checkpoints/) is byte-identical afterwards.

    python scripts/hardening_probes.py [--out hardening_probes.md]

Run from a checkout (a fresh clone: it first builds `results/table1.csv` of config/test.yaml, about
two minutes on two cores). Each probe is a real command line: an `lrc` command on a damaged copy, a
dry run of a config with one bad value, or, where a probe needs a setup of its own (a full disk, a
read-only mount, a flipped float in a finished checkpoint, a diverging run), the test that builds it.
Prints a table item -> probe -> outcome; exits 1 if any probe failed. `--skip 1` leaves out the `--out`
probes, for code old enough that `--out "$PWD"` would empty this checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "test.yaml"
KEPT = ("results", "checkpoints")
INTEGRITY = "tests/training/test_checkpoint_integrity.py"  # what must come out of every probe byte for byte


def snapshot() -> dict[str, str]:
    files = {}
    for top in KEPT:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.name != ".content-hashes.json":  # a cache, rewritten by design
                files[str(path.relative_to(ROOT))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def run(argv: list[str], timeout: int = 600) -> tuple[int, str]:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    return done.returncode, done.stdout + done.stderr


def lrc(*args: str) -> list[str]:
    return [sys.executable, "-m", "lrc.cli", *args]


def dry_run(edit, tmp: Path, name: str) -> list[str]:
    """A dry run of config/test.yaml with one value changed by ``edit(experiment)``."""
    config = yaml.safe_load(CONFIG.read_text())
    edit(next(iter(config["experiments"].values())))
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "results/table1.csv", "--configfile", str(path)]


def pytest_probe(*tests: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]


def damaged_teacher(tmp: Path, exp: str, name: str, damage) -> str:
    """A copy of the built teacher with ``damage(directory)`` applied."""
    target = tmp / name
    shutil.copytree(ROOT / "results" / exp / "teacher", target)
    (target / ".lrc-output").unlink(missing_ok=True)
    damage(target)
    return str(target)


def edit_config(key: str, value=None, drop: bool = False):
    def damage(directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text())
        config.pop(key) if drop else config.update({key: value})
        (directory / "config.json").write_text(json.dumps(config))
    return damage


def edit_tensor(change):
    """Rewrite model.safetensors with ``change(tensors)`` applied."""
    def damage(directory: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(directory / "model.safetensors"))
        change(tensors)
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return damage


def probes(tmp: Path, exp: str) -> list[tuple[str, str, list[str], str | None]]:
    """(item, what is tried, the command, a text its output must hold; None: the command must pass)."""
    import torch

    results = f"results/{exp}"
    state, teacher = f"{results}/distill/lrc-dense-s0-t20000", f"{results}/teacher"
    merge = ["merge", "--state", state, "--teacher", teacher]
    layer = "model.layers.0.mlp.up_proj.weight"
    foreign = tmp / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("a user's own file\n")
    bases = tmp / "bases"
    shutil.copytree(ROOT / results / "svd", bases)
    from safetensors.torch import load_file, save_file

    stored = load_file(str(bases / "bases.safetensors"))
    save_file({k: v * 1.5 for k, v in stored.items()}, str(bases / "bases.safetensors"))
    lrc_state = tmp / "state"
    shutil.copytree(ROOT / state, lrc_state)
    values = load_file(str(lrc_state / "student.safetensors"))
    first = next(iter(values))
    values[first] = values[first][..., :-1].contiguous()
    save_file(values, str(lrc_state / "student.safetensors"))
    duplicate = tmp / "duplicate.yaml"
    duplicate.write_text(CONFIG.read_text().replace("      hidden_size: 16\n", "      hidden_size: 16\n" * 2))
    latin1 = tmp / "latin1.yaml"
    latin1.write_bytes(CONFIG.read_text().replace("# A smaller", "# Ä smaller").encode("latin-1"))
    snake = [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "results/table1.csv", "--configfile"]
    return [
        ("1 --out deletes", "merge --out the experiment's own directory", lrc(*merge, "--out", results), "--out"),
        ("1 --out deletes", "merge --out a directory of unrelated files", lrc(*merge, "--out", str(foreign)),
         "--out"),
        ("1 --out deletes", "merge --out the working directory", lrc(*merge, "--out", str(ROOT)), "--out"),
        ("1 --out deletes", "merge --out .", lrc(*merge, "--out", "."), "--out"),
        ("1 --out deletes", "merge --out ..", lrc(*merge, "--out", ".."), "--out"),
        ("2 made-up weights", "teacher config.json without num_hidden_layers",
         lrc("svd", "--teacher", damaged_teacher(tmp, exp, "t1", edit_config("num_hidden_layers", drop=True)),
             "--out", str(tmp / "s1")), "num_hidden_layers"),
        ("2 made-up weights", "a tensor missing from model.safetensors",
         lrc("svd", "--teacher", damaged_teacher(tmp, exp, "t2", edit_tensor(lambda t: t.pop(layer))),
             "--out", str(tmp / "s2")), layer),
        ("2 made-up weights", "an int32 tensor in the teacher",
         lrc("svd", "--teacher", damaged_teacher(tmp, exp, "t3", edit_tensor(
             lambda t: t.update({layer: t[layer].to(torch.int32)}))), "--out", str(tmp / "s3")), layer),
        ("2 made-up weights", "NaN in a teacher weight",
         lrc("svd", "--teacher", damaged_teacher(tmp, exp, "t4", edit_tensor(
             lambda t: t[layer].view(-1).__setitem__(0, float("nan")))), "--out", str(tmp / "s4")), layer),
        ("2 made-up weights", "bases scaled by 1.5 (not orthonormal)",
         lrc(*merge, "--bases", str(bases), "--out", str(tmp / "m1")), "orthonormal"),
        ("3 refused in the job", "student width not a multiple of the heads",
         dry_run(lambda x: x["student"].update(hidden_size=18), tmp, "heads"), "student.hidden_size"),
        ("3 refused in the job", "micro-batch not dividing the batch",
         dry_run(lambda x: x["warmstart"].update(micro_batch_size=3), tmp, "micro"), "warmstart.batch_size"),
        ("3 refused in the job", "warmstart.lr: -0.1",
         dry_run(lambda x: x["warmstart"].update(lr=-0.1), tmp, "lr"), "warmstart.lr"),
        ("3 refused in the job", "merge.atol: -1", dry_run(lambda x: x.update(merge={"atol": -1}), tmp, "atol"),
         "merge.atol"),
        ("3 refused in the job", "distill.train.grad_clip: -1",
         dry_run(lambda x: x["distill"]["train"].update(grad_clip=-1), tmp, "clip"), "grad_clip"),
        ("3 refused in the job", "separator typo",
         dry_run(lambda x: x["data"]["corpus"].update(separator="eos_bos"), tmp, "sep"), "separator"),
        ("3 refused in the job", "text_field typo",
         dry_run(lambda x: x["data"]["corpus"].update(text_field="txt"), tmp, "field"), "text_field"),
        ("3 retrain on rebuild", "a byte-identical rebuilt input keeps its checkpoint key",
         pytest_probe(f"{INTEGRITY}::test_a_byte_identical_rebuilt_input_keeps_its_checkpoint_key"),
         None),
        ("4 did nothing", "distill.tokens: [500]",
         dry_run(lambda x: x["distill"].update(tokens=[500]), tmp, "budget"), "buys no optimiser step"),
        ("5 bit rot", "a flipped float in a finished checkpoint; a finished run of other code",
         pytest_probe(f"{INTEGRITY}::test_a_flipped_float_in_a_finished_checkpoint_is_caught_and_the_run_retrained",
                      f"{INTEGRITY}::test_a_finished_run_of_other_code_is_reused_with_a_warning_and_credited_to_"
                      "that_code"),
         None),
        ("6 divergence", "a huge learning rate",
         pytest_probe("tests/training/test_guards.py::test_a_huge_learning_rate_is_stopped_by_the_default_guard"),
         None),
        ("7 mixed tables", "aggregate students trained at lr 0.003 under a config saying 0.002",
         lrc("aggregate", "--table", "table1", "--inputs", *sorted(str(p.relative_to(ROOT)) for p in
                                                                 (ROOT / results / "eval").glob("*.json")),
             "--expect-settings", json.dumps({exp: {"lrc": {"distill.train.lr": 0.002}}}),
             "--out", str(tmp / "table1.csv")), "was trained with lr = 0.003"),
        ("8 smaller", "seq_len beyond the teacher's positions",
         dry_run(lambda x: x["data"]["corpus"].update(seq_len=512), tmp, "seq"), "seq_len"),
        ("8 smaller", "a wrong-shape tensor in an LRC state",
         lrc("merge", "--state", str(lrc_state), "--teacher", teacher, "--out", str(tmp / "m2")), first),
        ("8 smaller", "a YAML key given twice", snake + [str(duplicate)], "hidden_size"),
        ("8 smaller", "a non-UTF-8 config file (read by Snakemake before the workflow: its own message)",
         snake + [str(latin1)], "UnicodeDecodeError"),
        ("8 smaller", "a read-only output directory; a full disk",
         pytest_probe("tests/io/test_outputs.py::test_a_read_only_place_is_refused_before_any_work",
                      "tests/training/test_disk_full.py"), None),
        ("8 smaller", "a 1 Mi-character document tokenised in pieces",
         pytest_probe("tests/commands/test_tokenize.py::test_a_document_longer_than_a_piece_gives_the_ids_of_the_whole"),
         None),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here, outside results/")
    parser.add_argument("--skip", nargs="*", default=[], help="item numbers not to probe (e.g. 1 on code whose "
                        "--out would empty the working directory, this checkout)")
    args = parser.parse_args()
    exp = next(iter(yaml.safe_load(CONFIG.read_text())["experiments"]))
    code, told = run([sys.executable, "-m", "snakemake", "--cores", "2", "results/table1.csv", "--configfile",
                      str(CONFIG)], timeout=1800)
    if code != 0:
        print(told[-3000:], file=sys.stderr)
        return 1
    before = snapshot()
    rows, failed = [], 0
    with tempfile.TemporaryDirectory(prefix="lrc-probe-") as tmp:
        backup = Path(tmp) / "backup"
        for top in KEPT:
            shutil.copytree(ROOT / top, backup / top, symlinks=True)
        for item, what, argv, expected in probes(Path(tmp), exp):
            if item.split()[0] in args.skip:
                continue
            code, told = run(argv)
            # An lrc refusal exits 2 with its message (a traceback exits 1); a refused dry run exits 1.
            refused = code == 2 if argv[1:3] == ["-m", "lrc.cli"] else code != 0
            answered = code == 0 if expected is None else refused and expected in told
            kept = snapshot() == before
            if not kept:  # put the outputs back, so the next probe meets them as they were
                for top in KEPT:
                    shutil.rmtree(ROOT / top, ignore_errors=True)
                    shutil.copytree(backup / top, ROOT / top, symlinks=True)
            ok = answered and kept
            failed += not ok
            lines = [line.strip() for line in told.splitlines() if expected is not None and expected in line]
            errors = [line for line in lines if line.startswith(("error", "invalid", "Unicode"))]
            said = "test passed" if expected is None else (errors or lines or [told.strip()[-160:]])[0]
            rows.append(f"| {item} | {what} | {'held' if ok else 'FAILED'} | exit {code}; "
                        f"outputs {'identical' if kept else 'CHANGED'} | {said[:160].replace('|', '/')} |")
    table = "\n".join(["| item | probe | outcome | exit, earlier outputs | what it said |",
                       "|---|---|---|---|---|", *rows])
    print(table)
    print(f"\n{len(rows) - failed} of {len(rows)} probes held")
    if args.out:
        args.out.write_text(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
