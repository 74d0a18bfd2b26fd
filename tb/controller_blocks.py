"""Helpers shared by the unit tests of the controller's blocks (``tb/test_fetcher.py``,
``tb/test_decoder.py``, ``tb/test_issue.py``, ``tb/test_load_unit.py``,
``tb/test_weight_loader.py``, ``tb/test_streamer.py``, ``tb/test_store_unit.py``).

Each test drives one block alone in Amaranth's simulator, from one testbench that sets every
input of a cycle before it reads the outputs, so that the order of two testbenches never
matters.
"""

from amaranth.hdl import Elaboratable, Module

from hw.bram import RegisteredMemory
from hw.config import NPUConfig
from hw.isa import INSTR_BYTES, Instruction, Opcode, decode


__all__ = ["CONFIG", "READ_ROW_BYTES", "EMPTY", "span", "row_ranges", "issued", "offer",
           "pack", "unpack", "command_of", "WithReadMemory"]


#: A small array whose rows and columns differ, so that a swapped R and C shows.
CONFIG = NPUConfig(rows=2, cols=3, spad_depth=16, acc_depth=8, bus_width=64)
#: The DMA reader's row width, as :class:`hw.top.NPU` gives it to the controller.
READ_ROW_BYTES = max(CONFIG.dma_row_bytes, INSTR_BYTES)


#: The :class:`~hw.controller.signatures.RowRange` of an instruction that touches no rows.
EMPTY = {"lo": 0, "hi": 0}


def span(first, rows):
    """The :class:`~hw.controller.signatures.RowRange` of rows ``[first, first + rows)``."""
    return {"lo": first, "hi": first + rows}


def row_ranges(word, config=CONFIG):
    """``(spad, acc)``: the scratchpad and accumulator rows instruction ``word`` touches, as
    the decoder sums them (written from the instruction set, not from the decoder):
    LOAD_SPAD and LOAD_ACC ``[local_addr, + rows)`` of their memory, PRELOAD the R
    scratchpad rows from ``spad_addr``, MATMUL its ``rows`` rows of each, STORE and STORE_Q
    ``[acc_addr, + rows)``; empty for the others (and for an illegal opcode)."""
    opcode, f = decode(word)
    spad = acc = EMPTY
    if opcode == Opcode.LOAD_SPAD:
        spad = span(f["local_addr"], f["rows"])
    elif opcode == Opcode.LOAD_ACC:
        acc = span(f["local_addr"], f["rows"])
    elif opcode == Opcode.PRELOAD:
        spad = span(f["spad_addr"], config.rows)
    elif opcode == Opcode.MATMUL:
        spad, acc = span(f["spad_addr"], f["rows"]), span(f["acc_addr"], f["rows"])
    elif opcode in (Opcode.STORE, Opcode.STORE_Q):
        acc = span(f["acc_addr"], f["rows"])
    return spad, acc


def issued(word, *, pc=0, lo=0, hi=0, config=CONFIG):
    """The :class:`~hw.controller.signatures.Issued` payload of instruction ``word``, with the
    row ranges the decoder gives it (:func:`row_ranges` for ``config``)."""
    spad, acc = row_ranges(word, config)
    return {"instr": Instruction.from_bits(word), "pc": pc, "lo": lo, "hi": hi,
            "spad": spad, "acc": acc}


def offer(ctx, cmd, word, **fields):
    """Put instruction ``word`` (:func:`issued`'s payload, ``fields`` passed on) on a unit's
    ``cmd`` stream, valid (for this cycle; the caller clears ``valid`` after the edge)."""
    ctx.set(cmd.payload, issued(word, **fields))
    ctx.set(cmd.valid, 1)


def pack(values, lane_bytes):
    """Little-endian lanes of ``lane_bytes`` bytes each (two's complement) as one integer."""
    word = 0
    for lane, value in enumerate(values):
        word |= (int(value) & ((1 << 8 * lane_bytes) - 1)) << (8 * lane_bytes * lane)
    return word


def unpack(word, lanes, lane_bytes):
    """The signed lanes of :func:`pack`'s integer."""
    bits = 8 * lane_bytes
    values = []
    for lane in range(lanes):
        value = (word >> (bits * lane)) & ((1 << bits) - 1)
        values.append(value - (1 << bits) if value >> (bits - 1) else value)
    return values


def command_of(ctx, cmd):
    """A :class:`~hw.dma.BlockCommand` stream's payload as ``(addr, rows, row_bytes,
    stride)``."""
    payload = cmd.payload
    return (ctx.get(payload.addr), ctx.get(payload.rows), ctx.get(payload.row_bytes),
            ctx.get(payload.stride))


class WithReadMemory(Elaboratable):
    """``dut`` with a :class:`hw.bram.RegisteredMemory` (``depth`` rows of ``shape``,
    ``init``) on its read port ``port``: the two cycles of latency, and the data held while
    ``en`` is low, as the real scratchpad and accumulator give them."""
    def __init__(self, dut, port, *, shape, depth, init):
        self.dut, self.port = dut, port
        self.shape, self.depth, self.init = shape, depth, init

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        m.submodules.memory = memory = RegisteredMemory(
            shape=self.shape, depth=self.depth, init=self.init, read_ports=("read",))
        m.d.comb += [memory.write.en.eq(0), memory.read.addr.eq(self.port.addr),
                     memory.read.en.eq(self.port.en), self.port.data.eq(memory.read.data)]
        return m
