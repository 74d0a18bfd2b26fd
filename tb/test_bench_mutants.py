"""The bench's checks catch a broken bench. Each test runs real regression checks on a mutant
(``NPU_MUTANT``, see :class:`sim.bench.TB`) and requires them to fail:

* ``drop_writes``: the DRAM in the simulated hardware answers every write but loses every
  eighth write beat. The GEMM results, the back-pressure runs and the fault tests catch it.
* ``checker_without_B_UNEXPECTED``: the AXI4 protocol checker with one rule taken out. The
  protocol test, which has the DRAM send a write response nobody asked for, catches it.

The same checks pass on the unbroken bench in tb/test_rtl.py, tb/test_faults.py and
tb/test_dram_models.py.
"""

import numpy as np
import pytest

from error_cases import CONFIG as TABLE_CONFIG
from hw.config import NPUConfig
from sim.runner import run_cocotb
from sw.driver import gemm_batch, reference_gemm


pytestmark = pytest.mark.rtl

SEED = 20261203


def _pairs(config, count):
    rng = np.random.default_rng(SEED)
    shapes = [(9, 2 * config.rows + 1, 2 * config.cols + 3)] * count
    return [(rng.integers(-128, 128, size=(m, k), dtype=np.int8),
             rng.integers(-128, 128, size=(k, n), dtype=np.int8)) for m, k, n in shapes]


@pytest.mark.parametrize("backpressure", [None, "5"], ids=["plain", "backpressure"])
def test_gemms_catch_a_dram_that_drops_writes(backpressure, monkeypatch):
    config = NPUConfig.from_name("4x4")
    pairs = _pairs(config, 3)
    monkeypatch.setenv("NPU_DRAM", "hdl")
    if backpressure is None:
        monkeypatch.delenv("NPU_BACKPRESSURE", raising=False)
    else:
        monkeypatch.setenv("NPU_BACKPRESSURE", backpressure)
    monkeypatch.setenv("NPU_MUTANT", "drop_writes")
    results = gemm_batch(pairs, config=config, sim="verilator")
    wrong = [not np.array_equal(result.c, reference_gemm(a, b))
             for (a, b), result in zip(pairs, results)]
    assert any(wrong), "every GEMM came out right on a DRAM that drops writes"


def test_fault_tests_catch_a_dram_that_drops_writes():
    with pytest.raises(AssertionError, match="C differs"):
        run_cocotb(TABLE_CONFIG, "verilator", "tb.cocotb_faults",
                   testcase="bus_faults_in_a_gemm", dram="hdl",
                   extra_env={"NPU_MUTANT": "drop_writes", "NPU_BACKPRESSURE": ""})


@pytest.mark.parametrize("dram", ["hdl", "cocotbext"])
def test_protocol_test_catches_a_checker_without_its_rule(dram):
    with pytest.raises(AssertionError, match="protocol_violation_is_reported"):
        run_cocotb(TABLE_CONFIG, "verilator", "tb.cocotb_faults",
                   testcase="protocol_violation_is_reported", dram=dram,
                   extra_env={"NPU_MUTANT": "checker_without_B_UNEXPECTED",
                              "NPU_BACKPRESSURE": ""})
