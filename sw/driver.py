"""The host driver: run an INT8 GEMM on the NPU (or its model) and read back the result.

DRAM layout used by :func:`gemm` (every region starts 64-byte aligned)::

    0x0000          64 zero bytes: a program pointer of 0 hits an illegal (zero) opcode
    0x0040          program, 16 bytes per instruction, END last
    a_addr          A, INT8, M x K row-major
    b_addr          B, INT8, K x N row-major
    c_addr          C, INT32 little-endian, M x N row-major, filled with a 0xA5 poison
                    pattern before the run so that a missed store cannot read as zero
    size            the end of C rounded up to a multiple of 4 KiB

The program sits below the data, so a store that ran past C could not overwrite it.
"""

from dataclasses import dataclass

import numpy as np

from hw.config import MAX_K, NPUConfig
from . import backend
from .compiler import compile_gemm, plan_gemm
from .errors import NPURunError, NPUTypeError, NPUValueError


__all__ = ["DramLayout", "GemmResult", "gemm", "gemm_batch", "reference_gemm", "layout_dram",
           "PROGRAM_ADDR", "REGION_ALIGN", "DRAM_GRANULE", "POISON"]


#: Byte address of the program: non-zero so that a zero program pointer cannot run it.
PROGRAM_ADDR = 0x40
#: Alignment of every DRAM region.
REGION_ALIGN = 64
#: The DRAM size is rounded up to a multiple of this.
DRAM_GRANULE = 4096
#: Byte written over C before the run.
POISON = 0xA5

_ADDRESS_SPACE = 1 << 32


def _align(value, alignment):
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class DramLayout:
    """Where :func:`gemm` puts everything in DRAM (byte addresses and sizes)."""
    program_addr: int
    program_bytes: int
    a_addr: int
    a_bytes: int
    b_addr: int
    b_bytes: int
    c_addr: int
    c_bytes: int
    size: int


def layout_dram(m, k, n, instructions):
    """Lay out the program and the three matrices of an ``(m x k) @ (k x n)`` GEMM.

    Parameters
    ----------
    m, k, n : int
        The GEMM shape.
    instructions : int
        Length of the program.

    Returns
    -------
    DramLayout

    Raises
    ------
    NPUValueError
        If the whole layout does not fit in the 4 GiB a 32-bit address reaches.
    """
    program_bytes = 16 * instructions
    a_addr = _align(PROGRAM_ADDR + program_bytes, REGION_ALIGN)
    b_addr = _align(a_addr + m * k, REGION_ALIGN)
    c_addr = _align(b_addr + k * n, REGION_ALIGN)
    size = _align(c_addr + 4 * m * n, DRAM_GRANULE)
    if size > _ADDRESS_SPACE:
        raise NPUValueError(f"a {m}x{k} @ {k}x{n} GEMM needs {size} bytes of DRAM (program "
                            f"and matrices), more than the 4 GiB a 32-bit address reaches")
    return DramLayout(program_addr=PROGRAM_ADDR, program_bytes=program_bytes,
                      a_addr=a_addr, a_bytes=m * k, b_addr=b_addr, b_bytes=k * n,
                      c_addr=c_addr, c_bytes=4 * m * n, size=size)


@dataclass(frozen=True)
class GemmResult:
    """The product and how it was computed.

    Attributes
    ----------
    c : numpy.ndarray
        ``int32``, ``M x N``.
    config : hw.config.NPUConfig
    sim : str
        The backend that ran the program.
    plan : sw.compiler.GemmPlan
    layout : DramLayout
    cycles : int or None
        Clock cycles of the run; ``None`` on the model.
    instructions : int
        Instructions executed, ``END`` included.
    """
    c: np.ndarray
    config: NPUConfig
    sim: str
    plan: object
    layout: DramLayout
    cycles: "int | None"
    instructions: int

    @property
    def weight_tiles(self):
        return self.plan.weight_tiles

    @property
    def macs(self):
        """Useful multiply-accumulates, ``M * K * N``."""
        return self.plan.macs

    @property
    def utilization(self):
        """``macs / (cycles * R * C)``, or ``None`` when the backend counts no cycles."""
        if self.cycles is None:
            return None
        return self.macs / (self.cycles * self.config.rows * self.config.cols)


def _check_matrix(name, matrix):
    if not isinstance(matrix, np.ndarray):
        raise NPUTypeError(f"{name} must be a numpy array of int8, not {type(matrix).__name__}")
    if matrix.dtype != np.int8:
        # Casting would silently clip or round; the caller must quantize explicitly.
        raise NPUTypeError(f"{name} must have dtype int8, not {matrix.dtype}; quantize it "
                           f"explicitly (the NPU computes INT8 x INT8 only)")
    if matrix.ndim != 2:
        raise NPUValueError(f"{name} must be two-dimensional, not of shape {matrix.shape}")
    if matrix.size == 0:
        raise NPUValueError(f"{name} must not be empty, but its shape is {matrix.shape}")


