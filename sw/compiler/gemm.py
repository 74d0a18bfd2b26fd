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
fewer bytes over the DRAM bus (data plus instruction fetch). The "overlap" schedule
(:func:`_overlap_emit`) is the default whenever it fits.

Quantized layers and convolutions are :mod:`sw.compiler.quantized` and
:mod:`sw.compiler.conv`.
"""

from dataclasses import replace

from hw.isa import INSTR_BYTES
from .checks import as_int, check_config, check_positive, check_region
from .emitter import Emitter
from .plan import (MAX_INSTRUCTION_ROWS, WEIGHT_BASE, Plan, Program, activation_capacity,
                   ceil_div, check_plan, check_schedule, counted_plan, least_traffic)
from ..errors import PlanError


__all__ = ["plan_gemm", "compile_gemm", "scalesim_cycles"]


def _plan_for(config, m, k, n, schedule, block_rows):
    """The plan of one schedule with a given block height, counted by formula."""
    k_tiles = ceil_div(k, config.rows)
    n_tiles = ceil_div(n, config.cols)
    m_blocks = ceil_div(m, block_rows)
    weight_tiles = k_tiles * n_tiles
    if schedule == "resident":
        activation_bytes = m * k                  # each element of A loaded once
        activation_rows = k_tiles * block_rows
        instructions = m_blocks * (k_tiles + n_tiles * (3 * k_tiles + 1)) + 1
    else:
        activation_bytes = n_tiles * m * k        # A reloaded for every n-tile
        activation_rows = block_rows
        instructions = m_blocks * n_tiles * (4 * k_tiles + 1) + 1
    return Plan(
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
    k_tiles = ceil_div(k, rows)
    n_tiles = ceil_div(n, cols)
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
        size = ceil_div(unit_rows, pieces)
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
        beats = ceil_div(fields["row_bytes"], bus_bytes) + (c_stride % bus_bytes != 0)
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
    n_tiles = ceil_div(n, config.cols)
    candidates = []
    for group_tiles in range(1, n_tiles + 1):
        block_rows = min(m, half // group_tiles, free_rows // 2, MAX_INSTRUCTION_ROWS)
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
    k_tiles, n_tiles = ceil_div(k, rows), ceil_div(n, cols)
    m_blocks = ceil_div(m, block_rows)
    groups = ceil_div(n_tiles, group_tiles)
    act_beats = ceil_div(min(rows, k) + bus - 1, bus)
    weight_beats = ceil_div(min(cols, n) + bus - 1, bus)
    steps = m_blocks * groups * k_tiles
    per_matmul_overhead = 2 * rows + cols + 4 * (weight_beats + 1)
    compute = steps * group_tiles * max(block_rows, per_matmul_overhead)
    reader = (m * k_tiles * groups * act_beats
              + m_blocks * k_tiles * n_tiles * rows * weight_beats
              + steps * (3 * group_tiles + 1) * ceil_div(INSTR_BYTES, bus))
    store_row = ceil_div(4 * min(cols, n), bus) + 2
    stores = m * n_tiles * store_row
    tail = block_rows * group_tiles * store_row
    return max(compute, reader, stores) + tail


def scalesim_cycles(config, m, k, n):
    """Cycles of SCALE-Sim's weight-stationary model, which does not overlap weight tiles:
    ``ceil(K/R) * ceil(N/C) * (2R + C + M - 2)``."""
    return (ceil_div(k, config.rows) * ceil_div(n, config.cols)
            * (2 * config.rows + config.cols + m - 2))


def _overlap_plan(config, m, k, n, block_rows, group_tiles):
    emit = Emitter(config, dry=True)
    _overlap_emit(emit, config, m, k, n, 0, 0, 0, k, n, block_rows, group_tiles)
    return counted_plan(config, emit, m=m, k_tap=k, n=n, schedule="overlap",
                        block_rows=block_rows, group_tiles=group_tiles)


def plan_gemm(config, m, k, n, *, schedule="auto"):
    """Choose how to place ``(m x k) @ (k x n)`` on ``config``, without emitting code.

    Parameters
    ----------
    config : hw.config.NPUConfig
    m, k, n : int
        Positive GEMM dimensions.
    schedule : str
        One of :data:`~sw.compiler.plan.SCHEDULES`. ``"auto"`` picks the schedule with the
        least DRAM traffic (the resident one on a tie).

    Returns
    -------
    Plan

    Raises
    ------
    PlanError
        If the scratchpad cannot hold a weight tile plus one activation row, or the requested
        schedule does not fit.
    """
    check_config(config)
    m, k, n = (check_positive(name, value) for name, value in (("m", m), ("k", k), ("n", n)))
    check_schedule(schedule)

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

    capacity = activation_capacity(config)
    k_tiles = ceil_div(k, config.rows)
    candidates = []
    resident_rows = min(m, config.acc_depth, capacity // k_tiles)
    if schedule in ("auto", "resident"):
        if resident_rows >= 1:
            candidates.append(_plan_for(config, m, k, n, "resident", resident_rows))
        elif schedule == "resident":
            raise PlanError(f"config {config.name}: the resident schedule needs {k_tiles} "
                            f"scratchpad rows per row of A (K = {k}), but only "
                            f"{capacity} rows are free next to the weight tile")
    if schedule in ("auto", "streaming"):
        streaming_rows = min(m, config.acc_depth, capacity)
        candidates.append(_plan_for(config, m, k, n, "streaming", streaming_rows))
    return least_traffic(candidates)


def compile_gemm(config, m, k, n, *, a_addr, b_addr, c_addr, schedule="auto", a_stride=None,
                 b_stride=None, plan=None):
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
        One of :data:`~sw.compiler.plan.SCHEDULES`; see :func:`plan_gemm`.
    a_stride, b_stride : int, optional
        Bytes from one row of A (of B) to the next in DRAM: ``k`` (``n``) by default, more
        for padded rows. Rows that start on a bus beat move in fewer beats (the driver pads
        them to :data:`sw.driver.ROW_PITCH`).
    plan : Plan, optional
        The plan :func:`plan_gemm` made for this GEMM (it is made here when not given).

    Returns
    -------
    Program

    Raises
    ------
    PlanError
        As :func:`plan_gemm`, or when a matrix does not fit in the 32-bit address space.
    """
    if plan is None:
        plan = plan_gemm(config, m, k, n, schedule=schedule)
    else:
        plan = check_plan(plan, config, schedule, **{name: check_positive(name, value) for
                                                     name, value in (("m", m), ("k", k),
                                                                     ("n", n))})
    m, k, n = plan.m, plan.k, plan.n
    a_stride = k if a_stride is None else as_int("a_stride", a_stride)
    b_stride = n if b_stride is None else as_int("b_stride", b_stride)
    if a_stride < k or b_stride < n:
        raise PlanError(f"a_stride must be at least k ({k}) and b_stride at least n ({n}), "
                        f"not {a_stride} and {b_stride}")
    a_addr = check_region("a_addr", a_addr, (m - 1) * a_stride + k)
    b_addr = check_region("b_addr", b_addr, (k - 1) * b_stride + n)
    c_addr = check_region("c_addr", c_addr, 4 * m * n)

    rows, cols = config.rows, config.cols
    activation_base = WEIGHT_BASE + rows
    resident = plan.schedule == "resident"
    c_stride = 4 * n
    emit = Emitter(config)
    if plan.schedule == "overlap":
        _overlap_emit(emit, config, m, k, n, a_addr, b_addr, c_addr, a_stride, b_stride,
                      plan.block_rows, plan.group_tiles)
        counted = replace(plan, instructions=len(emit.words))
        if counted != plan:
            raise RuntimeError(f"compiler bug: the emitted program does not match its plan:\n"
                               f"planned {plan}\nemitted {counted}")
        return Program(words=emit.words, plan=plan,
                       addresses=dict(a_addr=a_addr, b_addr=b_addr, c_addr=c_addr))
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
                emit.load_spad(local_addr=WEIGHT_BASE, rows=k_height, row_bytes=n_width,
                               dram_addr=b_addr + k_start * b_stride + n_start,
                               dram_stride=b_stride)
                emit.preload(spad_addr=WEIGHT_BASE)
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
    return Program(words=emit.words, plan=counted,
                   addresses=dict(a_addr=a_addr, b_addr=b_addr, c_addr=c_addr))
