"""The GEMM compiler: tiles ``C = A @ B`` onto the fixed R x C weight-stationary array.

Shapes and memory layout (all row-major in DRAM):

* ``A``: INT8, ``M x K`` at ``a_addr``, row stride ``K`` bytes;
* ``B``: INT8, ``K x N`` at ``b_addr``, row stride ``N`` bytes;
* ``C``: INT32 little-endian, ``M x N`` at ``c_addr``, row stride ``4 N`` bytes.

B is cut into weight tiles of (up to) R rows of K by C columns of N. The weight-stationary
dataflow makes those tiles the outer loops and streams the rows of A innermost, so that every
weight load is amortised over a whole block of activation rows (seeds, section 4.2)::

    for each m-block of A rows (at most acc_depth rows, and fitting the scratchpad):
        [resident] LOAD_SPAD the whole m-block, one k-slice per k-tile, once
        for each n-tile (C columns of B and C):
            for each k-tile (R rows of B, columns of A):
                LOAD_SPAD  weight tile -> scratchpad rows 0 .. R-1
                PRELOAD    scratchpad row 0
                [streaming] LOAD_SPAD the k-slice of the m-block -> rows R .. R+mb-1
                MATMUL     m-block -> accumulator rows 0 .. mb-1 (accumulate after k-tile 0)
            STORE accumulator rows -> C

Ragged edges need no special code: a load zero-fills each scratchpad row past ``row_bytes``,
so activation lanes past the k-tile's width are zero. Weight rows past the k-tile's height may
still hold an older tile, but they only ever meet those zero lanes.

The "resident" schedule keeps the whole m-block of A (all k-slices) in the scratchpad and
reuses it for every n-tile; "streaming" reloads one k-slice per weight tile, which is the only
choice when K is too large for the scratchpad. ``schedule="auto"`` picks the one that moves
fewer bytes over the DRAM bus (data plus instruction fetch).
"""

import operator
from dataclasses import dataclass, replace

import numpy as np

from hw.config import NPUConfig
from hw.isa import INSTR_BYTES, Opcode
from . import codec
from .errors import NPUTypeError, NPUValueError, PlanError


__all__ = ["SCHEDULES", "GemmPlan", "Program", "plan_gemm", "compile_gemm"]


#: Accepted values of the ``schedule`` argument.
SCHEDULES = ("auto", "resident", "streaming")

_ADDRESS_SPACE = 1 << 32
#: Scratchpad row where the weight tile is loaded; activations start right after it.
_WEIGHT_BASE = 0


