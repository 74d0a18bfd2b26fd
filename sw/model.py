"""An instruction-level model of the NPU: the reference the RTL is compared against.

The program is decoded into numpy columns once, and run a window of up to 65,536 instructions
at a time, each window's scratchpad, weight, accumulator and DRAM effects computed as array
operations (:mod:`sw.model_window`), so a network of millions of instructions runs in seconds
(docs/performance.md). Short runs between hazards, and the instructions around them, go one
instruction at a time through the handlers below, which say what every instruction does;
``ModelNPU(config, batched=False)`` runs the whole program that way, as the model did before
windows: the specification the windows are tested against (``tb/test_model.py``).
The model has no clock; :attr:`RunResult.cycles` is ``None``.

Semantics, in the order the checks are made (the RTL makes the same checks in the same order):

* The program must start 16-byte aligned with ``prog_len > 0`` (else ``PROGRAM`` at pc 0);
  instruction ``pc`` is fetched from ``prog_addr + 16 * pc``. Reaching ``pc == prog_len``
  without ``END`` is ``PROGRAM`` at ``pc``; a fetch outside the DRAM is ``BUS_READ``; an opcode
  outside :class:`hw.isa.Opcode` is ``ILLEGAL_OPCODE``.
* ``LOAD_SPAD`` / ``LOAD_ACC``: ``BAD_LENGTH``, ``SPAD_RANGE`` / ``ACC_RANGE``, ``DRAM_RANGE``,
  ``BUS_READ``. Local row ``local_addr + r`` receives ``row_bytes`` bytes from
  ``dram_addr + r * dram_stride`` in its low bytes and zeros in the rest.
* ``PRELOAD``: ``SPAD_RANGE``. Weight row ``i`` is scratchpad row ``spad_addr + i``, lanes
  ``0 .. C-1``, as INT8.
* ``MATMUL``: ``BAD_LENGTH``, ``SPAD_RANGE``, ``ACC_RANGE``. Accumulator row ``acc_addr + t``
  receives (or adds, wrapping in INT32) activation row ``spad_addr + t`` (lanes ``0 .. R-1``)
  times the weights.
* ``STORE``: ``BAD_LENGTH``, ``ACC_RANGE``, ``DRAM_RANGE``, ``BUS_WRITE``. The first
  ``row_bytes`` bytes of accumulator row ``acc_addr + r`` go to ``dram_addr + r * dram_stride``;
  rows are written in order, so where rows overlap the later one wins.
* ``LOAD_QUANT``: ``BAD_LENGTH`` (``row_bytes`` zero, not a multiple of 4, or above ``4 C``),
  ``DRAM_RANGE`` and ``BUS_READ`` for its two rows (at ``dram_addr`` and
  ``dram_addr + dram_stride``), then ``QUANT`` (a ``zero_point`` outside -128 .. 127,
  ``act_min > act_max``; in fixed-point mode a loaded shift outside -31 .. 31, in float mode
  a NaN or infinite scale or a non-zero lane in row 1). Lane ``j`` is at byte ``4 j``,
  little-endian. In fixed-point mode (``mode`` 0) row 0 holds INT32 multipliers and row 1
  INT32 shifts (positive: right shift); in float mode (``mode`` 1) row 0 holds float32
  scales and row 1 is reserved (zero). Lanes past ``row_bytes / 4`` get 0 in both rows. A
  failing ``LOAD_QUANT`` leaves the requantization state as it was. The reset state is
  fixed-point mode, multipliers 0, shifts 0, zero point 0, clamp -128 .. 127.
* ``STORE_Q``: ``BAD_LENGTH`` (zero rows or bytes, ``row_bytes > C``), ``ACC_RANGE``,
  ``DRAM_RANGE``, ``BUS_WRITE``. Accumulator row ``acc_addr + r`` is requantized with
  :func:`sw.quant.requantize` (or in float mode :func:`sw.quant.requantize_float`) and the
  state of the last ``LOAD_QUANT``; its first ``row_bytes`` INT8 lanes go to
  ``dram_addr + r * dram_stride`` (later rows win on overlap).

The model's DRAM always answers, so it never ends in ``BUS_TIMEOUT`` (the RTL's bus watchdog,
which ends a run whose slave stops answering: docs/architecture.md); nor in ``START_BUSY``,
which only a host's start during a run makes.

A DMA instruction that would touch any byte outside the DRAM fails before it moves anything:
the model leaves the DRAM untouched by a failing ``STORE``. (The RTL may already have written
the rows before the failing one; after an error the DRAM bytes in the failing ``STORE``'s range
are therefore not part of the contract.)
"""

