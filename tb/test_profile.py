"""npu onnx --profile: the per-node profile, exact on the NPU's side (the cycle model split at
each operator's first instruction), its report and plots, its errors."""

import json
import logging

import numpy as np
import pytest

from hw.config import NPUConfig
from sw.cli import main
from sw.onnx import models
from sw.onnx.graph import import_model
from sw.onnx.runtime import run_model
from sw.profile import ECP5_FMAX_MHZ, profile
from sw.timing import predict

logging.getLogger("root").setLevel(logging.ERROR)     # quantize_static's advice


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory):
    folder = tmp_path_factory.mktemp("profile")
    float_model, shape = models.build("mobilenet", 0)
    path = folder / "mobilenet.onnx"
    models.quantize(float_model, path, models.calibration_data(shape, seed=1),
                    activation_type="uint8")
    x = models.calibration_data(shape, samples=5, seed=2)
    np.save(folder / "x.npy", x)
    return str(path), folder / "x.npy", x


def test_operators_add_up_to_the_programs(mobilenet):
    path, _, x = mobilenet
    config = NPUConfig.from_name("4x4")
    run = run_model(import_model(path), x, config=config, sim="model", batch=2)
    report = profile(run, config)
    npu = [row for row in report["nodes"] if row["device"] == "npu"]
    assert [row["node"] for row in npu] == [p.node for p in run.placements
                                            if p.device == "npu"]
    # Split at each operator's first instruction: the rows add up to every program's CYCLES
    # and counters, and each program's figure is the cycle model's.
    assert sum(row["cycles"] for row in npu) == run.cycles == report["totals"]["npu_cycles"]
    programs = [image for group_run in run.group_runs for image in group_run.images]
    assert run.cycles == sum(predict(config, image.words, image.program_addr).cycles
                             for image in programs)
    for name in ("read_bytes", "write_bytes"):
        assert sum(row[name] for row in npu) == run.counters[name]
    assert sum(sum(row["stalls"].values()) for row in npu) == sum(
        run.counters[name] for name in ("stall_load", "stall_store", "stall_array",
                                        "stall_fetch"))
    for row in npu:
        assert row["utilization"] == row["macs"] / (row["cycles"] * 16)
        assert row["seconds"] == row["cycles"] / (ECP5_FMAX_MHZ["4x4"] * 1e6)
    assert report["clock_mhz"] == ECP5_FMAX_MHZ["4x4"] and report["peak_gops"] == 2 * 16 * 0.1255
    assert [row["device"] for row in report["nodes"]] == ["host", "npu", "npu", "npu", "host"]


def test_cli_writes_the_report_and_plots(mobilenet, tmp_path, capsys):
    path, x, _ = mobilenet
    target = tmp_path / "report.md"
    assert main(["onnx", path, "--input", str(x), "--config", "4x4", "--profile",
                 str(target), "--clock-mhz", "100", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["profile"]["clock_mhz"] == 100.0
    assert result["profile_files"] == [str(target), str(tmp_path / "report.roofline.png"),
                                       str(tmp_path / "report.layers.png")]
    text = target.read_text()
    assert "| QLinearConv_1 | NPU |" in text and "![roofline](report.roofline.png)" in text
    for name in result["profile_files"][1:]:
        assert open(name, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, message", [
    (["--profile", "report.txt"], "give a name ending in .md"),
    (["--profile", "missing/report.md"], "no such directory"),
    (["--clock-mhz", "0"], "--clock-mhz must be positive")])
def test_profile_errors(mobilenet, tmp_path, capsys, argv, message, monkeypatch):
    path, x, _ = mobilenet
    monkeypatch.chdir(tmp_path)
    assert main(["onnx", path, "--input", str(x), "--config", "4x4"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not list(tmp_path.iterdir())