def _check_operands(A, B):
    _check_matrix("A", A)
    _check_matrix("B", B)
    if A.shape[1] != B.shape[0]:
        raise NPUValueError(f"inner dimensions differ: A is {A.shape[0]}x{A.shape[1]} and B is "
                            f"{B.shape[0]}x{B.shape[1]} (A's columns must equal B's rows)")
    if A.shape[1] > MAX_K:
        raise NPUValueError(f"K = {A.shape[1]} is larger than MAX_K = {MAX_K}: a longer INT8 "
                            f"dot product could overflow the INT32 accumulator")


def reference_gemm(A, B):
    """The exact product the NPU must return: ``A.astype(int32) @ B.astype(int32)``."""
    return A.astype(np.int32) @ B.astype(np.int32)


def gemm(A, B, config=None, sim="model", *, schedule="auto"):
    """Compute ``A @ B`` on the NPU, bit-exactly in INT32.

    Parameters
    ----------
    A : numpy.ndarray
        ``int8``, ``M x K``.
    B : numpy.ndarray
        ``int8``, ``K x N``, with ``K <= hw.config.MAX_K``.
    config : hw.config.NPUConfig, optional
        The NPU instance; the default is ``NPUConfig()`` (8x8).
    sim : str
        ``"model"`` (default), ``"verilator"`` or ``"icarus"``.
    schedule : str
        Compiler schedule, see :func:`sw.compiler.plan_gemm`.

    Returns
    -------
    GemmResult

    Raises
    ------
    NPUTypeError
        If A or B is not an int8 numpy array, or config is not an NPUConfig.
    NPUValueError
        On a bad shape, K > MAX_K, an unknown sim, or a GEMM that does not fit in DRAM.
    sw.errors.PlanError
        If the compiler cannot place the GEMM on this config.
    NPURunError
        If the program stopped with an error instead of reaching END.
    sw.errors.BackendUnavailable
        If the chosen RTL simulator is not installed.
    """
    return gemm_batch([(A, B)], config=config, sim=sim, schedule=schedule)[0]


@dataclass(frozen=True)
class _Job:
    program: object
    layout: DramLayout
    dram: np.ndarray
    m: int
    n: int


def _prepare(A, B, config, schedule):
    """Check the operands, compile the GEMM and build its DRAM image."""
    _check_operands(A, B)
    m, k = A.shape
    n = B.shape[1]
    plan = plan_gemm(config, m, k, n, schedule=schedule)
    layout = layout_dram(m, k, n, plan.instructions)
    program = compile_gemm(config, m, k, n, a_addr=layout.a_addr, b_addr=layout.b_addr,
                           c_addr=layout.c_addr, schedule=schedule)

    dram = np.zeros(layout.size, dtype=np.uint8)
    dram[layout.program_addr:layout.program_addr + layout.program_bytes] = \
        np.frombuffer(program.bytes, dtype=np.uint8)
    dram[layout.a_addr:layout.a_addr + layout.a_bytes] = np.ascontiguousarray(A).view(
        np.uint8).reshape(-1)
    dram[layout.b_addr:layout.b_addr + layout.b_bytes] = np.ascontiguousarray(B).view(
        np.uint8).reshape(-1)
    dram[layout.c_addr:layout.c_addr + layout.c_bytes] = POISON
    return _Job(program=program, layout=layout, dram=dram, m=m, n=n)


def _finish(job, result, config, sim):
    """Check how the program ended and read C out of the DRAM it left."""
    layout = job.layout
    if not result.done:
        raise NPURunError(result.error_code, result.error_pc,
                          f"the NPU program stopped with error {result.error_code.name} at "
                          f"instruction {result.error_pc} of {len(job.program)} ({sim}, "
                          f"{config.name})")
    c = (result.dram[layout.c_addr:layout.c_addr + layout.c_bytes].view("<i4")
         .reshape(job.m, job.n).astype(np.int32))
    return GemmResult(c=c, config=config, sim=sim, plan=job.program.plan, layout=layout,
                      cycles=result.cycles, instructions=result.instructions)


def gemm_batch(pairs, config=None, sim="model", *, schedule="auto"):
    """Compute ``A @ B`` for each ``(A, B)`` in ``pairs``, in one run of the backend.

    On the RTL backends the GEMMs run one after another in a single simulation (one
    simulator start instead of one per GEMM); the NPU is not reset between them. Every pair
    is checked before anything runs. Arguments, results and errors are as for :func:`gemm`.
    """
    if config is None:
        config = NPUConfig()
    if not isinstance(config, NPUConfig):
        raise NPUTypeError(f"config must be an NPUConfig, not {config!r}")
    if sim not in backend.SIMULATORS:
        raise NPUValueError(f"sim must be one of {', '.join(backend.SIMULATORS)}, "
                            f"not {sim!r}")
    jobs = [_prepare(A, B, config, schedule) for A, B in pairs]
    results = backend.run_programs(
        config, sim, [(job.dram, job.layout.program_addr, len(job.program)) for job in jobs])
    return [_finish(job, result, config, sim) for job, result in zip(jobs, results)]
