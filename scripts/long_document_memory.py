"""Peak memory of `lrc tokenize` on one very long document (a single JSON line), for docs/performance.md.

    python scripts/long_document_memory.py [--chars 17500000]

Builds the tiny world's test tokenizer and a one-line corpus of random words, runs `lrc tokenize`
in a child process and prints the child's peak RSS and wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import make_tokenizer  # noqa: E402

WORDS = "Person lives in town and works as a baker smith pilot 3 7, .".split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=17_500_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    make_tokenizer(work / "tok")
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS) for _ in range(args.chars // 4))[:args.chars]
    (work / "long.jsonl").write_text(json.dumps({"text": text}) + "\n")
    (work / "valid.jsonl").write_text("".join(json.dumps({"text": "Person 1 lives in town 2. " * 40}) + "\n"
                                              for _ in range(20)))
    start = time.perf_counter()
    subprocess.run(["lrc", "tokenize", "--tokenizer", str(work / "tok"), "--source", str(work / "long.jsonl"),
                    "--valid-source", str(work / "valid.jsonl"), "--out", str(work / "out"), "--seq-len", "256"],
                   check=True, capture_output=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"one line of {len(text):,} characters: peak RSS {peak:,.0f} MiB, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
