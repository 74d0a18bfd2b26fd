"""One entry point that runs a program on any of the NPU's execution backends.

``model`` is the instruction-level simulator in :mod:`sw.model`; ``verilator`` and ``icarus``
run the generated Verilog through cocotb (``sim.runner``); ``soc`` runs it in the whole LiteX
SoC under Verilator (SDRAM through LiteDRAM, the host through the UART bridge) and ``board``
on a board with that SoC (:mod:`sw.board`; its port from ``NPU_BOARD``, the CLI's ``--port``). All of them take the same inputs and
return the same :class:`~sim.result.RunResult`, so the driver and the tests cannot tell them
apart except by speed and by the cycle count.

This module imports nothing heavy at import time: the simulators are imported when they are
first used.
"""

from hw.isa import PERF_COUNTERS
from sim.result import RunResult
from .errors import BackendUnavailable, NPUValueError


# RunResult is defined in sim.result, PERF_COUNTERS in hw.isa; both stay importable from here.
__all__ = ["RunResult", "SIMULATORS", "PERF_COUNTERS", "run_program", "run_programs",
           "dram_capacity", "check_dram"]


#: Backend names accepted by :func:`run_program`.
SIMULATORS = ("verilator", "icarus", "model", "soc", "board")


def dram_capacity(config, sim):
    """Bytes of DRAM one program image may take on the backend ``sim``: what the NPU's
    addresses reach (``config.dram_bytes``, 4 GiB) on the model and on the RTL simulators,
    whose DRAM is sized to the image (``sim/dram.py``); the SoC's SDRAM on ``soc`` and
    ``board``."""
    if sim in ("soc", "board"):
        from soc.memory_map import DRAM_SIZE
        return min(DRAM_SIZE, config.dram_bytes)
    return config.dram_bytes


def check_dram(config, sim, programs):
    """Refuse, in one line and before anything runs, a ``(dram, prog_addr, prog_len)``
    program whose image does not fit :func:`dram_capacity`."""
    capacity = dram_capacity(config, sim)
    for index, (dram, _, _) in enumerate(programs):
        if len(dram) > capacity:
            where = (f"the SoC's SDRAM holds {capacity:,}" if sim in ("soc", "board")
                     else f"a {config.addr_width}-bit address reaches {capacity:,}")
            which = f"program {index} of {len(programs)}" if len(programs) > 1 else "the program"
            raise NPUValueError(f"{which} and its data take {len(dram):,} bytes of DRAM; "
                                f"{where} (--sim {sim})")


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


def _run_rtl(config, sim, programs):
    rtl_run = _import_rtl_runner()
    from sim.toolchain import SimulatorMissing, setup
    try:
        setup(sim)       # before the runner makes its job folder and starts cocotb
        return rtl_run(config, sim, programs)
    except SimulatorMissing as error:
        raise BackendUnavailable(str(error)) from error


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

    Raises
    ------
    sw.errors.BackendUnavailable
        If ``sim`` is an RTL simulator that is not installed (the message says how to
        install it), or ``sim.runner`` is missing.
    """
    if sim == "model":
        from .model import ModelNPU
        check_dram(config, sim, [(dram, prog_addr, prog_len)])
        return ModelNPU(config).run(dram, prog_addr, prog_len)
    return run_programs(config, sim, [(dram, prog_addr, prog_len)])[0]


def run_programs(config, sim, programs):
    """Run several ``(dram, prog_addr, prog_len)`` programs one after another.

    On the RTL backends they share one simulation (the NPU is not reset between them); the
    model starts each from reset. Returns one :class:`RunResult` per program. An image
    larger than the backend's DRAM (:func:`dram_capacity`) is refused before any runs.
    """
    programs = list(programs)
    if sim in SIMULATORS:
        check_dram(config, sim, programs)
    if sim == "model":
        from .model import ModelNPU
        return [ModelNPU(config).run(dram, prog_addr, prog_len)
                for dram, prog_addr, prog_len in programs]
    if sim in ("verilator", "icarus"):
        return _run_rtl(config, sim, programs)
    if sim == "soc":
        from .board import run_on_simulated_soc
        return run_on_simulated_soc(config, programs)
    if sim == "board":
        from .board import run_on_board
        return run_on_board(config, programs)
    raise NPUValueError(f"sim must be one of {', '.join(SIMULATORS)}, not {sim!r}")
