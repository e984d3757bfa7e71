"""bench/all.py (`make bench-all`): its reading of the benchmarks' headline
lines, its verdict on each target and its rewrite of the performance doc,
without running a benchmark."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("bench_all",
                                                  ROOT / "bench" / "all.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_all"] = mod
    spec.loader.exec_module(mod)
    return mod


ba = load()

OUTPUT = """\
some table | 1 | 2
BENCH store: arena_put_get_vs_memcpy = 0.984 (0.971-1.04) (target >= 0.9)
BENCH leader: decode_step_headroom = 4.74 (target >= 1: 300 us / mean step us)
BENCH leader: admission_us_per_request = 742 (no target: 512 blocks planned)
BENCH saves: decode step with saves in flight over a slow store vs without saves, async saves = 1.01 (target <= 1.05)
BENCH curves: arena_put_get_vs_memcpy_worst_size = 0.63 at 16 KiB (target >= 0.9)
BENCH kernels: cpu_encode_raw_gbps = 4.848 (no target: CPU reference)
BENCH x: tiny = 1.5e-05 (target <= 2e-05)
not BENCH a: b = 1 (target >= 1)
BENCH broken line without a value
"""


def test_every_headline_form_is_read():
    rows = ba.parse(OUTPUT)
    assert [r["bench"] for r in rows] == ["store", "leader", "leader",
                                          "saves", "curves", "kernels", "x"]
    store = rows[0]
    assert (store["value"], store["lo"], store["hi"]) == ("0.984", "0.971",
                                                          "1.04")
    assert rows[3]["metric"].startswith("decode step with saves in flight")
    assert rows[3]["value"] == "1.01"
    assert rows[4]["at"] == " at 16 KiB" and rows[4]["value"] == "0.63"
    assert rows[6]["value"] == "1.5e-05"


def test_targets_are_judged_both_ways():
    rows = {r["metric"]: r for r in ba.parse(OUTPUT)}
    assert ba.met(rows["arena_put_get_vs_memcpy"]) == "yes"
    assert ba.met(rows["decode_step_headroom"]) == "yes"
    assert ba.met(rows["admission_us_per_request"]) == "-"
    assert ba.met(rows["arena_put_get_vs_memcpy_worst_size"]) == "**no**"
    assert ba.met(rows["tiny"]) == "yes"
    above = dict(rows["tiny"], value="3e-05")
    assert ba.met(above) == "**no**"


class FakeSitting:
    def line(self):
        return "2026-01-01, commit abc1234, 2 CPUs"


def test_table_of_a_step_and_of_a_failure():
    ok = ba.table("store", {"rc": 0, "wall_s": 12.0, "text": OUTPUT},
                  FakeSitting(), "perf/sitting/store.txt")
    assert "2026-01-01, commit abc1234" in ok
    assert "| arena_put_get_vs_memcpy | 0.984 | 0.971-1.04 | target >= 0.9 " \
           "| yes |" in ok
    assert "(output: [perf/sitting/store.txt](perf/sitting/store.txt), 12 s)" \
        in ok
    assert "decode_step_headroom" not in ok  # the leader's, not the store's
    failed = ba.table("cluster", {"rc": 3, "wall_s": 1.0, "text": ""},
                      FakeSitting(), "x.txt")
    assert "exited 3" in failed and "No headline lines" in failed
    missing = ba.table("peers", {"rc": 1, "wall_s": 0.0, "text": "",
                                 "missing": "venv is missing"},
                       FakeSitting(), "x.txt")
    assert "Not run: venv is missing." in missing


def test_doc_blocks_are_replaced_and_a_missing_block_stops(tmp_path):
    doc = tmp_path / "perf.md"
    doc.write_text("# Perf\n\n<!-- bench-all:store begin -->\nold figures\n"
                   "<!-- bench-all:store end -->\n\nprose stays\n")
    ba.rewrite_doc(doc, {"store": "new table"})
    text = doc.read_text()
    assert "old figures" not in text and "new table" in text
    assert text.endswith("<!-- bench-all:store end -->\n\nprose stays\n")
    ba.rewrite_doc(doc, {"store": "newer"})
    assert doc.read_text().count("<!-- bench-all:store begin -->") == 1
    with pytest.raises(SystemExit, match="no '<!-- bench-all:daemon begin"):
        ba.rewrite_doc(doc, {"daemon": "x"})


def test_a_step_whose_environment_is_missing_is_a_row(tmp_path):
    res = ba.run_step("peers", ["/bin/true"], {}, tmp_path / "no-venv",
                      tmp_path, FakeSitting())
    assert res["rc"] == 1 and "is missing" in res["missing"]
    assert "not run" in (tmp_path / "peers.txt").read_text()


def test_a_step_that_fails_keeps_its_output(tmp_path):
    res = ba.run_step("x", ["/bin/sh", "-c", "echo 'BENCH x: y = 2 (target "
                            ">= 3)'; echo oops >&2; exit 4"], {}, "/bin/sh",
                      tmp_path, FakeSitting())
    assert res["rc"] == 4
    out = (tmp_path / "x.txt").read_text()
    assert "exit 4" in out and "oops" in out and "BENCH x: y = 2" in out


def test_every_step_of_the_sitting_has_a_block_in_the_doc():
    doc = (ROOT / "docs" / "performance.md").read_text()
    names = [s[0] for s in ba.steps(Path("/nonexistent"))]
    assert len(names) == len(set(names))
    for name in names:
        assert f"<!-- bench-all:{name} begin -->" in doc, name
        assert f"<!-- bench-all:{name} end -->" in doc, name
