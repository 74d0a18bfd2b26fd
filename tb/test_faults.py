"""Fault injection on the generated Verilog (tb/cocotb_faults.py), under Verilator and Icarus.

The 2x2 config is the one the controller tests' error table (tb/error_cases.py) is written
for. ``NPU_SEED`` picks the faults; the failure message names the command that reruns them.
"""

import os

import pytest

from error_cases import CONFIG as TABLE_CONFIG
from hw.config import NPUConfig
from sim.runner import run_cocotb


pytestmark = pytest.mark.rtl

SEED = os.environ.get("NPU_SEED", "31337")
FULL = os.environ.get("NPU_FULL") == "1"

CASES = [("verilator", "2x2", None), ("icarus", "2x2", None),
         ("verilator", "2x2", 5)]
if FULL:
    CASES += [("verilator", "3x5-32", None), ("verilator", "4x4-128", 7),
              ("icarus", "2x2", 11), ("icarus", "4x4-128", None)]

CONFIGS = {
    "2x2": TABLE_CONFIG,
    "3x5-32": NPUConfig.from_name("3x5", bus_width=32),
    "4x4-128": NPUConfig.from_name("4x4", bus_width=128),
}


@pytest.mark.parametrize("sim, config_name, backpressure", CASES,
                         ids=[f"{sim}-{name}" + (f"-bp{bp}" if bp is not None else "")
                              for sim, name, bp in CASES])
def test_faults(sim, config_name, backpressure, request):
    env = {"NPU_SEED": SEED}
    if backpressure is not None:
        env["NPU_BACKPRESSURE"] = str(backpressure)
    command = (f"NPU_SEED={SEED}{' NPU_FULL=1' if FULL else ''} .venv/bin/pytest "
               f"'tb/test_faults.py::{request.node.name}'")
    try:
        run_cocotb(CONFIGS[config_name], sim, "tb.cocotb_faults", extra_env=env)
    except AssertionError as error:
        raise AssertionError(f"{error}\nreproduce: {command}") from None


def test_bus_timeout_on_the_rtl():
    """The bus watchdog on the generated Verilog (tb/cocotb_faults.py's
    ``bus_timeout_then_soft_reset``), with cocotbext-axi's DRAM, which can stop answering."""
    run_cocotb(TABLE_CONFIG, "verilator", "tb.cocotb_faults",
               testcase="bus_timeout_then_soft_reset", dram="cocotbext",
               extra_env={"NPU_SEED": SEED, "NPU_BACKPRESSURE": ""})