def _ceil_div(numerator, denominator):
    return -(-numerator // denominator)


@dataclass(frozen=True)
class GemmPlan:
    """How a GEMM is placed on the array, and what it costs.

    Attributes
    ----------
    config : str
        Name of the configuration (``RxC``).
    rows, cols : int
        R and C of the array.
    m, k, n : int
        The GEMM shape: ``(m x k) @ (k x n)``.
    schedule : str
        ``"resident"`` or ``"streaming"`` (see the module documentation).
    k_tiles, n_tiles : int
        ``ceil(k / rows)`` and ``ceil(n / cols)``.
    weight_tiles : int
        Distinct weight tiles of B: ``k_tiles * n_tiles``.
    m_blocks : int
        Blocks of A rows, each processed against every weight tile.
    block_rows : int
        Rows of A in a block (the last block may have fewer).
    weight_loads : int
        ``PRELOAD`` instructions: ``weight_tiles * m_blocks``.
    spad_rows_used, acc_rows_used : int
        Highest scratchpad / accumulator row used, plus one.
    dram_bytes_read, dram_bytes_written : int
        Bytes the DMA instructions move (instruction fetch excluded; see ``program_bytes``).
    instructions : int
        Program length, ``END`` included.
    """
    config: str
    rows: int
    cols: int
    m: int
    k: int
    n: int
    schedule: str
    k_tiles: int
    n_tiles: int
    weight_tiles: int
    m_blocks: int
    block_rows: int
    weight_loads: int
    spad_rows_used: int
    acc_rows_used: int
    dram_bytes_read: int
    dram_bytes_written: int
    instructions: int

    @property
    def program_bytes(self):
        """Bytes of the program in DRAM (each instruction is fetched once)."""
        return self.instructions * INSTR_BYTES

    @property
    def macs(self):
        """Useful multiply-accumulates: ``m * k * n``."""
        return self.m * self.k * self.n

    @property
    def tile_fill(self):
        """Useful MACs over the MAC slots that the ``MATMUL`` instructions occupy.

        A ragged tile takes as many cycles as a full one (seeds, section 4.1), so this is the
        best array utilization the plan can reach, before any load or store overhead.
        """
        return self.macs / (self.m * self.k_tiles * self.n_tiles * self.rows * self.cols)

    def summary(self):
        """A few readable lines about the plan."""
        return (f"{self.weight_tiles} weight tiles ({self.k_tiles} k-tiles x {self.n_tiles} "
                f"n-tiles of {self.rows}x{self.cols}), tile fill {self.tile_fill:.1%}\n"
                f"{self.m_blocks} m-block(s) of up to {self.block_rows} rows, {self.schedule} "
                f"schedule, {self.weight_loads} weight loads\n"
                f"scratchpad rows {self.spad_rows_used}, accumulator rows "
                f"{self.acc_rows_used}, {self.instructions} instructions\n"
                f"DRAM bytes: {self.dram_bytes_read} read, {self.dram_bytes_written} written, "
                f"{self.program_bytes} of program")


@dataclass(frozen=True)
class Program:
    """A compiled GEMM program.

    Attributes
    ----------
    words : list of int
        The 128-bit instruction words, ``END`` last.
    plan : GemmPlan
        The plan, with the DRAM byte counts and row usage counted from ``words``.
    a_addr, b_addr, c_addr : int
        The DRAM addresses the program was compiled for.
    """
    words: list
    plan: GemmPlan
    a_addr: int
    b_addr: int
    c_addr: int

    @property
    def bytes(self):
        """The program as it is laid out in DRAM: 16 bytes per instruction, little-endian."""
        return codec.pack_words(self.words)

    def __len__(self):
        return len(self.words)


def _as_int(name, value):
    # numpy integers (shapes, sizes) are fine; bools and floats are mistakes.
    if isinstance(value, (bool, np.bool_)):
        raise NPUTypeError(f"{name} must be an integer, not {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise NPUTypeError(f"{name} must be an integer, not {value!r}") from None


def _check_positive(name, value):
    value = _as_int(name, value)
    if value < 1:
        raise NPUValueError(f"{name} must be a positive integer, not {value}")
    return value


def _plan_for(config, m, k, n, schedule, block_rows):
    """The plan of one schedule with a given block height, counted by formula."""
    k_tiles = _ceil_div(k, config.rows)
    n_tiles = _ceil_div(n, config.cols)
    m_blocks = _ceil_div(m, block_rows)
    weight_tiles = k_tiles * n_tiles
    if schedule == "resident":
        activation_bytes = m * k                  # each element of A loaded once
        activation_rows = k_tiles * block_rows
        instructions = m_blocks * (k_tiles + n_tiles * (3 * k_tiles + 1)) + 1
    else:
        activation_bytes = n_tiles * m * k        # A reloaded for every n-tile
        activation_rows = block_rows
        instructions = m_blocks * n_tiles * (4 * k_tiles + 1) + 1
    return GemmPlan(
        config=config.name, rows=config.rows, cols=config.cols, m=m, k=k, n=n,
        schedule=schedule, k_tiles=k_tiles, n_tiles=n_tiles, weight_tiles=weight_tiles,
        m_blocks=m_blocks, block_rows=block_rows, weight_loads=weight_tiles * m_blocks,
        spad_rows_used=config.rows + activation_rows, acc_rows_used=block_rows,
        dram_bytes_read=activation_bytes + m_blocks * k * n,  # B reloaded for every m-block
        dram_bytes_written=4 * m * n, instructions=instructions)


def plan_gemm(config, m, k, n, *, schedule="auto"):
    """Choose how to place ``(m x k) @ (k x n)`` on ``config``, without emitting code.

    Parameters
    ----------
    config : hw.config.NPUConfig
    m, k, n : int
        Positive GEMM dimensions.
    schedule : str
        One of :data:`SCHEDULES`. ``"auto"`` picks the schedule with the least DRAM traffic
        (the resident one on a tie).

    Returns
    -------
    GemmPlan

    Raises
    ------
    PlanError
        If the scratchpad cannot hold a weight tile plus one activation row, or the requested
        schedule does not fit.
    """
    if not isinstance(config, NPUConfig):
        raise NPUTypeError(f"config must be an NPUConfig, not {config!r}")
    m, k, n = (_check_positive(name, value) for name, value in (("m", m), ("k", k), ("n", n)))
    if schedule not in SCHEDULES:
        raise NPUValueError(f"schedule must be one of {', '.join(SCHEDULES)}, "
                            f"not {schedule!r}")

    activation_capacity = config.spad_depth - config.rows
    if activation_capacity < 1:
        raise PlanError(f"config {config.name}: a scratchpad of {config.spad_depth} rows "
                        f"cannot hold a weight tile of {config.rows} rows plus one "
                        f"activation row")
    k_tiles = _ceil_div(k, config.rows)
    candidates = []
    resident_rows = min(m, config.acc_depth, activation_capacity // k_tiles)
    if schedule in ("auto", "resident"):
        if resident_rows >= 1:
            candidates.append(_plan_for(config, m, k, n, "resident", resident_rows))
        elif schedule == "resident":
            raise PlanError(f"config {config.name}: the resident schedule needs {k_tiles} "
                            f"scratchpad rows per row of A (K = {k}), but only "
                            f"{activation_capacity} rows are free next to the weight tile")
    if schedule in ("auto", "streaming"):
        streaming_rows = min(m, config.acc_depth, activation_capacity)
        candidates.append(_plan_for(config, m, k, n, "streaming", streaming_rows))

    def traffic(plan):
        return plan.dram_bytes_read + plan.dram_bytes_written + plan.program_bytes
    return min(candidates, key=traffic)  # min() keeps the first (resident) on a tie


def _check_region(name, addr, size):
    addr = _as_int(name, addr)
    if addr < 0 or addr + size > _ADDRESS_SPACE:
        raise PlanError(f"{name} = {addr:#x}: a region of {size} bytes there does not fit in "
                        f"the 32-bit DRAM address space")
    return addr


class _Emitter:
    """Encodes instructions and counts what they use, so the plan can be checked."""

    def __init__(self, config):
        self.config = config
        self.words = []
        self.bytes_read = 0
        self.bytes_written = 0
        self.spad_rows_used = 0
        self.acc_rows_used = 0
        self.weight_loads = 0

    def load_spad(self, local_addr, rows, row_bytes, dram_addr, dram_stride):
        self.words.append(codec.encode(
            Opcode.LOAD_SPAD, local_addr=local_addr, rows=rows, row_bytes=row_bytes,
            dram_addr=dram_addr, dram_stride=dram_stride))
        self.bytes_read += rows * row_bytes
        self.spad_rows_used = max(self.spad_rows_used, local_addr + rows)

    def preload(self, spad_addr):
        self.words.append(codec.encode(Opcode.PRELOAD, spad_addr=spad_addr))
        self.weight_loads += 1
        self.spad_rows_used = max(self.spad_rows_used, spad_addr + self.config.rows)

    def matmul(self, spad_addr, acc_addr, rows, accumulate):
        self.words.append(codec.encode(
            Opcode.MATMUL, spad_addr=spad_addr, acc_addr=acc_addr, rows=rows,
            accumulate=int(accumulate)))
        self.spad_rows_used = max(self.spad_rows_used, spad_addr + rows)
        self.acc_rows_used = max(self.acc_rows_used, acc_addr + rows)

    def store(self, acc_addr, rows, row_bytes, dram_addr, dram_stride):
        self.words.append(codec.encode(
            Opcode.STORE, acc_addr=acc_addr, rows=rows, row_bytes=row_bytes,
            dram_addr=dram_addr, dram_stride=dram_stride))
        self.bytes_written += rows * row_bytes
        self.acc_rows_used = max(self.acc_rows_used, acc_addr + rows)

    def end(self):
        self.words.append(codec.encode(Opcode.END))


def compile_gemm(config, m, k, n, *, a_addr, b_addr, c_addr, schedule="auto"):
    """Compile ``C = A @ B`` into a program for ``config``.

    Parameters
    ----------
    config : hw.config.NPUConfig
    m, k, n : int
        Positive GEMM dimensions.
    a_addr, b_addr, c_addr : int
        DRAM byte addresses of A (INT8, ``m x k``), B (INT8, ``k x n``) and C
        (INT32, ``m x n``), each stored row-major without padding.
    schedule : str
        One of :data:`SCHEDULES`; see :func:`plan_gemm`.

    Returns
    -------
    Program

    Raises
    ------
    PlanError
        As :func:`plan_gemm`, or when a matrix does not fit in the 32-bit address space.
    """
    plan = plan_gemm(config, m, k, n, schedule=schedule)
    m, k, n = plan.m, plan.k, plan.n
    a_addr = _check_region("a_addr", a_addr, m * k)
    b_addr = _check_region("b_addr", b_addr, k * n)
    c_addr = _check_region("c_addr", c_addr, 4 * m * n)

    rows, cols = config.rows, config.cols
    activation_base = _WEIGHT_BASE + rows
    resident = plan.schedule == "resident"
    c_stride = 4 * n
    emit = _Emitter(config)
    for m_start in range(0, m, plan.block_rows):
        block_rows = min(plan.block_rows, m - m_start)
        a_block_addr = a_addr + m_start * k
        if resident:
            # Slice k_tile of the block lives at activation_base + k_tile * plan.block_rows.
            for k_tile, k_start in enumerate(range(0, k, rows)):
                emit.load_spad(local_addr=activation_base + k_tile * plan.block_rows,
                               rows=block_rows, row_bytes=min(rows, k - k_start),
                               dram_addr=a_block_addr + k_start, dram_stride=k)
        for n_start in range(0, n, cols):
            n_width = min(cols, n - n_start)
            for k_tile, k_start in enumerate(range(0, k, rows)):
                k_height = min(rows, k - k_start)
                emit.load_spad(local_addr=_WEIGHT_BASE, rows=k_height, row_bytes=n_width,
                               dram_addr=b_addr + k_start * n + n_start, dram_stride=n)
                emit.preload(spad_addr=_WEIGHT_BASE)
                if resident:
                    activation_addr = activation_base + k_tile * plan.block_rows
                else:
                    activation_addr = activation_base
                    emit.load_spad(local_addr=activation_addr, rows=block_rows,
                                   row_bytes=k_height, dram_addr=a_block_addr + k_start,
                                   dram_stride=k)
                emit.matmul(spad_addr=activation_addr, acc_addr=0, rows=block_rows,
                            accumulate=k_tile > 0)
            emit.store(acc_addr=0, rows=block_rows, row_bytes=4 * n_width,
                       dram_addr=c_addr + m_start * c_stride + 4 * n_start,
                       dram_stride=c_stride)
    emit.end()

    counted = replace(plan, dram_bytes_read=emit.bytes_read,
                      dram_bytes_written=emit.bytes_written,
                      spad_rows_used=emit.spad_rows_used, acc_rows_used=emit.acc_rows_used,
                      weight_loads=emit.weight_loads, instructions=len(emit.words))
    if counted != plan:
        # The driver sizes DRAM from plan_gemm before compiling; a mismatch is a compiler bug.
        raise RuntimeError(f"compiler bug: the emitted program does not match its plan:\n"
                           f"planned {plan}\nemitted {counted}")
    return Program(words=emit.words, plan=counted, a_addr=a_addr, b_addr=b_addr,
                   c_addr=c_addr)
