"""scripts/plot_bench.py on committed reports (tests/data/bench, see its README): every PNG is
written and is a valid, non-blank image; the CDFs use bench serve's own metric definitions; bad
inputs are refused with a message rather than plotted."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "plot_bench.py")
DATA = os.path.join(ROOT, "tests", "data", "bench")
SWEEP = os.path.join(DATA, "cpu-golden-llama-sweep.json")  # per-request data (--save-requests)
H200 = os.path.join(ROOT, "bench", "reports", "h200-llama-3-8b-serve.json")  # summaries only
COSTS = [os.path.join(DATA, "cost-cpu.txt"), os.path.join(DATA, "cost-h200.json")]
ALL_PNGS = ["latency_cdf.png", "throughput_vs_rate.png", "latency_vs_rate.png", "cost.png"]


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300)


def check_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    with Image.open(path) as im:
        im.verify()  # structure and checksums
    with Image.open(path) as im:
        assert im.width >= 400 and im.height >= 200, f"{path}: {im.size}"
        pixels = np.asarray(im.convert("L"), dtype=np.float64)
    # Axes, lines and text on a white page: a blank or single-colour image has no spread.
    assert pixels.std() > 5, f"{path}: the image is blank"
    assert (pixels < 128).mean() > 0.005, f"{path}: almost nothing drawn"


def test_every_plot_is_a_valid_image(tmp_path):
    r = run(SWEEP, H200, *[a for c in COSTS for a in ("--cost", c)], "--out-dir", str(tmp_path / "plots"))
    assert r.returncode == 0, r.stderr
    written = r.stdout.split()
    assert [os.path.basename(p) for p in written] == ALL_PNGS
    for name in ALL_PNGS:
        check_png(tmp_path / "plots" / name)


def test_cost_plot_only_with_cost_files(tmp_path):
    r = run(SWEEP, "--label", "cpu", "--out-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == sorted(ALL_PNGS[:3])
    r = run("--cost", COSTS[0], "--out-dir", str(tmp_path / "cost"))
    assert r.returncode == 0, r.stderr
    assert os.listdir(tmp_path / "cost") == ["cost.png"]
    check_png(tmp_path / "cost" / "cost.png")


def load_module():
    spec = importlib.util.spec_from_file_location("plot_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cdfs_use_the_reports_definitions():
    # The per-request values a CDF is drawn from give back the report's own percentiles
    # (numpy's linear interpolation is bench serve's); 1e-9 relative covers float printing.
    mod = load_module()
    with open(SWEEP) as f:
        runs = json.load(f)["runs"]
    assert len(runs) == 3
    n_checked = 0
    for run_ in runs:
        assert run_["requests"], "the committed sweep must keep per-request data"
        for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
            values = mod.request_values(run_, key)
            assert len(values) == run_[key]["n"]
            for p in ("p50", "p90", "p99"):
                got = np.percentile(values, float(p[1:]))
                assert got == pytest.approx(run_[key][p], rel=1e-9), (run_["request_rate"], key, p)
                n_checked += 1
    assert n_checked == 27
    assert mod.request_values(json.load(open(H200))["runs"][0], "ttft_ms") is None


def test_bad_inputs_are_refused(tmp_path):
    bad_schema = tmp_path / "other.json"
    bad_schema.write_text(json.dumps({"schema": "something/2", "runs": []}))
    r = run(str(bad_schema), "--out-dir", str(tmp_path / "out"))
    assert r.returncode == 1
    assert "not a `bench serve` report" in r.stderr
    no_rows = tmp_path / "cost.txt"
    no_rows.write_text("| a table without its JSON line |\n")
    r = run("--cost", str(no_rows), "--out-dir", str(tmp_path / "out"))
    assert r.returncode == 1
    assert "no JSON array" in r.stderr
    r = run("--out-dir", str(tmp_path / "out"))
    assert r.returncode == 2  # argparse: nothing to plot
    assert not (tmp_path / "out").exists()
