"""Instruction encoders and the table of error programs, shared by the Amaranth-level
controller tests (``tb/test_controller.py``) and the RTL fault tests (``tb/cocotb_faults.py``).

The table is written for :data:`CONFIG` (2x2, scratchpad 16 rows, accumulator 8 rows): each
entry is a program, its ``PROG_LEN`` (``None``: its length), the error it must end in and the
index of the failing instruction.
"""

from hw.config import NPUConfig
from hw.isa import ErrorCode, Opcode, QuantMode, encode


CONFIG = NPUConfig(rows=2, cols=2, spad_depth=16, acc_depth=8, bus_width=64)
PROG_ADDR = 0x100


def load_spad(local_addr, rows, row_bytes, dram_addr, dram_stride):
    return encode(Opcode.LOAD_SPAD, local_addr=local_addr, rows=rows, row_bytes=row_bytes,
                  dram_addr=dram_addr, dram_stride=dram_stride)


def load_acc(local_addr, rows, row_bytes, dram_addr, dram_stride):
    return encode(Opcode.LOAD_ACC, local_addr=local_addr, rows=rows, row_bytes=row_bytes,
                  dram_addr=dram_addr, dram_stride=dram_stride)


def preload(spad_addr):
    return encode(Opcode.PRELOAD, spad_addr=spad_addr)


def matmul(spad_addr, acc_addr, rows, accumulate):
    return encode(Opcode.MATMUL, spad_addr=spad_addr, acc_addr=acc_addr, rows=rows,
                  accumulate=accumulate)


def load_quant(row_bytes, *, dram_addr=0x1000, dram_stride=64, zero_point=0, act_min=-128,
               act_max=127, mode=QuantMode.FIXED):
    return encode(Opcode.LOAD_QUANT, dram_addr=dram_addr, dram_stride=dram_stride,
                  row_bytes=row_bytes, zero_point=zero_point, act_min=act_min,
                  act_max=act_max, mode=mode)


def store_q(acc_addr, rows, row_bytes, dram_addr, dram_stride):
    return encode(Opcode.STORE_Q, acc_addr=acc_addr, rows=rows, row_bytes=row_bytes,
                  dram_addr=dram_addr, dram_stride=dram_stride)


def store(acc_addr, rows, row_bytes, dram_addr, dram_stride):
    return encode(Opcode.STORE, acc_addr=acc_addr, rows=rows, row_bytes=row_bytes,
                  dram_addr=dram_addr, dram_stride=dram_stride)


END = encode(Opcode.END)


GOOD_LOAD = load_spad(0, 2, 2, 0x1000, 2)