import contextlib

import numpy as np

from hw.isa import ErrorCode, INSTR_BYTES, Opcode, QuantMode
from sim.result import RunResult
from . import codec
from .errors import NPUTypeError, NPUValueError
from .quant import requantize, requantize_float
from .model_window import analyse_window, decode_program, run_window, window_limit


__all__ = ["ModelNPU"]


_ADDRESS_SPACE = 1 << 32


_BLAS = []


def _one_blas_thread():
    """A context in which BLAS runs on one thread: the windows' products are many small
    ones, which a second thread slows down many times over on a busy machine (threadpoolctl
    comes with scikit-learn; without it, BLAS keeps its threads)."""
    if not _BLAS:
        try:
            from threadpoolctl import ThreadpoolController
            _BLAS.append(ThreadpoolController())
        except ImportError:
            _BLAS.append(None)
    if _BLAS[0] is None:
        return contextlib.nullcontext()
    return _BLAS[0].limit(limits=1, user_api="blas")


class _Fault(Exception):
    """Raised by an instruction handler to stop the program with an error code."""

    def __init__(self, error_code):
        self.error_code = error_code


def _check_block(dram_size, dram_addr, rows, row_bytes, dram_stride, bus_error):
    """Check a strided DRAM block; return the end address (one past its highest byte)."""
    # The stride is unsigned, so the last row is always the highest one.
    end = dram_addr + (rows - 1) * dram_stride + row_bytes
    if end > _ADDRESS_SPACE:
        raise _Fault(ErrorCode.DRAM_RANGE)
    if end > dram_size:
        raise _Fault(bus_error)
    return end


def _block_view(dram, dram_addr, rows, row_bytes, dram_stride, writeable):
    """A ``rows x row_bytes`` view of a strided block that is known to lie inside ``dram``."""
    if rows == 1 or dram_stride == row_bytes:
        # The common contiguous case; as_strided costs more than the copy for small blocks.
        return dram[dram_addr:dram_addr + rows * row_bytes].reshape(rows, row_bytes)
    return np.lib.stride_tricks.as_strided(
        dram[dram_addr:], shape=(rows, row_bytes), strides=(dram_stride, 1),
        writeable=writeable)


