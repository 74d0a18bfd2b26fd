"""What one run of a program produced, on any backend: :class:`RunResult`.

A leaf module (it imports only ``hw`` and numpy), so that the RTL runner (``sim.runner``) and
the instruction-level model (``sw.model``) return the same type without importing each other.
"""

from dataclasses import dataclass

import numpy as np

from hw.isa import ErrorCode


__all__ = ["RunResult"]


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
    link : dict or None
        On the SoC backends (``board``, ``soc``: :mod:`sw.board`), the bytes the run moved over
        the host link and the time it took (:meth:`sw.board.LinkStats.as_dict`); ``None``
        elsewhere.
    """
    done: bool
    error_code: ErrorCode
    error_pc: int
    cycles: "int | None"
    instructions: int
    dram: np.ndarray
    perf: "dict | None" = None
    link: "dict | None" = None
