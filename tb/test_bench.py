"""``npu bench`` (:mod:`sw.bench`) without the RTL: its report, its command line, its errors,
and the Amaranth simulator's GEMM it times. The RTL sweep itself runs in ``make bench``."""

import sys
import types

import numpy as np
import pytest

from hw.config import NPUConfig
from sw import bench
from sw.cli import main
from sw.compiler import compile_gemm
from sw.timing import predict


PERF = dict(array_rows=48, useful_macs=3072, stall_fetch=9, stall_load=120, stall_store=30,
            stall_array=200, instructions=40, read_bytes=12_288, write_bytes=16_384,
            cycles=5000)
ROW = dict(m=16, k=64, n=64, config="4x4", bus=64, cycles=5000, model=5000,
           utilization=16 * 64 * 64 / (5000 * 16), ceiling=0.9, scalesim=8192,
           scalesim_utilization=16 * 64 * 64 / (8192 * 16), perf=PERF)
SPEEDS = bench.Speeds(
    gemms=[("verilator", "hdl", [((256, 256, 256), 263_520, 1.0),
                                 ((512, 512, 512), 2_098_528, 4.0)]),
           ("verilator", "cocotbext", [((64, 256, 256), 66_912, 2.0),
                                       ((256, 256, 256), 263_520, 6.0)]),
           ("icarus", "hdl", [((64, 256, 256), 66_912, 4.0), ((768, 256, 256), 790_000, 40.0)]),
           ("icarus", "cocotbext", [((8, 64, 64), 2_320, 3.0), ((64, 64, 64), 5_472, 12.0)]),
           ("amaranth", "python", [((8, 32, 32), 685, 1.0), ((32, 32, 32), 1_271, 2.0)])],
    command=(bench.SPEED_COMMAND, 2_098_528, 7.0))


def test_report(tmp_path):
    out = tmp_path / "performance.md"
    bench.write_report([ROW], SPEEDS, out, tmp_path / "utilization.png")
    text = out.read_text()
    lines = text.splitlines()
    assert "Written by `make bench` (`npu bench`)" in lines[2]
    assert "The sweep runs on the HDL DRAM (sim/hdl/npu_axi_dram.v" in lines[2]
    assert "tb/test_dram_models.py holds equal, cycle for cycle, to cocotbext-axi's" in lines[2]
    assert ("| 16 x 64 x 64 | 4x4 | 64 | 5,000 | 5,000 | 81.9% | 90.0% | 91.0% | 8,192 | "
            "50.0% |") in lines
    assert "| 16 x 64 x 64 | 4x4 | 48 | 3,072 | 9 | 120 | 30 | 200 | 40 | 12,288 | 16,384 |" \
        in lines
    assert ("| simulator | DRAM | GEMMs | cycles | wall time | end to end (longer GEMM) "
            "| steady state |") in lines
    # Steady state: (2,098,528 - 263,520) cycles in 3 s; (263,520 - 70,000) in 4 s.
    assert ("| verilator | hdl | 256x256x256, 512x512x512 | 263,520, 2,098,528 | 1.0 s, 4.0 s "
            "| 524,632 | 611,669 |") in lines
    assert ("| verilator | cocotbext | 64x256x256, 256x256x256 | 66,912, 263,520 | 2.0 s, "
            "6.0 s | 43,920 | 49,152 |") in lines
    assert ("| icarus | hdl | 64x256x256, 768x256x256 | 66,912, 790,000 | 4.0 s, 40.0 s "
            "| 19,750 | 20,086 |") in lines
    assert "| icarus | cocotbext | 8x64x64, 64x64x64 |" in text
    assert "| amaranth | python | 8x32x32, 32x32x32 |" in text
    # The same GEMM on two DRAM models and two simulators: equal cycles, said so.
    assert ("256x256x256 263,520 cycles on verilator/hdl, verilator/cocotbext; 64x256x256 "
            "66,912 cycles on verilator/cocotbext, icarus/hdl.") in text
    assert ("The whole command `npu gemm --m 512 --k 512 --n 512 --config 8x8 --sim "
            "verilator`, as a user runs it") in text
    assert "2,098,528 cycles in 7.0 s, 299,790 cycles/s end to end." in text
    # 299,790 of 300,000 is 99.9%: not reached, and not rounded up to 100%.
    assert ("* Verilator end to end (the whole `npu gemm` 512^3 command): 299,790 cycles/s "
            "against 300,000: not reached (99% of the target).") in lines
    assert ("* Verilator steady state (512^3 over 256^3, HDL DRAM): 611,669 cycles/s against "
            "500,000: reached.") in lines
    assert ("* Icarus steady state (HDL DRAM): 20,086 cycles/s against 20,000: reached.") \
        in lines
    assert "sim/public.vlt" not in text
    bullet = next(line for line in lines if line.startswith("* Simulator speed:"))
    assert "the HDL DRAM removes the per-beat Python (under Verilator 611,669 cycles/s" in bullet
    assert "against 49,152 with cocotbext-axi's DRAM, 12 times as many)" in bullet
    assert "the whole `npu gemm` 512^3 command took 7.0 s for 2,098,528 cycles" in bullet
    assert "![utilization against M](utilization.png)" in lines