class ModelNPU:
    """Instruction-level simulator of one NPU instance.

    Parameters
    ----------
    config : hw.config.NPUConfig
        The instance to model.
    batched : bool
        ``True`` (the default) runs windows of instructions as array operations; ``False``
        runs one instruction at a time. Both give the same results, bit for bit.

    Attributes
    ----------
    config : hw.config.NPUConfig
    spad : numpy.ndarray
        Scratchpad, ``uint8`` of shape ``(spad_depth, spad_row_bytes)``.
    acc : numpy.ndarray
        Accumulator, little-endian ``int32`` of shape ``(acc_depth, cols)``.
    weights : numpy.ndarray
        The weights the array holds, ``int8`` of shape ``(rows, cols)``.
    quant_mode : hw.isa.QuantMode
        How ``STORE_Q`` requantizes.
    multipliers, shifts : numpy.ndarray
        The requantization state of ``STORE_Q``: ``int32`` of shape ``(cols,)`` (in float
        mode ``multipliers`` holds the float32 scales' bits, and ``shifts`` zeros).
    zero_point, act_min, act_max : int
        The output zero point and clamp of ``STORE_Q``.
    """

    #: Words decoded at a time, and instructions a window takes at most.
    CHUNK = 1 << 16
    #: Instructions the first window, and a window after one that a hazard cut, may take.
    FIRST_WINDOW = 4096
    #: Elements (row events times bytes or lanes) a window's arrays may hold: about 100 MB.
    WINDOW_ELEMENTS = 1 << 24
    #: Windows shorter than this run one instruction at a time, and so do the next
    #: ``STEP_AFTER_SHORT`` instructions after a window that a hazard cut this short.
    MIN_WINDOW = 16
    STEP_AFTER_SHORT = 64

    def __init__(self, config, *, batched=True):
        from hw.config import NPUConfig
        if not isinstance(config, NPUConfig):
            raise NPUTypeError(f"config must be an NPUConfig, not {config!r}")
        self.config = config
        self.batched = bool(batched)
        self._handlers = {
            Opcode.LOAD_SPAD: self._load_spad,
            Opcode.LOAD_ACC:  self._load_acc,
            Opcode.PRELOAD:   self._preload,
            Opcode.MATMUL:    self._matmul,
            Opcode.STORE:     self._store,
            Opcode.LOAD_QUANT: self._load_quant,
            Opcode.STORE_Q:   self._store_q,
        }
        self.reset()

    def reset(self):
        """Return to the reset state: every memory and the weights zero, the requantization
        state fixed-point mode, multipliers 0, shifts 0, zero point 0 and clamp -128 .. 127."""
        config = self.config
        self.spad = np.zeros((config.spad_depth, config.spad_row_bytes), dtype=np.uint8)
        self.acc = np.zeros((config.acc_depth, config.cols), dtype="<i4")
        self.weights = np.zeros((config.rows, config.cols), dtype=np.int8)
        self.quant_mode = QuantMode.FIXED
        self.multipliers = np.zeros(config.cols, dtype=np.int32)
        self.shifts = np.zeros(config.cols, dtype=np.int32)
        self.zero_point = 0
        self.act_min = -128
        self.act_max = 127

    def run(self, dram, prog_addr, prog_len, *, reset=True):
        """Reset, then run the program at ``prog_addr`` until ``END`` or an error.

        Parameters
        ----------
        dram : numpy.ndarray
            Initial DRAM contents, ``uint8`` in one dimension, at most 4 GiB. Not modified:
            the model works on a copy, returned in :attr:`RunResult.dram`.
        prog_addr : int
            Byte address of instruction 0.
        prog_len : int
            Maximum number of instructions.
        reset : bool
            ``False`` keeps the scratchpad, accumulator, weights and requantization state
            that the previous run left, as the RTL does for programs run one after another
            without a reset in between.

        Returns
        -------
        RunResult
            With ``cycles = None``.
        """
        if not isinstance(dram, np.ndarray) or dram.dtype != np.uint8 or dram.ndim != 1:
            raise NPUTypeError(f"dram must be a one-dimensional numpy array of uint8, not "
                               f"{getattr(dram, 'dtype', type(dram).__name__)} of shape "
                               f"{getattr(dram, 'shape', None)}")
        if dram.size > _ADDRESS_SPACE:
            raise NPUValueError(f"dram must be at most 2**32 bytes, not {dram.size}")
        for name, value in (("prog_addr", prog_addr), ("prog_len", prog_len)):
            if not isinstance(value, (int, np.integer)) or not 0 <= value < _ADDRESS_SPACE:
                raise NPUValueError(f"{name} must be an integer in 0..2**32-1, not {value!r}")
        prog_addr, prog_len = int(prog_addr), int(prog_len)

        if reset:
            self.reset()
        dram = dram.copy()

        def stopped(error_code, error_pc):
            return RunResult(done=False, error_code=error_code, error_pc=error_pc,
                             cycles=None, instructions=error_pc, dram=dram)

        def finished(instructions):
            return RunResult(done=True, error_code=ErrorCode.NONE, error_pc=0,
                             cycles=None, instructions=instructions, dram=dram)

        if prog_addr % INSTR_BYTES or prog_len == 0:
            return stopped(ErrorCode.PROGRAM, 0)
        if self.batched and prog_len > 2 * self.MIN_WINDOW:
            with _one_blas_thread():
                return self._run_windows(dram, prog_addr, prog_len, stopped, finished)
        pc = 0
        while True:
            if pc == prog_len:
                return stopped(ErrorCode.PROGRAM, pc)
            fetch_addr = prog_addr + INSTR_BYTES * pc
            if fetch_addr + INSTR_BYTES > dram.size:
                return stopped(ErrorCode.BUS_READ, pc)
            # Fetch from the DRAM as it is now, so that a STORE over the program is seen.
            word = int.from_bytes(dram[fetch_addr:fetch_addr + INSTR_BYTES].tobytes(), "little")
            opcode, fields = codec.decode(word)
            if opcode is None:
                return stopped(ErrorCode.ILLEGAL_OPCODE, pc)
            if opcode is Opcode.END:
                return finished(pc + 1)
            try:
                self._handlers[opcode](dram, **fields)
            except _Fault as fault:
                return stopped(fault.error_code, pc)
            pc += 1

    def _run_windows(self, dram, prog_addr, prog_len, stopped, finished):
        """:meth:`run` by windows: the same fetches, checks and effects, in the same order."""
        pc = 0
        program = None          # the decoded words around pc (sw.model_window.DecodedProgram)
        step_until = 0          # run one instruction at a time below this pc
        candidate = self.FIRST_WINDOW   # instructions the next window may take
        while True:
            if pc == prog_len:
                return stopped(ErrorCode.PROGRAM, pc)
            if program is None or not program.start <= pc < program.start + program.n:
                fetch_addr = prog_addr + INSTR_BYTES * pc
                if fetch_addr + INSTR_BYTES > dram.size:
                    return stopped(ErrorCode.BUS_READ, pc)
                count = min(prog_len - pc, self.CHUNK,
                            (dram.size - fetch_addr) // INSTR_BYTES)
                program = decode_program(dram, prog_addr, pc, count)
            index = pc - program.start
            if index == program.stop:
                if program.op[index] == Opcode.END.value:
                    return finished(pc + 1)
                return stopped(ErrorCode.ILLEGAL_OPCODE, pc)
            limit = window_limit(self.config, program, index,
                                 min(program.stop, index + candidate), self.WINDOW_ELEMENTS)
            if pc >= step_until and limit - index >= self.MIN_WINDOW:
                window = analyse_window(self.config, dram, program, prog_addr, index, limit)
                ran = window.end - index
                if ran >= self.MIN_WINDOW or window.fault is not None and ran:
                    run_window(self, dram, program, index, window)
                    pc += ran
                    if window.fault is not None:
                        return stopped(window.fault, pc)
                    if window.program_written:
                        program = None
                    # Longer windows while none is cut short; after a cut, a few thousand
                    # instructions (the analysis of the part past a cut is done again).
                    candidate = min(2 * candidate, self.CHUNK) if window.end == limit \
                        else max(self.FIRST_WINDOW, 2 * ran)
                    continue
                if window.fault is not None and not ran:
                    return stopped(window.fault, pc)
                step_until = pc + self.STEP_AFTER_SHORT
            # One instruction, through its handler.
            fetch_addr = prog_addr + INSTR_BYTES * pc
            word = int.from_bytes(dram[fetch_addr:fetch_addr + INSTR_BYTES].tobytes(), "little")
            opcode, fields = codec.decode(word)
            try:
                self._handlers[opcode](dram, **fields)
            except _Fault as fault:
                return stopped(fault.error_code, pc)
            pc += 1
            if opcode in (Opcode.STORE, Opcode.STORE_Q):
                # A store over words still to be fetched: decode them again.
                end = fields["dram_addr"] + (fields["rows"] - 1) * fields["dram_stride"] \
                    + fields["row_bytes"]
                if fields["dram_addr"] < prog_addr + INSTR_BYTES * (program.start + program.n) \
                        and end > prog_addr + INSTR_BYTES * pc:
                    program = None

    # Instruction handlers. Each checks its operands in the documented order and raises _Fault.

    def _load(self, dram, local, range_error, row_width, local_addr, rows, row_bytes,
              dram_addr, dram_stride):
        if rows == 0 or row_bytes == 0 or row_bytes > row_width:
            raise _Fault(ErrorCode.BAD_LENGTH)
        if local_addr + rows > local.shape[0]:
            raise _Fault(range_error)
        _check_block(dram.size, dram_addr, rows, row_bytes, dram_stride, ErrorCode.BUS_READ)
        block = _block_view(dram, dram_addr, rows, row_bytes, dram_stride, writeable=False)
        local[local_addr:local_addr + rows, :row_bytes] = block
        local[local_addr:local_addr + rows, row_bytes:] = 0

    def _load_spad(self, dram, **fields):
        self._load(dram, self.spad, ErrorCode.SPAD_RANGE, self.config.spad_row_bytes,
                   **fields)

    def _load_acc(self, dram, **fields):
        # Viewing the little-endian INT32 rows as bytes makes lane j bytes 4j .. 4j+3.
        self._load(dram, self.acc.view(np.uint8), ErrorCode.ACC_RANGE,
                   self.config.acc_row_bytes, **fields)

    def _preload(self, dram, spad_addr):
        rows, cols = self.config.rows, self.config.cols
        if spad_addr + rows > self.config.spad_depth:
            raise _Fault(ErrorCode.SPAD_RANGE)
        self.weights = self.spad[spad_addr:spad_addr + rows, :cols].view(np.int8).copy()

    def _matmul(self, dram, spad_addr, acc_addr, rows, accumulate, k_width=0, n_width=0):
        config = self.config
        if rows == 0 or k_width > config.rows or n_width > config.cols:
            raise _Fault(ErrorCode.BAD_LENGTH)
        if spad_addr + rows > config.spad_depth:
            raise _Fault(ErrorCode.SPAD_RANGE)
        if acc_addr + rows > config.acc_depth:
            raise _Fault(ErrorCode.ACC_RANGE)
        activations = self.spad[spad_addr:spad_addr + rows, :config.rows].view(np.int8)
        # A float64 product is exact here and uses BLAS: every partial sum is at most
        # R * 128 * 128 <= 2**22 in magnitude, far inside the 53-bit mantissa.
        products = (activations.astype(np.float64) @ self.weights.astype(np.float64))
        products = products.astype(np.int32)
        target = self.acc[acc_addr:acc_addr + rows]
        if accumulate:
            target += products  # numpy INT32 addition wraps around, as the hardware does
        else:
            target[...] = products

    def _store(self, dram, acc_addr, rows, row_bytes, dram_addr, dram_stride):
        config = self.config
        if rows == 0 or row_bytes == 0 or row_bytes % 4 or row_bytes > config.acc_row_bytes:
            raise _Fault(ErrorCode.BAD_LENGTH)
        if acc_addr + rows > config.acc_depth:
            raise _Fault(ErrorCode.ACC_RANGE)
        _check_block(dram.size, dram_addr, rows, row_bytes, dram_stride, ErrorCode.BUS_WRITE)
        source = self.acc[acc_addr:acc_addr + rows].view(np.uint8)[:, :row_bytes]
        _write_rows(dram, source, dram_addr, dram_stride)

    def _load_quant(self, dram, dram_addr, dram_stride, row_bytes, zero_point, act_min,
                    act_max, mode=QuantMode.FIXED):
        config = self.config
        if row_bytes == 0 or row_bytes % 4 or row_bytes > config.acc_row_bytes:
            raise _Fault(ErrorCode.BAD_LENGTH)
        _check_block(dram.size, dram_addr, 2, row_bytes, dram_stride, ErrorCode.BUS_READ)
        lanes = row_bytes // 4
        rows = _block_view(dram, dram_addr, 2, row_bytes, dram_stride, writeable=False)
        multipliers = np.zeros(config.cols, dtype=np.int32)
        shifts = np.zeros(config.cols, dtype=np.int32)
        multipliers[:lanes] = np.ascontiguousarray(rows[0]).view("<i4")
        shifts[:lanes] = np.ascontiguousarray(rows[1]).view("<i4")
        mode = QuantMode(mode)
        if mode is QuantMode.FLOAT:
            bad_rows = (not np.all(np.isfinite(multipliers.view(np.float32)))
                        or np.any(shifts != 0))
        else:
            bad_rows = np.any((shifts < -31) | (shifts > 31))
        if not -128 <= zero_point <= 127 or act_min > act_max or bad_rows:
            raise _Fault(ErrorCode.QUANT)
        self.quant_mode, self.multipliers, self.shifts = mode, multipliers, shifts
        self.zero_point, self.act_min, self.act_max = zero_point, act_min, act_max

    def _store_q(self, dram, acc_addr, rows, row_bytes, dram_addr, dram_stride):
        config = self.config
        if rows == 0 or row_bytes == 0 or row_bytes > config.cols:
            raise _Fault(ErrorCode.BAD_LENGTH)
        if acc_addr + rows > config.acc_depth:
            raise _Fault(ErrorCode.ACC_RANGE)
        _check_block(dram.size, dram_addr, rows, row_bytes, dram_stride, ErrorCode.BUS_WRITE)
        acc = self.acc[acc_addr:acc_addr + rows]
        if self.quant_mode is QuantMode.FLOAT:
            quantized = requantize_float(acc, self.multipliers.view(np.float32),
                                         self.zero_point, self.act_min, self.act_max)
        else:
            quantized = requantize(acc, self.multipliers, self.shifts, self.zero_point,
                                   self.act_min, self.act_max)
        _write_rows(dram, quantized.view(np.uint8)[:, :row_bytes], dram_addr, dram_stride)


def _write_rows(dram, source, dram_addr, dram_stride):
    """Write ``source`` (rows x row_bytes) to a strided block known to lie in ``dram``."""
    rows, row_bytes = source.shape
    if dram_stride >= row_bytes or rows == 1:
        _block_view(dram, dram_addr, rows, row_bytes, dram_stride, writeable=True)[...] = source
    else:
        # Overlapping rows: write them one by one so that the later row wins, in order.
        for row in range(rows):
            start = dram_addr + row * dram_stride
            dram[start:start + row_bytes] = source[row]
