"""The one instruction emitter of the compiler: it encodes instructions and counts what they
use, so that a plan can be counted from the very code that emits its program.

Encoding is batched: each instruction is kept as a row of integers until the words are
asked for (or a batch is full), and a batch is encoded with numpy, field by field, from the
same field table :mod:`sw.codec` packs from (:data:`sw.codec.FIELDS`). A batch holding a value
that does not fit its field, or a value that is not an integer, is encoded instruction by
instruction with :func:`sw.codec.encode` instead, which raises its usual error. Encoding one
instruction at a time was three quarters of the time of compiling a large network.
"""

import numpy as np
from amaranth.lib import data

from hw import isa
from hw.isa import INSTR_BITS, Opcode
from .. import codec


__all__ = ["Emitter", "encode_rows"]


#: Instructions kept before they are encoded (bounds the memory of the pending rows).
BATCH = 1 << 16
#: The most fields an opcode has (``LOAD_QUANT``'s seven); shorter rows are padded with 0.
_WIDTH = max(len(specs) for specs in codec.FIELDS.values())
assert _WIDTH == 7
_OPCODE_OFFSET = data.Layout.cast(isa.Instruction)["opcode"].offset
_HALF = 64
_LOW_MASK = (1 << _HALF) - 1
assert INSTR_BITS == 2 * _HALF and _OPCODE_OFFSET + 8 <= _HALF
#: The order in which the methods below pass each opcode's fields: the codec's.
_ORDER = {
    Opcode.END: (),
    Opcode.LOAD_SPAD: ("local_addr", "rows", "row_bytes", "dram_addr", "dram_stride"),
    Opcode.LOAD_ACC: ("local_addr", "rows", "row_bytes", "dram_addr", "dram_stride"),
    Opcode.PRELOAD: ("spad_addr",),
    Opcode.MATMUL: ("spad_addr", "acc_addr", "rows", "accumulate", "k_width", "n_width"),
    Opcode.STORE: ("acc_addr", "rows", "row_bytes", "dram_addr", "dram_stride"),
    Opcode.LOAD_QUANT: ("dram_addr", "dram_stride", "row_bytes", "zero_point", "mode",
                        "act_min", "act_max"),
    Opcode.STORE_Q: ("acc_addr", "rows", "row_bytes", "dram_addr", "dram_stride"),
}
assert _ORDER == {opcode: tuple(spec.name for spec in specs)
                  for opcode, specs in codec.FIELDS.items()}, "the ISA's fields changed"


def _or_field(low, high, values, offset, width):
    """OR the unsigned ``values`` (uint64) into the words' halves at bit ``offset``."""
    if offset + width <= _HALF:
        low |= values << np.uint64(offset)
    elif offset >= _HALF:
        high |= values << np.uint64(offset - _HALF)
    else:
        low |= (values << np.uint64(offset)) & np.uint64(_LOW_MASK)
        high |= values >> np.uint64(_HALF - offset)


def encode_rows(opcodes, rows):
    """The words of the instructions ``opcodes[i]`` (opcode values) with the field values
    ``rows[i]`` (in :data:`sw.codec.FIELDS` order, padded with zeros to seven), as a list of
    int: the same words :func:`sw.codec.encode` gives, and its errors."""
    if not rows:
        return []
    table = np.array(rows)
    if table.dtype.kind not in "iu" or table.shape != (len(rows), _WIDTH):
        return _encode_each(opcodes, rows)
    table = table.astype(np.int64, copy=False)
    codes = np.array(opcodes, dtype=np.int64)
    low = np.zeros(len(rows), dtype=np.uint64)
    high = np.zeros(len(rows), dtype=np.uint64)
    for value in np.unique(codes).tolist():
        chosen = np.flatnonzero(codes == value)
        part_low = np.full(len(chosen), value << _OPCODE_OFFSET, dtype=np.uint64)
        part_high = np.zeros(len(chosen), dtype=np.uint64)
        for column, spec in enumerate(codec.FIELDS[_OPCODES[value]]):
            values = table[chosen, column]
            if values.min() < spec.minimum or values.max() > spec.maximum:
                return _encode_each(opcodes, rows)        # codec.encode names the field
            _or_field(part_low, part_high, (values & spec.mask).astype(np.uint64),
                      spec.offset, spec.width)
        low[chosen] = part_low
        high[chosen] = part_high
    return [high_word << _HALF | low_word
            for low_word, high_word in zip(low.tolist(), high.tolist())]


