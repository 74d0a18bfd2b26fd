"""The two DRAM models side by side: the same programs on the DRAM in the simulated hardware
(``NPU_DRAM=hdl``, sim/hdl/npu_axi_dram.v) and on cocotbext-axi's slave models
(``NPU_DRAM=cocotbext``), under Verilator.

Without back-pressure the two must agree on everything: the results, bit for bit; the cycle
count and every performance counter (and both equal the cycle model, sw/timing.py, whose DRAM
latencies are the HDL model's parameters); the error a bad program ends in; and the verdict of
the AXI4 protocol checker, which must stay quiet on the NPU's traffic and must report the same
rule when the DRAM itself breaks the protocol.
"""

import os

import numpy as np
import pytest

from hw.config import NPUConfig
from sim.bench import _read_written
from sim.runner import run_cocotb
from sw.driver import gemm_batch, qgemm_batch, reference_gemm, reference_qgemm
from sw.timing import predict_gemm


pytestmark = pytest.mark.rtl

MODELS = ("hdl", "cocotbext")
SEED = int(os.environ.get("NPU_SEED", "20261203"))
CONFIGS = [NPUConfig.from_name("4x4", bus_width=64), NPUConfig.from_name("3x5", bus_width=32),
           NPUConfig.from_name("8x8", bus_width=128), NPUConfig.from_name("4x4", bus_width=256),
           NPUConfig.from_name("8x4", bus_width=512)]


def _on(model, monkeypatch, run):
    monkeypatch.setenv("NPU_DRAM", model)
    monkeypatch.delenv("NPU_BACKPRESSURE", raising=False)
    return run()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda config: f"{config.name}-{config.bus_width}")
def test_gemms_agree(config, monkeypatch):
    seed = SEED + config.rows * 100 + config.bus_width
    print(f"seed {seed} (NPU_SEED={SEED})")
    rng = np.random.default_rng(seed)
    shapes = [(1, 1, 1), (7, 13, 11), (33, 2 * config.rows + 1, 3 * config.cols + 2)]
    shapes += [tuple(int(v) for v in rng.integers(1, 60, size=3)) for _ in range(5)]
    pairs = [(rng.integers(-128, 128, size=(m, k), dtype=np.int8),
              rng.integers(-128, 128, size=(k, n), dtype=np.int8)) for m, k, n in shapes]
    runs = {model: _on(model, monkeypatch,
                       lambda: gemm_batch(pairs, config=config, sim="verilator"))
            for model in MODELS}
    for (m, k, n), (a, b), hdl, ext in zip(shapes, pairs, runs["hdl"], runs["cocotbext"]):
        context = f"{m}x{k}x{n} on {config.name} ({config.bus_width}-bit), seed {seed}"
        expected = reference_gemm(a, b)
        assert np.array_equal(hdl.c, expected), f"{context}: wrong on the HDL DRAM"
        assert np.array_equal(ext.c, expected), f"{context}: wrong on cocotbext's DRAM"
        assert hdl.cycles == ext.cycles, \
            f"{context}: {hdl.cycles} cycles on the HDL DRAM, {ext.cycles} on cocotbext's"
        assert hdl.perf == ext.perf, f"{context}: counters {hdl.perf} and {ext.perf}"
        model = predict_gemm(config, m, k, n)
        assert model.perf == hdl.perf, f"{context}: the cycle model predicts {model.perf}"


def test_quantized_gemms_agree(monkeypatch):
    """LOAD_ACC, LOAD_QUANT and STORE_Q: the quantized instructions."""
    config = NPUConfig.from_name("4x4", bus_width=64)
    rng = np.random.default_rng(SEED)
    problems = []
    for m, k, n in [(5, 9, 7), (17, 20, 13)]:
        problems.append(dict(
            A=rng.integers(-128, 128, size=(m, k), dtype=np.int8),
            B=rng.integers(-128, 128, size=(k, n), dtype=np.int8),
            bias=rng.integers(-5000, 5000, size=n, dtype=np.int32),
            multiplier=rng.integers(1 << 30, 1 << 31, size=n).astype(np.int32),
            shift=rng.integers(6, 12, size=n).astype(np.int32),
            out_zero_point=3, act_min=-128, act_max=127))
    runs = {model: _on(model, monkeypatch,
                       lambda: qgemm_batch(problems, config=config, sim="verilator"))
            for model in MODELS}
    for index, (problem, hdl, ext) in enumerate(zip(problems, runs["hdl"], runs["cocotbext"])):
        expected = reference_qgemm(**problem)
        assert np.array_equal(hdl.y, expected), f"problem {index}: wrong on the HDL DRAM"
        assert np.array_equal(ext.y, expected), f"problem {index}: wrong on cocotbext's DRAM"
        assert (hdl.cycles, hdl.instructions) == (ext.cycles, ext.instructions), \
            f"problem {index}: {hdl.cycles} and {ext.cycles} cycles"


@pytest.mark.parametrize("model", MODELS)
def test_errors_and_checker_verdicts_agree(model):
    """The controller's table of bad programs ends in the same errors at the same
    instructions, writing nothing, on both models; and a write response with no write
    outstanding, sent by either DRAM, is reported by the checker as B_UNEXPECTED."""
    from error_cases import CONFIG
    run_cocotb(CONFIG, "verilator", "tb.cocotb_faults",
               testcase=["error_table", "protocol_violation_is_reported"], dram=model,
               extra_env={"NPU_BACKPRESSURE": ""})


@pytest.mark.parametrize("bus_bytes, lines, written", [
    (4, ["5", "0"], [0, 2]),                                   # 32 bits: a digit a word
    (8, ["81", "// 0x00000001", "ff"], [0, 7, *range(8, 16)]),  # Icarus's address comments
    (64, ["8000000000000001", "1", "4000000000000000"], [0, 63, 64, 190]),
])
def test_write_log_of_the_hdl_dram(tmp_path, bus_bytes, lines, written):
    """The HDL DRAM's write log, one mask of bus_bytes bits a word, read back byte by byte,
    up to a 512-bit bus (masks of 64 bits)."""
    path = tmp_path / "dram_written.hex"
    path.write_text("\n".join(lines) + "\n")
    log = _read_written(path, bus_bytes)
    assert log.shape == (bus_bytes * (len(lines) - sum(line.startswith("//") for line in lines)),)
    assert np.flatnonzero(log).tolist() == written