def test_report_without_speeds(tmp_path):
    out = tmp_path / "performance.md"
    bench.write_report([ROW], None, out, tmp_path / "utilization.png")
    text = out.read_text()
    assert "## Simulator speed" not in text
    assert "issue 15" not in text
    assert "* Simulator speed: the HDL DRAM removes the per-beat Python. What remains" in text


@pytest.mark.parametrize("measured, verdict", [
    (300_000, "reached"), (450_000, "reached"), (299_999, "not reached (99% of the target)"),
    (150_000, "not reached (50% of the target)"), (0, "not reached (0% of the target)")])
def test_target_verdicts(measured, verdict):
    speeds = bench.Speeds(gemms=[], command=(bench.SPEED_COMMAND, measured * 2, 2.0))
    (command, *others) = bench.targets(speeds)
    assert command == ("Verilator end to end (the whole `npu gemm` 512^3 command)", 300_000,
                       measured, verdict)
    # No GEMMs measured: the steady-state targets say so instead of a verdict.
    assert [(target, figure, said) for _, target, figure, said in others] == \
        [(500_000, None, "not measured"), (20_000, None, "not measured")]


def test_no_steady_state_where_the_longer_gemm_was_not_slower(tmp_path):
    """Tiny GEMMs, whose times are all start: no steady state, no verdict on it."""
    speeds = bench.Speeds(gemms=[
        ("verilator", "hdl", [((4, 8, 8), 96, 1.9), ((8, 8, 8), 124, 1.8)])])
    assert bench.targets(speeds)[1][2:] == (None, "not measured")
    out = tmp_path / "performance.md"
    bench.write_report([ROW], speeds, out, tmp_path / "utilization.png")
    lines = out.read_text().splitlines()
    assert "| verilator | hdl | 4x8x8, 8x8x8 | 96, 124 | 1.9 s, 1.8 s | 69 | n/a |" in lines
    assert ("* Verilator steady state (512^3 over 256^3, HDL DRAM), target 500,000: "
            "not measured.") in lines


def test_steady_state_targets_come_from_their_simulator_and_dram():
    speeds = bench.Speeds(gemms=[
        ("verilator", "cocotbext", [((1, 1, 1), 0, 1.0), ((2, 2, 2), 9_000_000, 2.0)]),
        ("verilator", "hdl", [((1, 1, 1), 100, 1.0), ((2, 2, 2), 400_100, 2.0)]),
        ("icarus", "hdl", [((1, 1, 1), 100, 1.0), ((2, 2, 2), 20_100, 2.0)])])
    (_, _, end_to_end, said), verilator, icarus = bench.targets(speeds)
    assert (end_to_end, said) == (None, "not measured")
    assert verilator[2:] == (400_000, "not reached (80% of the target)")
    assert icarus[2:] == (20_000, "reached")


