"""The one instruction emitter of the compiler: it encodes instructions and counts what they
use, so that a plan can be counted from the very code that emits its program."""

from hw.isa import Opcode
from .. import codec


__all__ = ["Emitter"]


class Emitter:
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

    def _load(self, opcode, local_addr, rows, row_bytes, dram_addr, dram_stride):
        self._emit(opcode, local_addr=local_addr, rows=rows, row_bytes=row_bytes,
                   dram_addr=dram_addr, dram_stride=dram_stride)
        self.bytes_read += rows * row_bytes

    def load_spad(self, local_addr, rows, row_bytes, dram_addr, dram_stride):
        self._load(Opcode.LOAD_SPAD, local_addr, rows, row_bytes, dram_addr, dram_stride)
        self.spad_rows_used = max(self.spad_rows_used, local_addr + rows)

    def load_acc(self, local_addr, rows, row_bytes, dram_addr, dram_stride):
        self._load(Opcode.LOAD_ACC, local_addr, rows, row_bytes, dram_addr, dram_stride)
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

    def _store(self, opcode, acc_addr, rows, row_bytes, dram_addr, dram_stride):
        self._emit(opcode, acc_addr=acc_addr, rows=rows, row_bytes=row_bytes,
                   dram_addr=dram_addr, dram_stride=dram_stride)
        self.bytes_written += rows * row_bytes
        self.acc_rows_used = max(self.acc_rows_used, acc_addr + rows)

    def store(self, acc_addr, rows, row_bytes, dram_addr, dram_stride):
        self._store(Opcode.STORE, acc_addr, rows, row_bytes, dram_addr, dram_stride)

    def load_quant(self, dram_addr, dram_stride, row_bytes, zero_point, act_min, act_max,
                   mode):
        self._emit(Opcode.LOAD_QUANT, dram_addr=dram_addr, dram_stride=dram_stride,
                   row_bytes=row_bytes, zero_point=zero_point, act_min=act_min,
                   act_max=act_max, mode=mode)
        self.bytes_read += 2 * row_bytes

    def store_q(self, acc_addr, rows, row_bytes, dram_addr, dram_stride):
        self._store(Opcode.STORE_Q, acc_addr, rows, row_bytes, dram_addr, dram_stride)

    def end(self):
        self._emit(Opcode.END)