# (name, words, prog_len, error code, error pc)
ERROR_PROGRAMS = [
    ("opcode_zero", [GOOD_LOAD, 0, END], None, ErrorCode.ILLEGAL_OPCODE, 1),
    ("opcode_7f", [0x7F, END], None, ErrorCode.ILLEGAL_OPCODE, 0),
    ("opcode_09", [GOOD_LOAD, GOOD_LOAD, 0x09 | 0xABCD << 16, END], None,
     ErrorCode.ILLEGAL_OPCODE, 2),
    ("opcode_ff", [GOOD_LOAD, 0xFF, END], None, ErrorCode.ILLEGAL_OPCODE, 1),
    ("load_spad_range", [load_spad(15, 2, 2, 0x1000, 2), END], None, ErrorCode.SPAD_RANGE, 0),
    ("preload_range", [GOOD_LOAD, preload(15), END], None, ErrorCode.SPAD_RANGE, 1),
    ("matmul_spad_range", [matmul(14, 0, 3, 0), END], None, ErrorCode.SPAD_RANGE, 0),
    ("load_acc_range", [load_acc(7, 2, 8, 0x1000, 8), END], None, ErrorCode.ACC_RANGE, 0),
    # 16-bit address + rows must not wrap back into range.
    ("load_spad_addr_wraps", [load_spad(0xFFFF, 2, 2, 0x1000, 2), END], None,
     ErrorCode.SPAD_RANGE, 0),
    ("preload_addr_wraps", [preload(0xFFFF), END], None, ErrorCode.SPAD_RANGE, 0),
    ("matmul_acc_addr_wraps", [GOOD_LOAD, matmul(0, 0xFFFF, 1, 0), END], None,
     ErrorCode.ACC_RANGE, 1),
    ("matmul_acc_range", [GOOD_LOAD, matmul(0, 7, 2, 1), END], None, ErrorCode.ACC_RANGE, 1),
    ("store_acc_range", [store(8, 1, 8, 0x2000, 8), END], None, ErrorCode.ACC_RANGE, 0),
    ("load_zero_rows", [load_spad(0, 0, 2, 0x1000, 2), END], None, ErrorCode.BAD_LENGTH, 0),
    ("load_zero_bytes", [load_spad(0, 1, 0, 0x1000, 2), END], None, ErrorCode.BAD_LENGTH, 0),
    ("load_spad_too_wide", [load_spad(0, 1, 3, 0x1000, 2), END], None,
     ErrorCode.BAD_LENGTH, 0),
    ("load_acc_too_wide", [load_acc(0, 1, 9, 0x1000, 8), END], None, ErrorCode.BAD_LENGTH, 0),
    ("matmul_zero_rows", [GOOD_LOAD, matmul(0, 0, 0, 0), END], None, ErrorCode.BAD_LENGTH, 1),
    ("store_zero_rows", [store(0, 0, 8, 0x2000, 8), END], None, ErrorCode.BAD_LENGTH, 0),
    ("store_zero_bytes", [store(0, 1, 0, 0x2000, 8), END], None, ErrorCode.BAD_LENGTH, 0),
    ("load_acc_zero_rows", [load_acc(0, 0, 8, 0x1000, 8), END], None, ErrorCode.BAD_LENGTH, 0),
    ("store_not_words", [store(0, 1, 6, 0x2000, 8), END], None, ErrorCode.BAD_LENGTH, 0),
    ("store_too_wide", [store(0, 1, 12, 0x2000, 12), END], None, ErrorCode.BAD_LENGTH, 0),
    ("load_past_4g", [load_spad(0, 1, 2, 0xFFFF_FFFF, 0), END], None,
     ErrorCode.DRAM_RANGE, 0),
    ("load_stride_past_4g", [GOOD_LOAD, load_spad(0, 3, 1, 0xFFFF_0000, 0x8000), END], None,
     ErrorCode.DRAM_RANGE, 1),
    ("store_past_4g", [store(0, 2, 8, 0xFFFF_FFF0, 9), END], None, ErrorCode.DRAM_RANGE, 0),
    ("load_quant_zero_bytes", [load_quant(0), END], None, ErrorCode.BAD_LENGTH, 0),
    ("load_quant_not_words", [load_quant(6), END], None, ErrorCode.BAD_LENGTH, 0),
    ("load_quant_too_wide", [load_quant(12), END], None, ErrorCode.BAD_LENGTH, 0),
    ("load_quant_past_4g", [load_quant(8, dram_addr=0xFFFF_FF00, dram_stride=0x100), END],
     None, ErrorCode.DRAM_RANGE, 0),
    ("load_quant_clamp_inverted", [GOOD_LOAD, load_quant(8, act_min=5, act_max=4), END],
     None, ErrorCode.QUANT, 1),
    ("load_quant_zero_point", [load_quant(8, zero_point=128), END], None, ErrorCode.QUANT, 0),
    ("store_q_zero_rows", [store_q(0, 0, 2, 0x2000, 2), END], None, ErrorCode.BAD_LENGTH, 0),
    ("store_q_too_wide", [store_q(0, 1, 3, 0x2000, 3), END], None, ErrorCode.BAD_LENGTH, 0),
    ("store_q_acc_range", [store_q(7, 2, 2, 0x2000, 2), END], None, ErrorCode.ACC_RANGE, 0),
    ("store_q_past_4g", [store_q(0, 2, 2, 0xFFFF_FFFE, 2), END], None,
     ErrorCode.DRAM_RANGE, 0),
    ("no_end_within_length", [GOOD_LOAD, GOOD_LOAD, END], 2, ErrorCode.PROGRAM, 2),
    ("prog_len_zero", [END], 0, ErrorCode.PROGRAM, 0),
    ("program_past_4g", [END], 0x1000_0000, ErrorCode.PROGRAM, 0),
]