def _encode_each(opcodes, rows):
    return [codec.encode(_OPCODES[value], **{spec.name: field for spec, field
                                             in zip(codec.FIELDS[_OPCODES[value]], row)})
            for value, row in zip(opcodes, rows)]


_OPCODES = {opcode.value: opcode for opcode in Opcode}
# Opcode values for the hot paths (an enum member's hash and value are Python code).
_END, _LOAD_SPAD, _LOAD_ACC, _PRELOAD, _MATMUL, _STORE, _LOAD_QUANT, _STORE_Q = (
    Opcode.END.value, Opcode.LOAD_SPAD.value, Opcode.LOAD_ACC.value, Opcode.PRELOAD.value,
    Opcode.MATMUL.value, Opcode.STORE.value, Opcode.LOAD_QUANT.value, Opcode.STORE_Q.value)


class Emitter:
    """Encodes instructions and counts what they use, so the plan can be checked.

    A ``dry`` emitter only counts. :attr:`words` encodes what is pending (see the module's
    documentation).
    """

    def __init__(self, config, dry=False):
        self.config = config
        self.dry = dry
        self._words = []
        self._opcodes = []                   # pending instructions, not yet encoded
        self._rows = []
        self.instructions = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.spad_rows_used = 0
        self.acc_rows_used = 0
        self.weight_loads = 0

    @property
    def words(self):
        """The encoded program so far, a list of int."""
        self._flush()
        return self._words

    def _flush(self):
        if self._rows:
            self._words.extend(encode_rows(self._opcodes, self._rows))
            self._opcodes, self._rows = [], []

    def _queue(self, opcode, row):
        """Queue one instruction (an opcode value and its seven fields) for encoding."""
        self._opcodes.append(opcode)
        self._rows.append(row)
        if len(self._rows) >= BATCH:
            self._flush()

    def load_spad(self, local_addr, rows, row_bytes, dram_addr, dram_stride):
        self.instructions += 1
        if not self.dry:
            self._queue(_LOAD_SPAD, (local_addr, rows, row_bytes, dram_addr, dram_stride, 0, 0))
        self.bytes_read += rows * row_bytes
        self.spad_rows_used = max(self.spad_rows_used, local_addr + rows)

    def load_acc(self, local_addr, rows, row_bytes, dram_addr, dram_stride):
        self.instructions += 1
        if not self.dry:
            self._queue(_LOAD_ACC, (local_addr, rows, row_bytes, dram_addr, dram_stride, 0, 0))
        self.bytes_read += rows * row_bytes
        self.acc_rows_used = max(self.acc_rows_used, local_addr + rows)

    def preload(self, spad_addr):
        self.instructions += 1
        if not self.dry:
            self._queue(_PRELOAD, (spad_addr, 0, 0, 0, 0, 0, 0))
        self.weight_loads += 1
        self.spad_rows_used = max(self.spad_rows_used, spad_addr + self.config.rows)

    def matmul(self, spad_addr, acc_addr, rows, accumulate, k_width=0, n_width=0):
        self.instructions += 1
        if not self.dry:
            self._queue(_MATMUL, (spad_addr, acc_addr, rows, int(accumulate), k_width, n_width,
                                  0))
        self.spad_rows_used = max(self.spad_rows_used, spad_addr + rows)
        self.acc_rows_used = max(self.acc_rows_used, acc_addr + rows)

    def _store(self, opcode, acc_addr, rows, row_bytes, dram_addr, dram_stride):
        self.instructions += 1
        if not self.dry:
            self._queue(opcode, (acc_addr, rows, row_bytes, dram_addr, dram_stride, 0, 0))
        self.bytes_written += rows * row_bytes
        self.acc_rows_used = max(self.acc_rows_used, acc_addr + rows)

    def store(self, acc_addr, rows, row_bytes, dram_addr, dram_stride):
        self._store(_STORE, acc_addr, rows, row_bytes, dram_addr, dram_stride)

    def load_quant(self, dram_addr, dram_stride, row_bytes, zero_point, act_min, act_max,
                   mode):
        self.instructions += 1
        if not self.dry:
            self._queue(_LOAD_QUANT, (dram_addr, dram_stride, row_bytes, zero_point, mode,
                                      act_min, act_max))
        self.bytes_read += 2 * row_bytes

    def store_q(self, acc_addr, rows, row_bytes, dram_addr, dram_stride):
        self._store(_STORE_Q, acc_addr, rows, row_bytes, dram_addr, dram_stride)

    def end(self):
        self.instructions += 1
        if not self.dry:
            self._queue(_END, (0,) * _WIDTH)
