"""The quantized core of the compiler: INT8 in, INT8 out, the bias and the requantization on
chip.

Quantized layers (:func:`compile_qgemm`, and :mod:`sw.compiler.conv` for convolutions) go
through one general core: the output rows of the layer ("pixels") are gathered from DRAM by a
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

import numpy as np

from hw.isa import QuantMode
from .checks import (as_int, check_config, check_positive, check_quant_mode,
                     check_quant_operands, check_region)
from .emitter import Emitter
from .plan import (MAX_INSTRUCTION_ROWS, WEIGHT_BASE, Program, activation_capacity,
                   ceil_div, check_plan, check_schedule, counted_plan, least_traffic)
from ..errors import NPUTypeError, NPUValueError, PlanError


__all__ = ["merge_runs", "RowGather", "GemmGather", "plan_quantized", "compile_quantized",
           "compile_gathered", "plan_qgemm", "compile_qgemm"]


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
        self.__dict__.pop("_nonzero_tiles", None)
        return self

    def tile_is_zero(self, tap, k_start, k_stop, n_start, n_stop):
        """True when the weight tile is known to be all zero."""
        return self.weights is not None and not np.any(
            self.weights[tap, k_start:k_stop, n_start:n_stop])

    def nonzero_tiles(self, rows, cols):
        """``taps x k_tiles x n_tiles`` booleans: whether the weight tile of ``rows x cols``
        (``k_tiles = ceil(k_tap / rows)``, ``n_tiles = ceil(n / cols)``) may hold a nonzero
        weight; all true when the weights are not known. The same answer as
        :meth:`tile_is_zero` for every tile, computed once for all of them (the compiler asks
        for every tile of every m-block)."""
        k_tiles, n_tiles = -(-self.k_tap // rows), -(-self.n // cols)
        if self.weights is None:
            return np.ones((self.taps, k_tiles, n_tiles), dtype=bool)
        cache = self.__dict__.setdefault("_nonzero_tiles", {})
        if (rows, cols) not in cache:
            padded = np.zeros((self.taps, k_tiles * rows, n_tiles * cols), dtype=bool)
            padded[:, :self.k_tap, :self.n] = self.weights != 0
            cache[rows, cols] = padded.reshape(self.taps, k_tiles, rows, n_tiles,
                                               cols).any(axis=(2, 4))
        return cache[rows, cols]

    def activation_runs(self, tap, start, stop):
        """The activation rows of output rows ``start .. stop-1`` for ``tap``, as runs
        ``(offset, rows, addr, stride)`` (see :func:`merge_runs`), channel 0."""
        raise NotImplementedError

    def block_key(self, start, stop):
        """A key equal for two blocks of output rows whose runs (:meth:`activation_runs`
        of every tap, :meth:`output_runs`) have the same offsets and row counts, only their
        addresses differing; ``None`` (the default) when unknown. Planning counts each such
        block once (:func:`_count_quantized`)."""
        return None

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
        self.m, self.k_tap, self.n = (check_positive(name, value)
                                      for name, value in (("m", m), ("k", k), ("n", n)))
        self.taps = 1
        self.a_stride = self.k_tap if a_stride is None else as_int("a_stride", a_stride)
        self.y_stride = self.n if y_stride is None else as_int("y_stride", y_stride)
        if self.a_stride < self.k_tap:
            raise NPUValueError(f"a_stride must be at least k = {self.k_tap}, "
                                f"not {self.a_stride}")
        if self.y_stride < self.n:
            raise NPUValueError(f"y_stride must be at least n = {self.n}, not {self.y_stride}")
        self.activation_bytes = (self.m - 1) * self.a_stride + self.k_tap
        self.output_bytes = (self.m - 1) * self.y_stride + self.n

    def activation_runs(self, tap, start, stop):
        return merge_runs([(0, stop - start, start * self.a_stride, self.a_stride)])

    def block_key(self, start, stop):
        return stop - start                  # one run of each, whatever the block

    def output_runs(self, start, stop):
        return merge_runs([(0, stop - start, start * self.y_stride, self.y_stride)])


def _emit_quantized(emit, config, gather, schedule, block_rows, addresses, zero_point,
                    act_min, act_max, quant_mode=QuantMode.FIXED):
    """Emit the program of a quantized layer (see the module documentation)."""
    rows, cols = config.rows, config.cols
    m, n, k_tap = gather.m, gather.n, gather.k_tap
    a_addr, b_addr, bias_addr, quant_addr, y_addr = addresses
    slices = [(tap, k_start) for tap in range(gather.taps) for k_start in range(0, k_tap, rows)]
    n_starts = range(0, n, cols)
    activation_base = WEIGHT_BASE + rows
    resident = schedule == "resident"

    def load_quant(n_start):
        emit.load_quant(dram_addr=quant_addr + 4 * n_start, dram_stride=4 * n,
                        row_bytes=4 * min(cols, n - n_start), zero_point=zero_point,
                        act_min=act_min, act_max=act_max, mode=quant_mode)

    nonzero = gather.nonzero_tiles(rows, cols)
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
        for n_tile, n_start in enumerate(n_starts):
            n_width = min(cols, n - n_start)
            # The bias row, replicated by a zero stride, starts every accumulator row.
            emit.load_acc(local_addr=0, rows=stop - start, row_bytes=4 * n_width,
                          dram_addr=bias_addr + 4 * n_start, dram_stride=0)
            for slot, (tap, k_start) in enumerate(slices):
                if not nonzero[tap, k_start // rows, n_tile]:
                    continue
                emit.load_spad(local_addr=WEIGHT_BASE, rows=min(rows, k_tap - k_start),
                               row_bytes=n_width,
                               dram_addr=b_addr + (tap * k_tap + k_start) * n + n_start,
                               dram_stride=n)
                emit.preload(spad_addr=WEIGHT_BASE)
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


def _count_quantized(config, gather, schedule, block_rows):
    """What :func:`_emit_quantized` would emit, counted without emitting it: an
    :class:`Emitter` whose counts (instructions, bytes, rows used, weight loads) are those of
    the program. Planning weighs every candidate schedule, and the programs of a large layer
    run to millions of instructions (a resident schedule with blocks of a few rows, the
    candidate that loses, most of all); this walks the m-blocks only and sums the n-tiles and
    weight tiles of each with arithmetic. :func:`compile_gathered` checks these counts
    against the program it emits, and ``tb/test_compiler.py`` against a dry emission."""
    rows, cols = config.rows, config.cols
    m, n, k_tap, taps = gather.m, gather.n, gather.k_tap, gather.taps
    resident = schedule == "resident"
    activation_base = WEIGHT_BASE + rows
    n_widths = np.minimum(cols, n - np.arange(0, n, cols))
    n_tiles = len(n_widths)
    k_starts = np.arange(0, k_tap, rows)
    k_rows = np.minimum(rows, k_tap - k_starts)                    # per k-tile
    slot_tap = np.repeat(np.arange(taps), len(k_starts))           # per slot (tap, k-tile)
    slot_rows = np.tile(k_rows, taps)
    nonzero = gather.nonzero_tiles(rows, cols).reshape(len(slot_tap), n_tiles)
    loads_of_slot = nonzero.sum(axis=1)                            # weight tiles per slot
    weight_loads = int(loads_of_slot.sum())
    weight_bytes = int((nonzero * slot_rows[:, None] * n_widths[None, :]).sum())
    # Per tap: streamed activation loads (one per weight tile) and their row bytes.
    streamed_loads = np.zeros(taps, dtype=np.int64)
    np.add.at(streamed_loads, slot_tap, loads_of_slot)
    streamed_row_bytes = np.zeros(taps, dtype=np.int64)
    np.add.at(streamed_row_bytes, slot_tap, loads_of_slot * slot_rows)
    slots_of_tap = np.full(taps, len(k_starts))
    slot_offsets = activation_base + np.arange(len(slot_tap)) * block_rows
    last_nonzero_slot = int(np.flatnonzero(loads_of_slot)[-1]) if weight_loads else -1

    def count(start, stop):
        """``(instructions, read, written, spad rows, acc rows)`` of the block."""
        block = stop - start
        runs = [gather.activation_runs(tap, start, stop) for tap in range(taps)]
        run_counts = np.array([len(tap_runs) for tap_runs in runs], dtype=np.int64)
        run_rows = np.array([sum(run[1] for run in tap_runs) for tap_runs in runs],
                            dtype=np.int64)
        run_ends = np.array([max((run[0] + run[1] for run in tap_runs), default=0)
                             for tap_runs in runs], dtype=np.int64)
        outputs = gather.output_runs(start, stop)
        instructions = n_tiles * (1 + len(outputs)) + 3 * weight_loads
        read = 4 * n * block + weight_bytes
        spad = acc = 0
        if resident:
            instructions += int((slots_of_tap * run_counts).sum())
            read += int((run_rows * k_tap).sum())
            loaded = run_counts[slot_tap] > 0
            if loaded.any():
                spad = int((slot_offsets + run_ends[slot_tap])[loaded].max())
        else:
            instructions += int((streamed_loads * run_counts).sum())
            read += int((streamed_row_bytes * run_rows).sum())
            streamed = (streamed_loads > 0) & (run_counts > 0)
            if streamed.any():
                spad = activation_base + int(run_ends[streamed].max())
        if n_tiles > 1:
            instructions += n_tiles
            read += 2 * 4 * n
        acc = block
        if weight_loads:
            last_slot = last_nonzero_slot if resident else 0
            spad = max(spad, WEIGHT_BASE + rows, activation_base + last_slot * block_rows + block)
        if outputs:
            acc = max(acc, max(offset + count for offset, count, _, _ in outputs))
        written = n * sum(count for _, count, _, _ in outputs)
        return instructions, read, written, spad, acc

    emit = Emitter(config, dry=True)
    if n_tiles == 1:
        emit.instructions += 1
        emit.bytes_read += 2 * 4 * int(n_widths[0])
    counted = {}                             # block key -> its counts
    for start in range(0, m, block_rows):
        stop = min(start + block_rows, m)
        key = gather.block_key(start, stop)
        counts = counted.get(key) if key is not None else None
        if counts is None:
            counts = count(start, stop)
            if key is not None:
                counted[key] = counts
        instructions, read, written, spad, acc = counts
        emit.instructions += instructions
        emit.bytes_read += read
        emit.bytes_written += written
        emit.weight_loads += weight_loads
        emit.spad_rows_used = max(emit.spad_rows_used, spad)
        emit.acc_rows_used = max(emit.acc_rows_used, acc)
    emit.instructions += 1                                         # END
    return emit


def plan_quantized(config, gather, *, schedule="auto"):
    """Choose how to place the quantized layer described by ``gather`` on ``config``.

    Each candidate schedule is counted (:func:`_count_quantized`: what its program would
    hold, block by block, without emitting it), so the counts in the plan are those of the
    program :func:`compile_quantized` emits, which checks them (they do not depend on
    addresses).

    Parameters
    ----------
    config : hw.config.NPUConfig
    gather : RowGather
    schedule : str
        One of :data:`~sw.compiler.plan.SCHEDULES`; ``"auto"`` picks the one with the least
        DRAM traffic (data plus program), the resident one on a tie.

    Returns a :class:`~sw.compiler.plan.Plan`; raises :class:`~sw.errors.PlanError` as
    :func:`sw.compiler.plan_gemm` does.
    """
    check_config(config)
    if not isinstance(gather, RowGather):
        raise NPUTypeError(f"gather must be a RowGather, not {gather!r}")
    check_schedule(schedule)
    if schedule == "overlap":
        raise PlanError("the overlap schedule is for plain GEMMs; quantized layers and "
                        "convolutions use the resident or streaming schedule")
    capacity = activation_capacity(config)
    slices = gather.taps * ceil_div(gather.k_tap, config.rows)

    def block_rows_for(capacity):
        rows = min(capacity, config.acc_depth, MAX_INSTRUCTION_ROWS, gather.m)
        if gather.row_group <= rows < gather.m:
            rows -= rows % gather.row_group       # whole image rows: fewer DMA instructions
        return rows

    def counted(schedule, block_rows):
        return _counted_plan(config, gather, schedule, block_rows,
                             _count_quantized(config, gather, schedule, block_rows))

    candidates = []
    if schedule in ("auto", "resident"):
        if capacity // slices >= 1:
            candidates.append(counted("resident", block_rows_for(capacity // slices)))
        elif schedule == "resident":
            raise PlanError(f"config {config.name}: the resident schedule needs {slices} "
                            f"scratchpad rows per output row ({gather.taps} tap(s) x "
                            f"{slices // gather.taps} k-tiles), but only "
                            f"{capacity} rows are free next to the weight tile")
    if schedule in ("auto", "streaming"):
        candidates.append(counted("streaming", block_rows_for(capacity)))
    return least_traffic(candidates)


def compile_quantized(config, gather, *, a_addr, b_addr, bias_addr, quant_addr, y_addr,
                      out_zero_point, act_min, act_max, schedule="auto",
                      quant_mode=QuantMode.FIXED, plan=None):
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
        One of :data:`~sw.compiler.plan.SCHEDULES`; see :func:`plan_quantized`.
    quant_mode : hw.isa.QuantMode
        The requantization of the ``LOAD_QUANT``s: ``FIXED`` (default) or ``FLOAT``. The
        plan does not depend on it.
    plan : Plan, optional
        The plan :func:`plan_quantized` made for ``gather`` (it is made here when not given).

    Returns
    -------
    Program
        ``addresses`` has the keys ``a_addr, b_addr, bias_addr, quant_addr, y_addr``.
    """
    return compile_gathered(
        config, gather, dict(a_addr=a_addr, b_addr=b_addr, bias_addr=bias_addr,
                             quant_addr=quant_addr, y_addr=y_addr),
        out_zero_point=out_zero_point, act_min=act_min, act_max=act_max, schedule=schedule,
        quant_mode=quant_mode, plan=plan)


