"""settings.json names the machine: the CPU's instruction set moves results (docs/results.md, "Why
the machine and the libraries move this table")."""

import json

import torch

from lrc.io.provenance import SETTINGS_FILE, write_settings


def test_settings_record_the_machine_that_computed_them(tmp_path):
    write_settings(tmp_path, "world", {"seed": 0})
    record = json.loads((tmp_path / SETTINGS_FILE).read_text())
    m = record["machine"]
    assert m["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(m["cpu"], str) and m["cpu"]
    assert m["torch_threads"] == torch.get_num_threads() and m["cpu_count"] >= 1
    assert ("gpus" in m) == torch.cuda.is_available()
    assert record["settings"] == {"seed": 0} and record["command"] == "world"
