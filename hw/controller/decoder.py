"""The decode stage: the operand checks and DRAM bounds of the instruction at the queue's
head, in registers a cycle before the issue stage looks at it."""

from amaranth.hdl import Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..isa import ErrorCode, Instruction, Opcode
from .fetcher import FetchedWord


__all__ = ["Decoder", "Decoded"]


class Decoded(data.Struct):
    """A decoded instruction: the operand check's :class:`~hw.isa.ErrorCode` (0 when it
    passes), the DRAM bytes ``[lo, hi)`` it touches (exact whenever the check passes, when
    ``hi <= 2**32``), and whether its fetch failed instead."""
    instr:     Instruction
    lo:        32
    hi:        33
    check:     8
    bus_error: 1


class Decoder(wiring.Component):
    """Checks operands and bounds the DRAM bytes an instruction touches.

    The bounds' multiply and the checks' carry chains do not share a cycle with the hazard
    checks and the issue. Operand checks come in the order the ISA documents them: lengths,
    local range, DRAM range.

    Attributes
    ----------
    fetched : In(stream.Signature(FetchedWord))
    flush : In(1)
        Drop the decoded instruction (the queue was emptied).
    decoded : Out(stream.Signature(Decoded))
    """
    def __init__(self, config):
        self.config = config
        super().__init__({
            "fetched": In(stream.Signature(FetchedWord)),
            "flush":   In(1),
            "decoded": Out(stream.Signature(Decoded)),
        })

    def elaborate(self, platform):
        m = Module()
        config = self.config
        rows, cols = config.rows, config.cols
        fetched = self.fetched.payload.instr
        opcode = fetched.opcode
        load, store, quant = fetched.args.load, fetched.args.store, fetched.args.quant
        preload, matmul = fetched.args.preload, fetched.args.matmul

        # The byte after the last one a 2-D block touches is addr + (rows - 1) * stride +
        # row_bytes (more than 32 bits: it wraps). It is summed as rows * stride + base, with
        # base = addr + row_bytes - stride formed beside the multiplier, so that the product
        # starts right at the queue's output and only one carry chain follows it; the DRAM
        # range check compares the product with 2**32 - base, beside that last sum (equal to
        # hi > 2**32 whenever rows > 0; a block of 0 rows stops on BAD_LENGTH first).
        product = Signal(48)         # rows x stride of a block; 0 for LOAD_QUANT
        base = Signal(signed(35))
        lo = Signal(32)
        with m.Switch(opcode):
            with m.Case(Opcode.LOAD_SPAD, Opcode.LOAD_ACC):
                m.d.comb += [lo.eq(load.dram_addr),
                             product.eq(load.rows * load.dram_stride),
                             base.eq(load.dram_addr + load.row_bytes - load.dram_stride)]
            with m.Case(Opcode.STORE, Opcode.STORE_Q):
                m.d.comb += [lo.eq(store.dram_addr),
                             product.eq(store.rows * store.dram_stride),
                             base.eq(store.dram_addr + store.row_bytes - store.dram_stride)]
            with m.Case(Opcode.LOAD_QUANT):
                m.d.comb += [lo.eq(quant.dram_addr),
                             base.eq(quant.dram_addr + quant.dram_stride + quant.row_bytes)]
        dram_limit = Signal(signed(35))
        m.d.comb += dram_limit.eq((1 << 32) - base)
        dram_overflow = product > dram_limit      # hi > 2**32

        check = Signal(8)

        def checks(bad_length, local_range=None, range_code=None, dram=False):
            with m.If(bad_length):
                m.d.comb += check.eq(ErrorCode.BAD_LENGTH)
            if local_range is not None:
                with m.Elif(local_range):
                    m.d.comb += check.eq(range_code)
            if dram:
                with m.Elif(dram_overflow):
                    m.d.comb += check.eq(ErrorCode.DRAM_RANGE)

        def bad_block(args, row_limit):
            return (args.rows == 0) | (args.row_bytes == 0) | (args.row_bytes > row_limit)

        with m.Switch(opcode):
            with m.Case(Opcode.END):
                pass
            with m.Case(Opcode.LOAD_SPAD):
                checks(bad_block(load, config.spad_row_bytes),
                       load.local_addr + load.rows > config.spad_depth, ErrorCode.SPAD_RANGE,
                       dram=True)
            with m.Case(Opcode.LOAD_ACC):
                checks(bad_block(load, config.acc_row_bytes),
                       load.local_addr + load.rows > config.acc_depth, ErrorCode.ACC_RANGE,
                       dram=True)
            with m.Case(Opcode.PRELOAD):
                checks(0, preload.spad_addr + rows > config.spad_depth, ErrorCode.SPAD_RANGE)
            with m.Case(Opcode.MATMUL):
                with m.If((matmul.rows == 0) | (matmul.k_width > rows) |
                          (matmul.n_width > cols)):
                    m.d.comb += check.eq(ErrorCode.BAD_LENGTH)
                with m.Elif(matmul.spad_addr + matmul.rows > config.spad_depth):
                    m.d.comb += check.eq(ErrorCode.SPAD_RANGE)
                with m.Elif(matmul.acc_addr + matmul.rows > config.acc_depth):
                    m.d.comb += check.eq(ErrorCode.ACC_RANGE)
            with m.Case(Opcode.STORE):
                checks(bad_block(store, config.acc_row_bytes) | (store.row_bytes[:2] != 0),
                       store.acc_addr + store.rows > config.acc_depth, ErrorCode.ACC_RANGE,
                       dram=True)
            with m.Case(Opcode.STORE_Q):
                checks(bad_block(store, cols),
                       store.acc_addr + store.rows > config.acc_depth, ErrorCode.ACC_RANGE,
                       dram=True)
            with m.Case(Opcode.LOAD_QUANT):
                checks((quant.row_bytes == 0) | (quant.row_bytes[:2] != 0) |
                       (quant.row_bytes > config.acc_row_bytes), dram=True)
            with m.Default():
                m.d.comb += check.eq(ErrorCode.ILLEGAL_OPCODE)

        # The decoded instruction waits in registers until the issue stage takes it.
        with m.If(self.decoded.ready):
            m.d.sync += self.decoded.valid.eq(0)
        with m.If(self.fetched.valid & (~self.decoded.valid | self.decoded.ready)):
            m.d.comb += self.fetched.ready.eq(1)
            m.d.sync += [
                self.decoded.valid.eq(1),
                self.decoded.payload.instr.eq(fetched),
                self.decoded.payload.lo.eq(lo),
                self.decoded.payload.hi.eq(product + base),
                self.decoded.payload.check.eq(check),
                self.decoded.payload.bus_error.eq(self.fetched.payload.bus_error),
            ]
        with m.If(self.flush):
            m.d.sync += self.decoded.valid.eq(0)
        return m