def compile_gathered(config, gather, addresses, *, out_zero_point, act_min, act_max,
                     schedule="auto", quant_mode=QuantMode.FIXED, plan=None):
    """:func:`compile_quantized` with the addresses in a dict: the activations, weights,
    bias, quantization parameters and output, in that order, by the names that the errors
    and the program's ``addresses`` use (``x_addr, w_addr, ...`` for a convolution)."""
    if plan is None:
        plan = plan_quantized(config, gather, schedule=schedule)
    else:
        plan = check_plan(plan, config, schedule, m=gather.m, k=gather.taps * gather.k_tap,
                          n=gather.n, taps=gather.taps)
    zero_point, act_min, act_max = check_quant_operands(out_zero_point, act_min, act_max)
    quant_mode = check_quant_mode(quant_mode)
    n = gather.n
    sizes = (gather.activation_bytes, gather.weight_bytes, 4 * n, 8 * n, gather.output_bytes)
    addresses = {name: check_region(name, addr, size)
                 for (name, addr), size in zip(addresses.items(), sizes)}
    emit = Emitter(config)
    _emit_quantized(emit, config, gather, plan.schedule, plan.block_rows,
                    tuple(addresses.values()), zero_point, act_min, act_max, quant_mode)
    counted = _counted_plan(config, gather, plan.schedule, plan.block_rows, emit)
    if counted != plan or len(emit.words) != plan.instructions:
        raise RuntimeError(f"compiler bug: the emitted program does not match its plan:\n"
                           f"planned {plan}\nemitted {counted}")
    return Program(words=emit.words, plan=plan, addresses=addresses)