def test_steady_state_is_the_simulators_own_time(tmp_path):
    """With the simulation's own seconds (rtl_speed's fourth field) the steady state is
    taken over them, the end-to-end figure over the whole time, and the table shows both."""
    runs = [((256, 256, 256), 263_520, 1.3, 0.5), ((512, 512, 512), 2_098_528, 5.5, 3.0)]
    speeds = bench.Speeds(gemms=[("verilator", "hdl", runs)])
    assert bench.targets(speeds)[1][2] == (2_098_528 - 263_520) / 2.5
    out = tmp_path / "performance.md"
    bench.write_report([ROW], speeds, out, tmp_path / "utilization.png")
    assert ("| verilator | hdl | 256x256x256, 512x512x512 | 263,520, 2,098,528 | 1.3 s, 5.5 s "
            "(simulator 0.5 s, 3.0 s) | 381,551 | 734,003 |") in out.read_text().splitlines()


def test_amaranth_speed_runs_the_gemm_bit_exactly():
    """The GEMM it times is checked against numpy (BenchMismatch otherwise) and takes the
    cycles of the cycle model with a DRAM that answers at once."""
    config = NPUConfig.from_name("2x2", bus_width=32)
    shape, cycles, seconds = bench.amaranth_speed(config, np.random.default_rng(0), 5, 7, 3)
    program = compile_gemm(config, 5, 7, 3, a_addr=0x10000, b_addr=0x20000, c_addr=0x30000)
    assert shape == (5, 7, 3)
    assert cycles == predict(config, program.words, 0x1000, read_latency=2,
                             write_response_latency=1).cycles
    assert seconds > 0


@pytest.fixture
def no_simulation(monkeypatch):
    """``npu bench`` with the sweep, the speeds and the plot replaced: what they were given."""
    calls = {}

    def run_sweep(sweep):
        calls["sweep"] = sweep
        return [ROW]

    def simulator_speed():
        calls["speed"] = SPEEDS
        return SPEEDS

    def plot(rows, path):
        calls["plot"] = path

    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))
    monkeypatch.setattr(bench, "run_sweep", run_sweep)
    monkeypatch.setattr(bench, "simulator_speed", simulator_speed)
    monkeypatch.setattr(bench, "plot", plot)
    return calls


def test_cli_quick(tmp_path, capsys, no_simulation):
    out = tmp_path / "perf.md"
    assert main(["bench", "--quick", "--no-speed", "--out", str(out)]) == 0
    assert no_simulation == {"sweep": bench.QUICK_SWEEP, "plot": tmp_path / "utilization.png"}
    assert "| 16 x 64 x 64 | 4x4 | 64 | 5,000 |" in out.read_text()
    assert "## Simulator speed" not in out.read_text()
    assert capsys.readouterr().out == f"wrote {out} and {tmp_path / 'utilization.png'}\n"


def test_python_m_sw_bench_is_npu_bench(tmp_path, capsys, no_simulation):
    out = tmp_path / "perf.md"
    assert bench.main(["--out", str(out)]) == 0
    assert no_simulation["sweep"] is bench.SWEEP
    assert no_simulation["speed"] is SPEEDS
    assert "## Simulator speed" in out.read_text()


def test_cli_mismatch_exits_1(tmp_path, capsys, monkeypatch, no_simulation):
    def mismatch(sweep):
        raise bench.BenchMismatch("16x64x64 on 4x4: not bit-exact (seed 1)")
    monkeypatch.setattr(bench, "run_sweep", mismatch)
    assert main(["bench", "--out", str(tmp_path / "perf.md")]) == 1
    captured = capsys.readouterr()
    assert captured.err == "npu: error: 16x64x64 on 4x4: not bit-exact (seed 1)\n"
    assert not (tmp_path / "perf.md").exists()


def test_cli_without_matplotlib_exits_1_before_simulating(tmp_path, capsys, monkeypatch,
                                                         no_simulation):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["bench", "--out", str(tmp_path / "perf.md")]) == 1
    assert no_simulation == {}
    err = capsys.readouterr().err
    assert err.startswith("npu: error: npu bench draws its plot with matplotlib")
    assert err.count("\n") == 1
