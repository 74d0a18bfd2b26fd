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
SPEEDS = [("verilator", [((64, 256, 256), 70_000, 2.0), ((256, 256, 256), 263_520, 6.0)])]


def test_report(tmp_path):
    out = tmp_path / "performance.md"
    bench.write_report([ROW], SPEEDS, out, tmp_path / "utilization.png")
    lines = out.read_text().splitlines()
    assert "Written by `make bench` (`npu bench`)" in lines[2]
    assert ("| 16 x 64 x 64 | 4x4 | 64 | 5,000 | 5,000 | 81.9% | 90.0% | 91.0% | 8,192 | "
            "50.0% |") in lines
    assert "| 16 x 64 x 64 | 4x4 | 48 | 3,072 | 9 | 120 | 30 | 200 | 40 | 12,288 | 16,384 |" \
        in lines
    # Steady state: (263,520 - 70,000) cycles in 4 s.
    assert ("| verilator | 64x256x256, 256x256x256 | 70,000, 263,520 | 2.0 s, 6.0 s | 43,920 | "
            "48,380 |") in lines
    assert "![utilization against M](utilization.png)" in lines


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