def _counted_plan(config, gather, schedule, block_rows, emit):
    return counted_plan(config, emit, m=gather.m, k_tap=gather.k_tap, n=gather.n,
                        taps=gather.taps, schedule=schedule, block_rows=block_rows)


def plan_qgemm(config, m, k, n, *, schedule="auto"):
    """The :class:`~sw.compiler.plan.Plan` of a quantized ``(m x k) @ (k x n)`` GEMM (see
    :func:`compile_qgemm`), the same in both requantization modes."""
    return plan_quantized(config, GemmGather(m, k, n), schedule=schedule)


def compile_qgemm(config, m, k, n, *, a_addr, b_addr, bias_addr, quant_addr, y_addr,
                  out_zero_point, act_min, act_max, y_stride=None, schedule="auto",
                  quant_mode=QuantMode.FIXED, plan=None):
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
        One of :data:`~sw.compiler.plan.SCHEDULES`.
    quant_mode : hw.isa.QuantMode
        ``FIXED`` (default): TFLite's multipliers and shifts; ``FLOAT``: onnxruntime's
        float32 scales (``docs/quantization.md``).
    plan : Plan, optional
        The plan :func:`plan_qgemm` made for this GEMM (it is made here when not given).

    Returns
    -------
    Program
        ``addresses`` has the keys ``a_addr, b_addr, bias_addr, quant_addr, y_addr``.
    """
    return compile_quantized(config, GemmGather(m, k, n, y_stride=y_stride), a_addr=a_addr,
                             b_addr=b_addr, bias_addr=bias_addr, quant_addr=quant_addr,
                             y_addr=y_addr, out_zero_point=out_zero_point, act_min=act_min,
                             act_max=act_max, schedule=schedule, quant_mode=quant_mode,
                             plan=plan)
