"""One entry point that runs a program on any of the NPU's execution backends.

``model`` is the instruction-level simulator in :mod:`sw.model`; ``verilator`` and ``icarus``
run the generated Verilog through cocotb (``sim.runner``). All of them take the same inputs and
return the same :class:`RunResult`, so the driver and the tests cannot tell them apart except
by speed and by the cycle count.

This module imports nothing heavy at import time: the simulators are imported when they are
first used, so that ``from sw.backend import RunResult`` stays cheap for ``sim.runner`` too.
"""

from dataclasses import dataclass

import numpy as np

from hw.isa import PERF_COUNTERS, ErrorCode
from .errors import BackendUnavailable, NPUValueError


# PERF_COUNTERS is defined in hw.isa; it stays importable from here for older callers.
__all__ = ["RunResult", "SIMULATORS", "PERF_COUNTERS", "run_program", "run_programs"]


#: Backend names accepted by :func:`run_program`.
SIMULATORS = ("verilator", "icarus", "model")


@dataclass
class RunResult:
    """What one run of a program produced.

    Attributes
    ----------
    done : bool
        ``True`` when the program reached ``END``; ``False`` when it stopped with an error.
    error_code : hw.isa.ErrorCode
        ``ErrorCode.NONE`` when ``done``.
    error_pc : int
        Index of the instruction that failed; 0 when ``done``.
    cycles : int or None
        Clock cycles from start to done or error; ``None`` from the model, which has no clock.
    instructions : int
        Instructions completed: ``END`` counts, the instruction that failed does not. For a
        straight-line program that is ``pc + 1`` after ``END`` and ``error_pc`` after an error.
    dram : numpy.ndarray
        The whole DRAM (``uint8``, one dimension) after the run.
    perf : dict or None
        The hardware's performance counters (:data:`hw.isa.PERF_COUNTERS`, read from the
        ``PERF_*`` registers); ``None`` from the model.
    """
    done: bool
    error_code: ErrorCode
    error_pc: int
    cycles: "int | None"
    instructions: int
    dram: np.ndarray
    perf: "dict | None" = None


def _import_rtl_runner():
    try:
        from sim.runner import run_programs as rtl_run
    except ModuleNotFoundError as error:
        # Only a missing sim.runner means "not available"; a broken import inside it is a bug
        # that must keep its traceback.
        if error.name not in ("sim", "sim.runner"):
            raise
        raise BackendUnavailable("the RTL simulation backends (verilator, icarus) are not "
                                 "available: sim.runner is not installed") from error
    return rtl_run


def run_program(config, sim, dram, prog_addr, prog_len):
    """Run the program at ``prog_addr`` in ``dram`` on the backend named ``sim``.

    Parameters
    ----------
    config : hw.config.NPUConfig
        The NPU instance to run on.
    sim : str
        One of :data:`SIMULATORS`.
    dram : numpy.ndarray
        The initial DRAM contents, ``uint8`` in one dimension; it is not modified.
    prog_addr : int
        Byte address of the first instruction (16-byte aligned for the program to start).
    prog_len : int
        Maximum number of instructions to execute before ``END``.

    Returns
    -------
    RunResult
    """
    if sim == "model":
        from .model import ModelNPU
        return ModelNPU(config).run(dram, prog_addr, prog_len)
    return run_programs(config, sim, [(dram, prog_addr, prog_len)])[0]


def run_programs(config, sim, programs):
    """Run several ``(dram, prog_addr, prog_len)`` programs one after another.

    On the RTL backends they share one simulation (the NPU is not reset between them); the
    model starts each from reset. Returns one :class:`RunResult` per program.
    """
    if sim == "model":
        from .model import ModelNPU
        return [ModelNPU(config).run(dram, prog_addr, prog_len)
                for dram, prog_addr, prog_len in programs]
    if sim in ("verilator", "icarus"):
        return _import_rtl_runner()(config, sim, programs)
    raise NPUValueError(f"sim must be one of {', '.join(SIMULATORS)}, not {sim!r}")
