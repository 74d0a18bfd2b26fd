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

Quantized layers (:func:`compile_qgemm`, and :mod:`sw.conv` for convolutions) go through one
more general core: the output rows of the layer ("pixels") are gathered from DRAM by a
:class:`RowGather`, which says where the activation row of each output row and each kernel
tap lies, and where each output row goes. Per m-block and n-tile the program is::

    LOAD_ACC   the bias row (INT32), DRAM stride 0: replicated into every accumulator row
    for each tap, for each k-tile:
        LOAD_SPAD  weight tile; PRELOAD
        [streaming] LOAD_SPAD the block's activation rows, one instruction per strided run
        MATMUL     accumulate = 1
    LOAD_QUANT the n-tile's multipliers and shifts (once for the program if there is one n-tile)
    STORE_Q    requantized INT8 rows, one instruction per strided run

The quantization parameters of a layer are two INT32 rows of N lanes in DRAM, multipliers
then shifts (``quant_addr`` and ``quant_addr + 4 N``); n-tile ``t`` reads lanes ``t C ..``
of both with one ``LOAD_QUANT`` (``dram_stride = 4 N``). With
``quant_mode=QuantMode.FLOAT`` the first row holds float32 scales and the second zeros (the
``LOAD_QUANT``s say so; the program is otherwise the same).
"""

import operator
from dataclasses import dataclass, replace

import numpy as np

from hw.config import NPUConfig
from hw.isa import INSTR_BYTES, Opcode, QuantMode
from . import codec
from .errors import NPUTypeError, NPUValueError, PlanError


__all__ = ["SCHEDULES", "GemmPlan", "Program", "plan_gemm", "compile_gemm",
           "QuantPlan", "QuantProgram", "RowGather", "GemmGather", "plan_qgemm",
           "compile_qgemm", "plan_quantized", "compile_quantized",
           "scalesim_cycles"]


#: Accepted values of the ``schedule`` argument.
SCHEDULES = ("auto", "overlap", "resident", "streaming")

_ADDRESS_SPACE = 1 << 32
#: Scratchpad row where the weight tile is loaded; activations start right after it.
_WEIGHT_BASE = 0
#: Most rows one DMA or MATMUL instruction moves: its ``rows`` field is 16 bits wide.
_MAX_INSTRUCTION_ROWS = (1 << 16) - 1


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
    group_tiles: int = 1

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

    @property
    def mapping_efficiency(self):
        """Useful PE-cells over provisioned PE-cells of the weight tiles (seeds section 4.1):
        ``k * n / (weight_tiles * R * C)``; equal to :attr:`tile_fill`."""
        return (self.k * self.n) / (self.weight_tiles * self.rows * self.cols)

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

    @property
    def body(self):
        """The words without the final ``END``: programs chain by concatenating bodies."""
        return self.words[:-1]

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


def _overlap_emit(emit, config, m, k, n, a_addr, b_addr, c_addr, a_stride, b_stride,
                  block_rows, group_tiles):
    """Emit the "overlap" schedule: ping-pong buffers, so that the units run side by side.

    The work is cut into units of ``block_rows`` rows of A by ``group_tiles`` n-tiles; a unit
    takes one accumulator half (``acc_depth // 2`` rows), the units alternate between the
    two halves. A unit is a sequence of k-steps; a k-step loads one k-slice of the block's A
    (``LOAD_SPAD`` into one of two activation buffers, during the step before) and runs the
    group's weight tiles against it::

        for each k-step s, for each n-tile j of its group:
            LOAD_SPAD weight tile -> weight buffer (alternating)
            [after every weight tile but the first (after the first if the group has
             one): a piece of the k-slice of step s + 1 -> the other activation buffer]
            PRELOAD   the weight buffer         (shifts in while the array computes)
            [STOREs of earlier units: one when the writer should be free, and any
             whose accumulator rows this MATMUL writes again]
            MATMUL    activation buffer -> accumulator rows of (unit half, j)

    The hardware checks every dependency (docs/architecture.md), so this order only decides
    how much overlaps, never what is computed.
    """
    rows, cols = config.rows, config.cols
    half = config.acc_depth // 2
    weight_base, activation_base = 0, 2 * rows
    k_tiles = _ceil_div(k, rows)
    n_tiles = _ceil_div(n, cols)
    c_stride = 4 * n
    bus_bytes = config.bus_bytes

    units = []
    for m_start in range(0, m, block_rows):
        for n_tile0 in range(0, n_tiles, group_tiles):
            units.append((m_start, min(block_rows, m - m_start),
                          list(range(n_tile0, min(n_tile0 + group_tiles, n_tiles)))))
    steps = [(u, k_tile) for u in range(len(units)) for k_tile in range(k_tiles)]

    def load_activations(step_index, piece=0, pieces=1):
        # Piece `piece` of `pieces` of the step's k-slice: short loads leave the reader free
        # for the next weight tile in time.
        u, k_tile = steps[step_index]
        m_start, unit_rows, _ = units[u]
        k_start = k_tile * rows
        size = _ceil_div(unit_rows, pieces)
        first, last = piece * size, min(unit_rows, (piece + 1) * size)
        if first < last:
            emit.load_spad(local_addr=activation_base + (step_index % 2) * block_rows + first,
                           rows=last - first, row_bytes=min(rows, k - k_start),
                           dram_addr=a_addr + (m_start + first) * a_stride + k_start,
                           dram_stride=a_stride)

    def stores_of(u):
        m_start, unit_rows, tiles = units[u]
        return [dict(acc_addr=(u % 2) * half + index * unit_rows, rows=unit_rows,
                     row_bytes=4 * min(cols, n - tile * cols),
                     dram_addr=c_addr + m_start * c_stride + 4 * tile * cols,
                     dram_stride=c_stride)
                for index, tile in enumerate(tiles)]

    # The stores of a unit go while the units after it compute, in order, each when the DMA
    # writer is estimated to be done with the one before (a store waiting at the issue stage
    # would hold up the MATMULs behind it), and at the latest right before the first MATMUL
    # that writes its accumulator rows again. The estimate counts a store's rows at the
    # writer's pace (a cycle more than the row's beats) and a MATMUL's rows, or the time it
    # waits for its weights (R rows after the array's R + C - 1 cycles of guard).
    def store_cycles(fields):
        beats = _ceil_div(fields["row_bytes"], bus_bytes) + (c_stride % bus_bytes != 0)
        return fields["rows"] * (beats + 1) + 8

    pending = []                # [fields, earliest estimated cycle], in program order
    now = writer_free = 0       # estimated cycles: of the next MATMUL, of the writer's end
    weight_buffer = 0
    load_activations(0)
    for step_index, (u, k_tile) in enumerate(steps):
        m_start, unit_rows, tiles = units[u]
        k_start = k_tile * rows
        k_height = min(rows, k - k_start)
        for index, tile in enumerate(tiles):
            n_start = tile * cols
            n_width = min(cols, n - n_start)
            acc_addr = (u % 2) * half + index * unit_rows
            w_addr = weight_base + weight_buffer * rows
            emit.load_spad(local_addr=w_addr, rows=k_height, row_bytes=n_width,
                           dram_addr=b_addr + k_start * b_stride + n_start,
                           dram_stride=b_stride)
            if step_index + 1 < len(steps):
                if len(tiles) == 1:
                    load_activations(step_index + 1)
                elif index >= 1:
                    load_activations(step_index + 1, index - 1, len(tiles) - 1)
            emit.preload(spad_addr=w_addr)
            # Stores due now, and every store up to the last one whose rows this MATMUL
            # overwrites; at most one that is merely due, so that they do not queue up.
            last_needed = max((i for i, (fields, _) in enumerate(pending)
                               if fields["acc_addr"] < acc_addr + unit_rows
                               and acc_addr < fields["acc_addr"] + fields["rows"]),
                              default=-1)
            count = last_needed + 1
            if count < len(pending) and pending[count][1] <= now:
                count += 1
            for fields, _ in pending[:count]:
                emit.store(**fields)
            del pending[:count]
            emit.matmul(spad_addr=activation_base + (step_index % 2) * block_rows,
                        acc_addr=acc_addr, rows=unit_rows,
                        accumulate=k_tile > 0, k_width=k_height, n_width=n_width)
            matmul_cycles = max(unit_rows, 2 * rows + cols)
            now += matmul_cycles
            weight_buffer ^= 1
        if k_tile == k_tiles - 1:
            # The unit's last MATMUL drains while the next one streams.
            for fields in stores_of(u):
                start = max(now + matmul_cycles, writer_free)
                pending.append([fields, start])
                writer_free = start + store_cycles(fields)
    for fields, _ in pending:
        emit.store(**fields)
    emit.end()


def _overlap_candidates(config, m, k, n):
    """(block_rows, group_tiles) pairs worth considering for the overlap schedule."""
    half = config.acc_depth // 2
    free_rows = config.spad_depth - 2 * config.rows
    n_tiles = _ceil_div(n, config.cols)
    candidates = []
    for group_tiles in range(1, n_tiles + 1):
        block_rows = min(m, half // group_tiles, free_rows // 2, _MAX_INSTRUCTION_ROWS)
        if block_rows < 1:
            break
        if candidates and candidates[-1][0] == block_rows and group_tiles > 1:
            candidates[-1] = (block_rows, group_tiles)   # same block height: group more
        else:
            candidates.append((block_rows, group_tiles))
    return candidates


def _overlap_estimate(config, m, k, n, block_rows, group_tiles):
    """A rough cycle estimate of the overlap schedule, to choose its block shape (the exact
    count of a compiled program is :func:`sw.timing.predict`'s)."""
    rows, cols, bus = config.rows, config.cols, config.bus_bytes
    k_tiles, n_tiles = _ceil_div(k, rows), _ceil_div(n, cols)
    m_blocks = _ceil_div(m, block_rows)
    groups = _ceil_div(n_tiles, group_tiles)
    act_beats = _ceil_div(min(rows, k) + bus - 1, bus)
    weight_beats = _ceil_div(min(cols, n) + bus - 1, bus)
    steps = m_blocks * groups * k_tiles
    per_matmul_overhead = 2 * rows + cols + 4 * (weight_beats + 1)
    compute = steps * group_tiles * max(block_rows, per_matmul_overhead)
    reader = (m * k_tiles * groups * act_beats
              + m_blocks * k_tiles * n_tiles * rows * weight_beats
              + steps * (3 * group_tiles + 1) * _ceil_div(INSTR_BYTES, bus))
    store_row = _ceil_div(4 * min(cols, n), bus) + 2
    stores = m * n_tiles * store_row
    tail = block_rows * group_tiles * store_row
    return max(compute, reader, stores) + tail


def scalesim_cycles(config, m, k, n):
    """Cycles of SCALE-Sim's weight-stationary model, which does not overlap weight tiles:
    ``ceil(K/R) * ceil(N/C) * (2R + C + M - 2)``."""
    return (_ceil_div(k, config.rows) * _ceil_div(n, config.cols)
            * (2 * config.rows + config.cols + m - 2))


def _overlap_plan(config, m, k, n, block_rows, group_tiles):
    emit = _Emitter(config, dry=True)
    _overlap_emit(emit, config, m, k, n, 0, 0, 0, k, n, block_rows, group_tiles)
    k_tiles, n_tiles = _ceil_div(k, config.rows), _ceil_div(n, config.cols)
    return GemmPlan(
        config=config.name, rows=config.rows, cols=config.cols, m=m, k=k, n=n,
        schedule="overlap", k_tiles=k_tiles, n_tiles=n_tiles,
        weight_tiles=k_tiles * n_tiles, m_blocks=_ceil_div(m, block_rows),
        block_rows=block_rows, weight_loads=emit.weight_loads,
        spad_rows_used=emit.spad_rows_used, acc_rows_used=emit.acc_rows_used,
        dram_bytes_read=emit.bytes_read, dram_bytes_written=emit.bytes_written,
        instructions=emit.instructions, group_tiles=group_tiles)


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

    if schedule in ("auto", "overlap"):
        if config.acc_depth >= 2 and config.spad_depth >= 2 * config.rows + 2:
            shape = min(_overlap_candidates(config, m, k, n),
                        key=lambda c: _overlap_estimate(config, m, k, n, *c))
            return _overlap_plan(config, m, k, n, *shape)
        if schedule == "overlap":
            raise PlanError(f"config {config.name}: the overlap schedule needs two weight "
                            f"tiles and two activation rows in the scratchpad "
                            f"({2 * config.rows + 2} rows, not {config.spad_depth}) and two "
                            f"accumulator rows ({config.acc_depth})")

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
    """Encodes instructions and counts what they use, so the plan can be checked.

    A ``dry`` emitter only counts (planning runs the emission once per candidate schedule;
    encoding is most of its cost).
    """

    def __init__(self, config, dry=False):
        self.config = config
        self.dry = dry
        self.words = []
        self.instructions = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.spad_rows_used = 0
        self.acc_rows_used = 0
        self.weight_loads = 0

    def _emit(self, opcode, **fields):
        self.instructions += 1
        if not self.dry:
            self.words.append(codec.encode(opcode, **fields))

    def load_spad(self, local_addr, rows, row_bytes, dram_addr, dram_stride):
        self._emit(Opcode.LOAD_SPAD, local_addr=local_addr, rows=rows, row_bytes=row_bytes,
                   dram_addr=dram_addr, dram_stride=dram_stride)
        self.bytes_read += rows * row_bytes
        self.spad_rows_used = max(self.spad_rows_used, local_addr + rows)

    def load_acc(self, local_addr, rows, row_bytes, dram_addr, dram_stride):
        self._emit(Opcode.LOAD_ACC, local_addr=local_addr, rows=rows, row_bytes=row_bytes,
                   dram_addr=dram_addr, dram_stride=dram_stride)
        self.bytes_read += rows * row_bytes
        self.acc_rows_used = max(self.acc_rows_used, local_addr + rows)

    def preload(self, spad_addr):
        self._emit(Opcode.PRELOAD, spad_addr=spad_addr)
        self.weight_loads += 1
        self.spad_rows_used = max(self.spad_rows_used, spad_addr + self.config.rows)

    def matmul(self, spad_addr, acc_addr, rows, accumulate, k_width=0, n_width=0):
        self._emit(Opcode.MATMUL, spad_addr=spad_addr, acc_addr=acc_addr, rows=rows,
                   accumulate=int(accumulate), k_width=k_width, n_width=n_width)
        self.spad_rows_used = max(self.spad_rows_used, spad_addr + rows)
        self.acc_rows_used = max(self.acc_rows_used, acc_addr + rows)

    def store(self, acc_addr, rows, row_bytes, dram_addr, dram_stride):
        self._emit(Opcode.STORE, acc_addr=acc_addr, rows=rows, row_bytes=row_bytes,
                   dram_addr=dram_addr, dram_stride=dram_stride)
        self.bytes_written += rows * row_bytes
        self.acc_rows_used = max(self.acc_rows_used, acc_addr + rows)

    def load_quant(self, dram_addr, dram_stride, row_bytes, zero_point, act_min, act_max,
                   mode):
        self._emit(Opcode.LOAD_QUANT, dram_addr=dram_addr, dram_stride=dram_stride,
                   row_bytes=row_bytes, zero_point=zero_point, act_min=act_min,
                   act_max=act_max, mode=mode)
        self.bytes_read += 2 * row_bytes

    def store_q(self, acc_addr, rows, row_bytes, dram_addr, dram_stride):
        self._emit(Opcode.STORE_Q, acc_addr=acc_addr, rows=rows, row_bytes=row_bytes,
                   dram_addr=dram_addr, dram_stride=dram_stride)
        self.bytes_written += rows * row_bytes
        self.acc_rows_used = max(self.acc_rows_used, acc_addr + rows)

    def end(self):
        self._emit(Opcode.END)


def compile_gemm(config, m, k, n, *, a_addr, b_addr, c_addr, schedule="auto", a_stride=None,
                 b_stride=None):
    """Compile ``C = A @ B`` into a program for ``config``.

    Parameters
    ----------
    config : hw.config.NPUConfig
    m, k, n : int
        Positive GEMM dimensions.
    a_addr, b_addr, c_addr : int
        DRAM byte addresses of A (INT8, ``m x k``), B (INT8, ``k x n``) and C
        (INT32, ``m x n``), each stored row-major.
    schedule : str
        One of :data:`SCHEDULES`; see :func:`plan_gemm`.
    a_stride, b_stride : int, optional
        Bytes from one row of A (of B) to the next in DRAM: ``k`` (``n``) by default, more
        for padded rows. Rows that start on a bus beat move in fewer beats (the driver pads
        them to :data:`sw.driver.ROW_PITCH`).

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
    a_stride = k if a_stride is None else _as_int("a_stride", a_stride)
    b_stride = n if b_stride is None else _as_int("b_stride", b_stride)
    if a_stride < k or b_stride < n:
        raise PlanError(f"a_stride must be at least k ({k}) and b_stride at least n ({n}), "
                        f"not {a_stride} and {b_stride}")
    a_addr = _check_region("a_addr", a_addr, (m - 1) * a_stride + k)
    b_addr = _check_region("b_addr", b_addr, (k - 1) * b_stride + n)
    c_addr = _check_region("c_addr", c_addr, 4 * m * n)

    rows, cols = config.rows, config.cols
    activation_base = _WEIGHT_BASE + rows
    resident = plan.schedule == "resident"
    c_stride = 4 * n
    emit = _Emitter(config)
    if plan.schedule == "overlap":
        _overlap_emit(emit, config, m, k, n, a_addr, b_addr, c_addr, a_stride, b_stride,
                      plan.block_rows, plan.group_tiles)
        counted = replace(plan, instructions=len(emit.words))
        if counted != plan:
            raise RuntimeError(f"compiler bug: the emitted program does not match its plan:\n"
                               f"planned {plan}\nemitted {counted}")
        return Program(words=emit.words, plan=plan, a_addr=a_addr, b_addr=b_addr,
                       c_addr=c_addr)
    for m_start in range(0, m, plan.block_rows):
        block_rows = min(plan.block_rows, m - m_start)
        a_block_addr = a_addr + m_start * a_stride
        if resident:
            # Slice k_tile of the block lives at activation_base + k_tile * plan.block_rows.
            for k_tile, k_start in enumerate(range(0, k, rows)):
                emit.load_spad(local_addr=activation_base + k_tile * plan.block_rows,
                               rows=block_rows, row_bytes=min(rows, k - k_start),
                               dram_addr=a_block_addr + k_start, dram_stride=a_stride)
        for n_start in range(0, n, cols):
            n_width = min(cols, n - n_start)
            for k_tile, k_start in enumerate(range(0, k, rows)):
                k_height = min(rows, k - k_start)
                emit.load_spad(local_addr=_WEIGHT_BASE, rows=k_height, row_bytes=n_width,
                               dram_addr=b_addr + k_start * b_stride + n_start,
                               dram_stride=b_stride)
                emit.preload(spad_addr=_WEIGHT_BASE)
                if resident:
                    activation_addr = activation_base + k_tile * plan.block_rows
                else:
                    activation_addr = activation_base
                    emit.load_spad(local_addr=activation_addr, rows=block_rows,
                                   row_bytes=k_height, dram_addr=a_block_addr + k_start,
                                   dram_stride=a_stride)
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


# Quantized layers -----------------------------------------------------------------------------

@dataclass(frozen=True)
class QuantPlan:
    """How a quantized layer (INT8 in, INT8 out) is placed on the array, and what it costs.

    Attributes
    ----------
    config : str
        Name of the configuration (``RxC``).
    rows, cols : int
        R and C of the array.
    m : int
        Output rows: rows of A for a GEMM, output pixels for a convolution.
    k : int
        Reduction length of one output: ``taps * k_tap``.
    n : int
        Output columns (channels).
    taps : int
        Kernel taps (1 for a GEMM, ``KH * KW`` for a convolution), each a ``k_tap x n``
        weight matrix.
    k_tap : int
        Reduction length of one tap (the input channels of a convolution).
    schedule : str
        ``"resident"`` or ``"streaming"``.
    k_tiles, n_tiles : int
        ``ceil(k_tap / rows)`` and ``ceil(n / cols)``.
    weight_tiles : int
        ``taps * k_tiles * n_tiles``.
    m_blocks, block_rows : int
        Blocks of output rows, and the rows of a block (the last may have fewer).
    weight_loads : int
        ``PRELOAD`` instructions.
    spad_rows_used, acc_rows_used : int
        Highest scratchpad / accumulator row used, plus one.
    dram_bytes_read, dram_bytes_written : int
        Bytes the DMA instructions move (instruction fetch excluded).
    instructions : int
        Program length, ``END`` included.
    """
    config: str
    rows: int
    cols: int
    m: int
    k: int
    n: int
    taps: int
    k_tap: int
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
        """Useful MACs over the MAC slots that the ``MATMUL`` instructions occupy."""
        return self.macs / (self.m * self.weight_tiles * self.rows * self.cols)

    def summary(self):
        """A few readable lines about the plan."""
        return (f"{self.weight_tiles} weight tiles ({self.taps} tap(s) x {self.k_tiles} "
                f"k-tiles x {self.n_tiles} n-tiles of {self.rows}x{self.cols}), tile fill "
                f"{self.tile_fill:.1%}\n"
                f"{self.m_blocks} m-block(s) of up to {self.block_rows} rows, {self.schedule} "
                f"schedule, {self.weight_loads} weight loads\n"
                f"scratchpad rows {self.spad_rows_used}, accumulator rows "
                f"{self.acc_rows_used}, {self.instructions} instructions\n"
                f"DRAM bytes: {self.dram_bytes_read} read, {self.dram_bytes_written} written, "
                f"{self.program_bytes} of program")


@dataclass(frozen=True)
class QuantProgram:
    """A compiled quantized layer.

    Attributes
    ----------
    words : list of int
        The 128-bit instruction words, ``END`` last.
    plan : QuantPlan
        The plan, with its counts taken from ``words``.
    addresses : dict
        The DRAM addresses the program was compiled for, by argument name:
        ``a_addr, b_addr, bias_addr, quant_addr, y_addr`` (``x_addr`` and ``w_addr`` in
        place of the first two for a convolution).
    """
    words: list
    plan: QuantPlan
    addresses: dict

    @property
    def bytes(self):
        """The program as it is laid out in DRAM: 16 bytes per instruction, little-endian."""
        return codec.pack_words(self.words)

    @property
    def body(self):
        """The words without the final ``END``: layers chain by concatenating bodies (each
        layer loads its own bias and quantization parameters), then one ``END``."""
        return self.words[:-1]

    def __len__(self):
        return len(self.words)


def merge_runs(runs):
    """Join consecutive strided runs that continue one another into one run.

    Parameters
    ----------
    runs : iterable of (offset, rows, addr, stride)
        Runs of rows in order: run ``i`` covers rows ``offset .. offset+rows-1`` of a block,
        row ``r`` of it at ``addr + r * stride``.

    Returns
    -------
    list of (offset, rows, addr, stride)
        The same rows, in as few runs as joining neighbours allows. A one-row run has stride
        0 unless it was joined.
    """
    merged = []
    for offset, rows, addr, stride in runs:
        if rows == 1:
            stride = 0
        if merged:
            last_offset, last_rows, last_addr, last_stride = merged[-1]
            if last_offset + last_rows == offset:
                if last_rows == 1:
                    step = addr - last_addr
                    if step > 0 and (rows == 1 or stride == step):
                        merged[-1] = (last_offset, last_rows + rows, last_addr, step)
                        continue
                elif addr == last_addr + last_rows * last_stride and (rows == 1
                                                                      or stride == last_stride):
                    merged[-1] = (last_offset, last_rows + rows, last_addr, last_stride)
                    continue
        merged.append((offset, rows, addr, stride))
    return merged


class RowGather:
    """Where the rows of a quantized layer live in DRAM (the base class of the lowerings).

    A quantized layer computes ``m`` output rows of ``n`` INT8 values. Output row ``p`` is
    the sum over ``taps`` kernel taps of an activation row (``k_tap`` INT8 values) times the
    tap's ``k_tap x n`` weight matrix, plus the bias, requantized. Weight matrix ``t`` is
    stored row-major at ``w_addr + t * k_tap * n`` (so a GEMM's B, or HWIO convolution
    weights, as they are).

    Subclasses set the attributes and implement :meth:`activation_runs` and
    :meth:`output_runs`; addresses are relative to the region's base.

    Attributes
    ----------
    m, n, taps, k_tap : int
    row_group : int
        Output rows that share one strided run (an image row of a convolution). Blocks are
        made a multiple of it where they can be, which saves instructions.
    activation_bytes, output_bytes : int
        Extent of the activation and output regions in DRAM.
    """
    m = n = taps = k_tap = 1
    row_group = 1
    activation_bytes = output_bytes = 0
    #: The weights (``taps x k_tap x n``) when known: then a weight tile that is all zero is
    #: skipped (no load, no PRELOAD, no MATMUL: it would add nothing). See :meth:`know_weights`.
    weights = None

    def know_weights(self, weights):
        """Let the compiler skip the all-zero weight tiles of ``weights`` (int8, any shape
        holding ``taps * k_tap * n`` values in the DRAM order); a depthwise convolution's
        block-diagonal weights are mostly such tiles. Returns ``self``."""
        weights = np.asarray(weights)
        if weights.size != self.taps * self.k_tap * self.n:
            raise NPUValueError(f"the weights hold {weights.size} values, not taps x k_tap x "
                                f"n = {self.taps * self.k_tap * self.n}")
        self.weights = weights.reshape(self.taps, self.k_tap, self.n)
        return self

    def tile_is_zero(self, tap, k_start, k_stop, n_start, n_stop):
        """True when the weight tile is known to be all zero."""
        return self.weights is not None and not np.any(
            self.weights[tap, k_start:k_stop, n_start:n_stop])

    def activation_runs(self, tap, start, stop):
        """The activation rows of output rows ``start .. stop-1`` for ``tap``, as runs
        ``(offset, rows, addr, stride)`` (see :func:`merge_runs`), channel 0."""
        raise NotImplementedError

    def output_runs(self, start, stop):
        """Where output rows ``start .. stop-1`` go, as runs, channel 0."""
        raise NotImplementedError

    @property
    def weight_bytes(self):
        return self.taps * self.k_tap * self.n


class GemmGather(RowGather):
    """``Y = A @ B``: row ``p`` of A at ``p * a_stride``, row ``p`` of Y at ``p * y_stride``.

    Parameters
    ----------
    m, k, n : int
        The GEMM shape.
    a_stride, y_stride : int, optional
        Row strides in bytes; ``k`` and ``n`` (row-major, unpadded) by default.
    """

    def __init__(self, m, k, n, *, a_stride=None, y_stride=None):
        self.m, self.k_tap, self.n = (_check_positive(name, value)
                                      for name, value in (("m", m), ("k", k), ("n", n)))
        self.taps = 1
        self.a_stride = self.k_tap if a_stride is None else _as_int("a_stride", a_stride)
        self.y_stride = self.n if y_stride is None else _as_int("y_stride", y_stride)
        if self.a_stride < self.k_tap:
            raise NPUValueError(f"a_stride must be at least k = {self.k_tap}, "
                                f"not {self.a_stride}")
        if self.y_stride < self.n:
            raise NPUValueError(f"y_stride must be at least n = {self.n}, not {self.y_stride}")
        self.activation_bytes = (self.m - 1) * self.a_stride + self.k_tap
        self.output_bytes = (self.m - 1) * self.y_stride + self.n

    def activation_runs(self, tap, start, stop):
        return merge_runs([(0, stop - start, start * self.a_stride, self.a_stride)])

    def output_runs(self, start, stop):
        return merge_runs([(0, stop - start, start * self.y_stride, self.y_stride)])


def _check_quant_operands(zero_point, act_min, act_max):
    zero_point, act_min, act_max = (_as_int(name, value) for name, value in (
        ("out_zero_point", zero_point), ("act_min", act_min), ("act_max", act_max)))
    for name, value in (("out_zero_point", zero_point), ("act_min", act_min),
                        ("act_max", act_max)):
        if not -128 <= value <= 127:
            raise NPUValueError(f"{name} must be within -128 .. 127, not {value}")
    if act_min > act_max:
        raise NPUValueError(f"act_min must not exceed act_max, but act_min = {act_min} and "
                            f"act_max = {act_max}")
    return zero_point, act_min, act_max


def _check_quant_mode(quant_mode):
    try:
        return QuantMode(quant_mode)
    except ValueError:
        raise NPUValueError(f"quant_mode must be one of {[mode.name for mode in QuantMode]}, "
                            f"not {quant_mode!r}") from None


def _emit_quantized(emit, config, gather, schedule, block_rows, addresses, zero_point,
                    act_min, act_max, quant_mode=QuantMode.FIXED):
    """Emit the program of a quantized layer (see the module documentation)."""
    rows, cols = config.rows, config.cols
    m, n, k_tap = gather.m, gather.n, gather.k_tap
    a_addr, b_addr, bias_addr, quant_addr, y_addr = addresses
    slices = [(tap, k_start) for tap in range(gather.taps) for k_start in range(0, k_tap, rows)]
    n_starts = range(0, n, cols)
    activation_base = _WEIGHT_BASE + rows
    resident = schedule == "resident"

    def load_quant(n_start):
        emit.load_quant(dram_addr=quant_addr + 4 * n_start, dram_stride=4 * n,
                        row_bytes=4 * min(cols, n - n_start), zero_point=zero_point,
                        act_min=act_min, act_max=act_max, mode=quant_mode)

    if len(n_starts) == 1:
        load_quant(0)
    for start in range(0, m, block_rows):
        stop = min(start + block_rows, m)
        runs_of_tap = [gather.activation_runs(tap, start, stop) for tap in range(gather.taps)]

        def load_activations(tap, k_start, spad_addr):
            for offset, count, addr, stride in runs_of_tap[tap]:
                emit.load_spad(local_addr=spad_addr + offset, rows=count,
                               row_bytes=min(rows, k_tap - k_start),
                               dram_addr=a_addr + addr + k_start, dram_stride=stride)

        if resident:
            # Slice (tap, k-tile) number `slot` lives at activation_base + slot * block_rows.
            for slot, (tap, k_start) in enumerate(slices):
                load_activations(tap, k_start, activation_base + slot * block_rows)
        for n_start in n_starts:
            n_width = min(cols, n - n_start)
            # The bias row, replicated by a zero stride, starts every accumulator row.
            emit.load_acc(local_addr=0, rows=stop - start, row_bytes=4 * n_width,
                          dram_addr=bias_addr + 4 * n_start, dram_stride=0)
            for slot, (tap, k_start) in enumerate(slices):
                if gather.tile_is_zero(tap, k_start, k_start + rows, n_start,
                                       n_start + n_width):
                    continue
                emit.load_spad(local_addr=_WEIGHT_BASE, rows=min(rows, k_tap - k_start),
                               row_bytes=n_width,
                               dram_addr=b_addr + (tap * k_tap + k_start) * n + n_start,
                               dram_stride=n)
                emit.preload(spad_addr=_WEIGHT_BASE)
                if resident:
                    activation_addr = activation_base + slot * block_rows
                else:
                    activation_addr = activation_base
                    load_activations(tap, k_start, activation_addr)
                emit.matmul(spad_addr=activation_addr, acc_addr=0, rows=stop - start,
                            accumulate=1)
            if len(n_starts) > 1:
                load_quant(n_start)
            for offset, count, addr, stride in gather.output_runs(start, stop):
                emit.store_q(acc_addr=offset, rows=count, row_bytes=n_width,
                             dram_addr=y_addr + addr + n_start, dram_stride=stride)
    emit.end()


def _counted_plan(config, gather, schedule, block_rows, emit):
    k_tiles = _ceil_div(gather.k_tap, config.rows)
    n_tiles = _ceil_div(gather.n, config.cols)
    return QuantPlan(
        config=config.name, rows=config.rows, cols=config.cols, m=gather.m,
        k=gather.taps * gather.k_tap, n=gather.n, taps=gather.taps, k_tap=gather.k_tap,
        schedule=schedule, k_tiles=k_tiles, n_tiles=n_tiles,
        weight_tiles=gather.taps * k_tiles * n_tiles, m_blocks=_ceil_div(gather.m, block_rows),
        block_rows=block_rows, weight_loads=emit.weight_loads,
        spad_rows_used=emit.spad_rows_used, acc_rows_used=emit.acc_rows_used,
        dram_bytes_read=emit.bytes_read, dram_bytes_written=emit.bytes_written,
        instructions=emit.instructions)


def plan_quantized(config, gather, *, schedule="auto"):
    """Choose how to place the quantized layer described by ``gather`` on ``config``.

    Each candidate schedule is emitted once without encoding, so the counts in the plan are
    those of the program :func:`compile_quantized` emits (they do not depend on addresses).

    Parameters
    ----------
    config : hw.config.NPUConfig
    gather : RowGather
    schedule : str
        One of :data:`SCHEDULES`; ``"auto"`` picks the one with the least DRAM traffic
        (data plus program), the resident one on a tie.

    Returns
    -------
    QuantPlan

    Raises
    ------
    PlanError
        If the scratchpad cannot hold a weight tile plus one activation row, or the requested
        schedule does not fit.
    """
    if not isinstance(config, NPUConfig):
        raise NPUTypeError(f"config must be an NPUConfig, not {config!r}")
    if not isinstance(gather, RowGather):
        raise NPUTypeError(f"gather must be a RowGather, not {gather!r}")
    if schedule not in SCHEDULES:
        raise NPUValueError(f"schedule must be one of {', '.join(SCHEDULES)}, "
                            f"not {schedule!r}")
    if schedule == "overlap":
        raise PlanError("the overlap schedule is for plain GEMMs; quantized layers and "
                        "convolutions use the resident or streaming schedule")
    activation_capacity = config.spad_depth - config.rows
    if activation_capacity < 1:
        raise PlanError(f"config {config.name}: a scratchpad of {config.spad_depth} rows "
                        f"cannot hold a weight tile of {config.rows} rows plus one "
                        f"activation row")
    slices = gather.taps * _ceil_div(gather.k_tap, config.rows)

    def block_rows_for(capacity):
        rows = min(capacity, config.acc_depth, _MAX_INSTRUCTION_ROWS, gather.m)
        if gather.row_group <= rows < gather.m:
            rows -= rows % gather.row_group       # whole image rows: fewer DMA instructions
        return rows

    def counted(schedule, block_rows):
        emit = _Emitter(config, dry=True)
        _emit_quantized(emit, config, gather, schedule, block_rows, (0, 0, 0, 0, 0), 0,
                        -128, 127)
        return _counted_plan(config, gather, schedule, block_rows, emit)

    candidates = []
    if schedule in ("auto", "resident"):
        if activation_capacity // slices >= 1:
            candidates.append(counted("resident", block_rows_for(activation_capacity // slices)))
        elif schedule == "resident":
            raise PlanError(f"config {config.name}: the resident schedule needs {slices} "
                            f"scratchpad rows per output row ({gather.taps} tap(s) x "
                            f"{slices // gather.taps} k-tiles), but only "
                            f"{activation_capacity} rows are free next to the weight tile")
    if schedule in ("auto", "streaming"):
        candidates.append(counted("streaming", block_rows_for(activation_capacity)))

    def traffic(plan):
        return plan.dram_bytes_read + plan.dram_bytes_written + plan.program_bytes
    return min(candidates, key=traffic)


def compile_quantized(config, gather, *, a_addr, b_addr, bias_addr, quant_addr, y_addr,
                      out_zero_point, act_min, act_max, schedule="auto",
                      quant_mode=QuantMode.FIXED):
    """Compile the quantized layer described by ``gather`` into a program.

    Parameters
    ----------
    config : hw.config.NPUConfig
    gather : RowGather
    a_addr : int
        Base of the activation region (``gather.activation_bytes`` bytes).
    b_addr : int
        Weights: ``gather.taps`` matrices of ``k_tap x n`` INT8, row-major, back to back.
    bias_addr : int
        ``n`` INT32 (little-endian): the bias, with any input zero point folded in.
    quant_addr : int
        ``n`` INT32 multipliers, then ``n`` INT32 shifts; in float mode ``n`` float32
        scales, then ``n`` zero words.
    y_addr : int
        Base of the output region (``gather.output_bytes`` bytes).
    out_zero_point, act_min, act_max : int
        Output zero point and clamp, within -128 .. 127, ``act_min <= act_max``.
    schedule : str
        One of :data:`SCHEDULES`; see :func:`plan_quantized`.
    quant_mode : hw.isa.QuantMode
        The requantization of the ``LOAD_QUANT``s: ``FIXED`` (default) or ``FLOAT``. The
        plan does not depend on it.

    Returns
    -------
    QuantProgram
        ``addresses`` has the keys ``a_addr, b_addr, bias_addr, quant_addr, y_addr``.
    """
    return _compile_quantized(
        config, gather, dict(a_addr=a_addr, b_addr=b_addr, bias_addr=bias_addr,
                             quant_addr=quant_addr, y_addr=y_addr),
        out_zero_point, act_min, act_max, schedule, quant_mode)


def _compile_quantized(config, gather, addresses, out_zero_point, act_min, act_max, schedule,
                       quant_mode=QuantMode.FIXED):
    """:func:`compile_quantized` with the addresses in a dict (activations, weights, bias,
    quantization, output, in that order) whose names the errors and the program use."""
    plan = plan_quantized(config, gather, schedule=schedule)
    zero_point, act_min, act_max = _check_quant_operands(out_zero_point, act_min, act_max)
    quant_mode = _check_quant_mode(quant_mode)
    n = gather.n
    sizes = (gather.activation_bytes, gather.weight_bytes, 4 * n, 8 * n, gather.output_bytes)
    addresses = {name: _check_region(name, addr, size)
                 for (name, addr), size in zip(addresses.items(), sizes)}
    emit = _Emitter(config)
    _emit_quantized(emit, config, gather, plan.schedule, plan.block_rows,
                    tuple(addresses.values()), zero_point, act_min, act_max, quant_mode)
    counted = _counted_plan(config, gather, plan.schedule, plan.block_rows, emit)
    if counted != plan or len(emit.words) != plan.instructions:
        raise RuntimeError(f"compiler bug: the emitted program does not match its plan:\n"
                           f"planned {plan}\nemitted {counted}")
    return QuantProgram(words=emit.words, plan=plan, addresses=addresses)


def plan_qgemm(config, m, k, n, *, schedule="auto"):
    """The :class:`QuantPlan` of a quantized ``(m x k) @ (k x n)`` GEMM (see
    :func:`compile_qgemm`), the same in both requantization modes."""
    return plan_quantized(config, GemmGather(m, k, n), schedule=schedule)


def compile_qgemm(config, m, k, n, *, a_addr, b_addr, bias_addr, quant_addr, y_addr,
                  out_zero_point, act_min, act_max, y_stride=None, schedule="auto",
                  quant_mode=QuantMode.FIXED):
    """Compile ``Y = requantize(A @ B + bias)`` into a program for ``config``.

    Parameters
    ----------
    config : hw.config.NPUConfig
    m, k, n : int
        Positive GEMM dimensions.
    a_addr, b_addr : int
        A (INT8, ``m x k``) and B (INT8, ``k x n``), row-major without padding.
    bias_addr : int
        ``n`` INT32: the bias, with the input zero point already folded in
        (``bias - a_zero_point * B.sum(axis=0)``).
    quant_addr : int
        ``n`` INT32 multipliers, then ``n`` INT32 shifts; with ``quant_mode=FLOAT``, ``n``
        float32 scales, then ``n`` zero words.
    y_addr : int
        Y, INT8, ``m`` rows of ``n`` bytes, ``y_stride`` (default ``n``) bytes apart.
    out_zero_point, act_min, act_max : int
        Output zero point and clamp.
    schedule : str
        One of :data:`SCHEDULES`.
    quant_mode : hw.isa.QuantMode
        ``FIXED`` (default): TFLite's multipliers and shifts; ``FLOAT``: onnxruntime's
        float32 scales (``docs/quantization.md``).

    Returns
    -------
    QuantProgram
        ``addresses`` has the keys ``a_addr, b_addr, bias_addr, quant_addr, y_addr``.
    """
    return compile_quantized(config, GemmGather(m, k, n, y_stride=y_stride), a_addr=a_addr,
                             b_addr=b_addr, bias_addr=bias_addr, quant_addr=quant_addr,
                             y_addr=y_addr, out_zero_point=out_zero_point, act_min=act_min,
                             act_max=act_max, schedule=schedule, quant_mode=quant_mode)
