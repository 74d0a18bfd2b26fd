"""The decoder: operand checks and DRAM bounds of each fetched instruction, in pipeline stages
before the instruction queue; the queue's head waits in a register for the issue stage."""

from amaranth.hdl import (Assert, Cat, Const, Module, Mux, ResetInserter, Signal, Value,
                          signed)
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import FETCH_DEPTH
from ..isa import ErrorCode, Instruction, LoadArgs, Opcode, StoreArgs
from ..pe import mult18x18d
from .fetcher import WordsSignature
from .signatures import (KIND_OPCODES, Decoded, Issuable, NextHeadSignature, RowRange,
                         decoded_slices, status_copy)


__all__ = ["Decoder", "LATENCY"]


#: Cycles from a word on ``words.word`` to its leaving the queue (``taken``): the input
#: register, stages 1 to 3, the queue and its read register. The word is at the head
#: (``decoded``) a cycle later. The cycle model (sw/timing.py) follows it.
LATENCY = 5


class _CheckFlags(data.Struct):
    """The outcomes of a decoded instruction's checks in stage 1, each set only under the
    opcodes it applies to; stage 3 makes the error code of the first in this order, then
    the DRAM range's (stage 2's)."""
    illegal:    1
    bad_length: 1
    spad_range: 1
    acc_range:  1


#: The head register's slices (bit ranges of :class:`Decoded`), each loaded under its own
#: copy of the head's valid flag, none wider than 33 bits: the instruction (for the units,
#: which follow the head while idle) in four, its DRAM bytes, its rows, and what the issue
#: stage decides from.
HEAD_SLICES = decoded_slices(("instr",), ("lo",), ("hi",), ("spad",), ("acc",),
                             ("written_spad_hi", "read_acc_hi"), ("check", "bus_error", "kind"))


class Decoder(wiring.Component):
    """Checks operands and bounds the DRAM bytes an instruction touches, on its way into the
    instruction queue (:data:`~hw.config.FETCH_DEPTH` entries).

    Operand checks come in the order the ISA documents them: lengths, local range, DRAM
    range. A fetched word is registered on its way in (with its bounds' operands), then takes
    three cycles to the queue: the first forms the block's ``rows x stride`` as two partial
    products (multipliers with registered outputs) beside ``base = addr + row_bytes -
    stride`` and the other checks (a flag per outcome); the second sums the DRAM end and
    checks its range; the third makes the error code of the first check that fails and the
    opcode's kinds, and writes the queue. The queue reads through a register (its front
    entry, ``next``, from flip-flops), so an entry is at its front two cycles after it is
    written. The queue's head then waits in a register (``decoded``, in slices, see
    :data:`HEAD_SLICES`) until the issue stage takes it, so no path from the queue's memory
    reaches the issue stage's logic.

    Parameters
    ----------
    config : NPUConfig
    dsp : bool
        On ECP5, put the partial products on MULT18X18D (default, also when the platform
        gives the PEs fewer DSPs than they are: ``npu_dsp_pes``). Without, the same
        registers are built around a plain ``*``.

    Attributes
    ----------
    words : In(WordsSignature())
        From the fetcher; ``taken`` when a word leaves the queue.
    decoded : Out(stream.Signature(Decoded))
    next : Out(NextHeadSignature())
    """
    def __init__(self, config, *, dsp=True):
        self.config = config
        self.dsp = bool(dsp)
        super().__init__({
            "words":   In(WordsSignature()),
            "decoded": Out(stream.Signature(Decoded)),
            "next":    Out(NextHeadSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        config = self.config
        rows, cols = config.rows, config.cols
        words, flush = self.words, self.words.flush
        # Stage 0: the fetched word, registered beside the checks before any logic reads it
        # (the route from the fetcher's register, by the DMA, and the checks of stage 1
        # did not fit one cycle together). A word on ``word`` during a flush is dropped.
        word = Signal(words.word.payload.shape(), name="word_in")
        word_valid = Signal()
        m.d.sync += [word.eq(words.word.payload), word_valid.eq(words.word.valid & ~flush)]
        # Beside it, whether the opcode is a 2-D block's and stage 1's bounds operands (0 for
        # other opcodes: base 0, limit 2**32), picked by the opcode here (its decodes, then
        # the operands' multiplexers, were the first LUTs of stage 1's longest paths).
        incoming = words.word.payload.instr
        block_op = Signal()          # a 2-D DRAM block: its rows x stride is multiplied
        in_quant = incoming.opcode == Opcode.LOAD_QUANT
        in_block = Cat(incoming.opcode == op for op in (
            Opcode.LOAD_SPAD, Opcode.LOAD_ACC, Opcode.STORE, Opcode.STORE_Q)).any()
        m.d.sync += block_op.eq(in_block)
        operands = [Signal(signed(36), name=f"bounds_{name}") for name in ("a", "b", "c")]
        in_ld, in_q = incoming.args.load, incoming.args.quant
        m.d.sync += [
            operands[0].eq(Mux(in_quant, in_q.dram_addr, Mux(in_block, in_ld.dram_addr, 0))),
            operands[1].eq(Mux(in_quant, in_q.row_bytes, Mux(in_block, in_ld.row_bytes, 0))),
            operands[2].eq(Mux(in_quant, in_q.dram_stride,
                               Mux(in_block, ~Cat(in_ld.dram_stride, Const(0, 4)), 0))),
        ]
        fetched = word.instr
        opcode = fetched.opcode
        load, store, quant = fetched.args.load, fetched.args.store, fetched.args.quant
        preload, matmul = fetched.args.preload, fetched.args.matmul

        # Stage 1. The byte after the last one a 2-D block touches is addr + (rows - 1) *
        # stride + row_bytes (more than 32 bits: it wraps). It is summed as rows * stride +
        # base in stage 2, with base = addr + row_bytes - stride formed beside the multiplier
        # (LOAD_QUANT's two rows: addr + row_bytes + stride), and so is limit = 2**32 - base,
        # for stage 2's range check. Each is a carry-save step and one carry chain (two
        # chains in a row, end = addr + row_bytes and then base and limit from it, were the
        # 8x8's longest path): base = x + y with x the bitwise sum of addr, row_bytes and
        # +-stride and y their carries (and a block's +1 of -stride = ~stride + 1), limit =
        # ~x + ~y + 2 + 2**32, the same step again with the constant.
        assert all(data.Layout.cast(LoadArgs)[n].offset == data.Layout.cast(StoreArgs)[n].offset
                   for n in ("dram_addr", "row_bytes", "dram_stride"))

        def carry_save(name, a, b, c, carry_in=0):
            """``(x, y)`` with ``x + y == a + b + c + carry_in`` (36-bit), one LUT a bit."""
            x, y = Signal(signed(36), name=f"{name}_x"), Signal(signed(36), name=f"{name}_y")
            m.d.comb += [x.eq(a ^ b ^ c), y.eq(Cat(carry_in, (a & b) | (a & c) | (b & c)))]
            return x, y

        base_x, base_y = carry_save("base", *operands, carry_in=block_op)
        limit_x, limit_y = carry_save("limit", ~base_x, ~base_y, Const(2 + (1 << 32), 36))
        base = Signal(signed(35))
        limit = Signal(signed(36))
        m.d.comb += [base.eq(base_x + base_y), limit.eq(limit_x + limit_y)]

        lo = Signal(32)
        dram = Signal()              # the instruction moves a DRAM block
        spad = Signal(RowRange)
        acc = Signal(RowRange)
        with m.Switch(opcode):
            with m.Case(Opcode.LOAD_SPAD, Opcode.LOAD_ACC):
                local = Signal(RowRange)
                m.d.comb += local.eq(Cat(load.local_addr, load.local_addr + load.rows))
                with m.If(opcode == Opcode.LOAD_SPAD):
                    m.d.comb += spad.eq(local)
                with m.Else():
                    m.d.comb += acc.eq(local)
                m.d.comb += lo.eq(load.dram_addr)
            with m.Case(Opcode.PRELOAD):
                m.d.comb += spad.eq(Cat(preload.spad_addr, preload.spad_addr + rows))
            with m.Case(Opcode.MATMUL):
                m.d.comb += [spad.eq(Cat(matmul.spad_addr, matmul.spad_addr + matmul.rows)),
                             acc.eq(Cat(matmul.acc_addr, matmul.acc_addr + matmul.rows))]
            with m.Case(Opcode.STORE, Opcode.STORE_Q):
                m.d.comb += acc.eq(Cat(store.acc_addr, store.acc_addr + store.rows))
                m.d.comb += lo.eq(store.dram_addr)
            with m.Case(Opcode.LOAD_QUANT):
                m.d.comb += lo.eq(quant.dram_addr)
        # Every check but the DRAM range's, as one flag per outcome (each under its opcodes;
        # at most one outcome per instruction is chosen in stage 2, in the ISA's order): the
        # comparisons of this stage go into flip-flops with the opcode's choice, not through
        # the choice of an error code (a priority of 8-bit codes after the comparators'
        # carry chains was the 4x4's longest path).
        flags = Signal(_CheckFlags)

        def checks(bad_length, local_range=None, range_flag=None, dram_block=False):
            m.d.comb += flags.bad_length.eq(bad_length)
            if local_range is not None:
                m.d.comb += range_flag.eq(local_range)
            if dram_block:
                m.d.comb += dram.eq(1)

        def over(a, b, limit):   # a + b > limit in one chain (a sum, then a compare, were two)
            a, b = Value.cast(a), Value.cast(b)
            w = max(len(a), len(b)) + 1                    # bit w of a + b + 2**w - 1 - limit
            if limit >= (1 << w) - 2:
                return Const(0)
            c = Const((1 << w) - 1 - limit, w)
            return ((a ^ b ^ c) + Cat(Const(0, 1), (a & b) | (a & c) | (b & c)))[w]

        def bad_block(args, row_limit):
            return (args.rows == 0) | (args.row_bytes == 0) | (args.row_bytes > row_limit)

        with m.Switch(opcode):
            with m.Case(Opcode.END):
                pass
            with m.Case(Opcode.LOAD_SPAD):
                checks(bad_block(load, config.spad_row_bytes),
                       over(load.local_addr, load.rows, config.spad_depth), flags.spad_range,
                       dram_block=True)
            with m.Case(Opcode.LOAD_ACC):
                checks(bad_block(load, config.acc_row_bytes),
                       over(load.local_addr, load.rows, config.acc_depth), flags.acc_range,
                       dram_block=True)
            with m.Case(Opcode.PRELOAD):
                checks(0, over(preload.spad_addr, Const(rows), config.spad_depth),
                       flags.spad_range)
            with m.Case(Opcode.MATMUL):
                checks((matmul.rows == 0) | (matmul.k_width > rows) | (matmul.n_width > cols),
                       over(matmul.spad_addr, matmul.rows, config.spad_depth), flags.spad_range)
                m.d.comb += flags.acc_range.eq(
                    over(matmul.acc_addr, matmul.rows, config.acc_depth))
            with m.Case(Opcode.STORE):
                checks(bad_block(store, config.acc_row_bytes) | (store.row_bytes[:2] != 0),
                       over(store.acc_addr, store.rows, config.acc_depth), flags.acc_range,
                       dram_block=True)
            with m.Case(Opcode.STORE_Q):
                checks(bad_block(store, cols),
                       over(store.acc_addr, store.rows, config.acc_depth), flags.acc_range,
                       dram_block=True)
            with m.Case(Opcode.LOAD_QUANT):
                checks((quant.row_bytes == 0) | (quant.row_bytes[:2] != 0) |
                       (quant.row_bytes > config.acc_row_bytes), dram_block=True)
            with m.Default():
                m.d.comb += flags.illegal.eq(1)

        # rows x stride of a block, as two 16 x 16 partial products (rows x the stride's low
        # and high halves), a stage early: on ECP5 each is a MULT18X18D whose input
        # registers take the fetcher's next word (``ahead``) beside the fetcher's register,
        # and whose output register holds the product of the word in stage 0; the stage's
        # register is a copy in the fabric (the multiplier's output across the die into
        # stage 2's carry chain was a path of the 8x8 and the board). Load and store
        # arguments share the fields' places; the product counts only for their opcodes.
        assert all(data.Layout.cast(LoadArgs)[name].offset ==
                   data.Layout.cast(StoreArgs)[name].offset for name in ("rows", "dram_stride"))
        partial_lo, partial_hi = Signal(32), Signal(32)
        ahead, fetched_now = words.ahead.args.load, incoming.args.load
        for product, bits in ((partial_lo, slice(0, 16)), (partial_hi, slice(16, 32))):
            early = Signal(32, name=f"bounds_{product.name}_early")
            if self.dsp and getattr(platform, "family", None) == "ecp5":
                mult18x18d(m, Cat(ahead.rows, Const(0, 1)),
                           Cat(ahead.dram_stride[bits], Const(0, 1)), early,
                           registered_inputs=True, name=f"bounds_{product.name}")
            else:
                m.d.sync += early.eq(fetched_now.rows * fetched_now.dram_stride[bits])
            m.d.sync += product.eq(Mux(block_op, early, 0))   # 0 but for a block's opcode

        # Stage 1 -> 2: the partial products and everything beside them, in registers.
        stage = Signal(data.StructLayout({
            "valid": 1, "instr": Instruction, "bus_error": 1,
            "base": signed(35), "limit": signed(36), "lo": 32, "spad": RowRange,
            "acc": RowRange, "dram": 1,
            "flags": _CheckFlags}))
        m.d.sync += [
            stage.valid.eq(word_valid),
            stage.instr.eq(fetched),
            stage.bus_error.eq(word.bus_error),
            stage.base.eq(base),
            # 2**32 - base, for the range check of stage 2 (a subtraction there would put
            # two carry chains in a row between the stage register and the queue).
            stage.limit.eq(limit),
            stage.lo.eq(lo),
            stage.spad.eq(spad),
            stage.acc.eq(acc),
            stage.dram.eq(dram),
            stage.flags.eq(flags),
        ]
        with m.If(flush):
            m.d.sync += stage.valid.eq(0)

        # Stage 2: the DRAM end and its range, into stage 3's register (the partial
        # products' routes from the multipliers, the sums' carry chains and the error code's
        # priority into the queue's memory did not fit one cycle). The range check compares the
        # product with 2**32 - base, beside the sum (equal to hi > 2**32 whenever rows > 0;
        # a block of 0 rows stops on BAD_LENGTH first). The product is the sum of the two
        # partial products (0 but for a block's opcode), so each of hi = product + base and
        # product - limit - 1 = product + ~limit (>= 0 when product > limit) is a sum of
        # three: a carry-save step (one LUT a bit) and one carry chain.
        def sum_of_three(name, *values, width=50):
            a, b, c = operands = [Signal(signed(width), name=f"{name}_{i}") for i in range(3)]
            m.d.comb += [operand.eq(value) for operand, value in zip(operands, values)]
            return (a ^ b ^ c) + Cat(Const(0, 1), (a & b) | (a & c) | (b & c))

        high = Cat(Const(0, 16), partial_hi)
        hi_sum = sum_of_three("hi_sum", partial_lo, high, stage.base)
        over_sum = sum_of_three("over_sum", partial_lo, high, ~stage.limit)
        over_limit = ~over_sum[49]           # product - limit - 1 >= 0
        late = Signal(data.StructLayout({
            "valid": 1, "instr": Instruction, "bus_error": 1, "lo": 32, "hi": 33,
            "spad": RowRange, "acc": RowRange, "flags": _CheckFlags, "dram_range": 1}))
        m.d.sync += [
            late.valid.eq(stage.valid),
            late.instr.eq(stage.instr),
            late.bus_error.eq(stage.bus_error),
            late.lo.eq(stage.lo),
            late.hi.eq(hi_sum[:33]),
            late.spad.eq(stage.spad),
            late.acc.eq(stage.acc),
            late.flags.eq(stage.flags),
            late.dram_range.eq(stage.dram & over_limit),
        ]
        with m.If(flush):
            m.d.sync += late.valid.eq(0)

        # Stage 3: the error code and the opcode's kinds, into the queue.
        # The queue reads through a register (as a SyncFIFOBuffered does: its memory holds
        # all entries but the front one): its front entry, which the issue stage compares
        # with its units a cycle ahead (``next``), comes from flip-flops, not from the
        # distributed RAM's read (whose routes into the hazard flags were the NPU's longest
        # path). An entry reaches the front a cycle later than with a plain read.
        queue = fifo.SyncFIFO(width=data.Layout.cast(Decoded).size, depth=FETCH_DEPTH - 1)
        m.submodules.queue = ResetInserter(flush)(queue)
        entry = Signal(Decoded)
        m.d.comb += [
            entry.instr.eq(late.instr),
            entry.lo.eq(late.lo),
            entry.spad.eq(late.spad),
            entry.acc.eq(late.acc),
            entry.hi.eq(late.hi),
            entry.bus_error.eq(late.bus_error),
            queue.w_data.eq(entry),
            queue.w_en.eq(late.valid),
        ]
        # The checks' outcome, in the ISA's order.
        with m.If(late.flags.illegal):
            m.d.comb += entry.check.eq(ErrorCode.ILLEGAL_OPCODE)
        with m.Elif(late.flags.bad_length):
            m.d.comb += entry.check.eq(ErrorCode.BAD_LENGTH)
        with m.Elif(late.flags.spad_range):
            m.d.comb += entry.check.eq(ErrorCode.SPAD_RANGE)
        with m.Elif(late.flags.acc_range):
            m.d.comb += entry.check.eq(ErrorCode.ACC_RANGE)
        with m.Elif(late.dram_range):
            m.d.comb += entry.check.eq(ErrorCode.DRAM_RANGE)
        for name, opcodes in KIND_OPCODES.items():
            m.d.comb += entry.kind[name].eq(Cat(*[late.instr.opcode == op
                                                  for op in opcodes]).any())
        m.d.comb += [entry.kind.faulty.eq(late.bus_error | (entry.check != 0)),
                     entry.written_spad_hi.eq(Mux(entry.kind.load_spad, late.spad.hi, 0)),
                     entry.read_acc_hi.eq(Mux(entry.kind.store, late.acc.hi, 0))]

        # The queue's head waits in a register until the issue stage takes it. The head and
        # the front register before it are loaded in slices (HEAD_SLICES), each under its
        # own copies of their valid flags: the issue decision (``decoded.ready``, late in
        # its cycle) reaches two enables per slice, not all 2 x 310 flip-flops' (one net
        # to the head's was the NPU's longest path). The copies hold the same value
        # (asserted). The registers have no reset: the core reset reaches only the flags.
        ready = self.decoded.ready
        head = Signal(Decoded, reset_less=True)
        front = Signal(Decoded, reset_less=True)
        stored = Decoded(queue.r_data)
        m.d.comb += [self.decoded.payload.eq(head), self.next.entry.eq(front)]
        copies = [Signal(name=f"head_valid_slice_{k}") for k in range(len(HEAD_SLICES))]
        front_copies = [Signal(name=f"front_valid_slice_{k}") for k in range(len(HEAD_SLICES))]
        both_copies = [Signal(name=f"both_valid_slice_{k}") for k in range(len(HEAD_SLICES))]
        # Every term that ``ready`` enters has it in its last LUT (the flags as next values
        # chosen by it). An empty register loads whatever is before it (its flag says it
        # holds nothing), so each enable is one flag or ``ready``: one LUT with the
        # decision's last terms (with the front's flag too, it was two; both_valid_slice_*).
        for copy, front_copy, both, (start, stop) in zip(copies, front_copies, both_copies,
                                                          HEAD_SLICES):
            with m.If(~copy | ready):          # the head takes the front entry
                m.d.sync += head.as_value()[start:stop].eq(front.as_value()[start:stop])
            with m.If(~both | ready):          # the front takes the queue's
                m.d.sync += front.as_value()[start:stop].eq(stored.as_value()[start:stop])
            copy_next = ~flush & Mux(ready, front_copy, front_copy | copy)
            front_next = ~flush & (queue.r_rdy | (~ready & front_copy & copy))
            m.d.sync += [copy.eq(copy_next), front_copy.eq(front_next),
                         both.eq(~flush & Mux(ready, front_copy & queue.r_rdy,
                                              (front_copy | copy) &
                                              (queue.r_rdy | (front_copy & copy)))),
                         Assert(both == (copy & front_copy), "decoder: both_valid out of step")]
        # END at the head, as the flags above: the issue stage stops fetching with it.
        end_at_head = Signal()
        m.d.sync += end_at_head.eq(~flush & Mux(
            ready, front_copies[0] & front.kind.end,
            Mux(front_copies[0] & ~copies[0], front.kind.end, end_at_head)))
        m.d.comb += self.next.end_at_head.eq(end_at_head)
        # The head's kind flags while it is valid and not faulty, for the issue decision, from
        # flip-flops of their own (the head's also go to the units and the error logic, which
        # placed them), loaded with their next value from the slice that holds the kind.
        kind_copy, kind_front_copy = copies[-1], front_copies[-1]
        assert HEAD_SLICES[-1][1] == data.Layout.cast(Decoded).size
        kind_kept = data.View(data.Layout.cast(Decoded)["kind"].shape, Mux(
            kind_front_copy & ~kind_copy, front.kind.as_value(), head.kind.as_value()))

        def issuable_of(valid, kind):
            return Cat(*[valid & ~kind.faulty & kind[name] for name in Issuable.members])

        m.d.comb += self.next.issuable.eq(status_copy(
            m, "issuable", issuable_of(copies[0], head.kind), ~flush.replicate(
                len(Issuable.members)) & Mux(ready, issuable_of(kind_front_copy, front.kind),
                                             issuable_of(kind_front_copy | kind_copy,
                                                         kind_kept))))
        m.d.sync += Assert(end_at_head == (copies[0] & head.kind.end),
                           "decoder: end_at_head out of step")
        m.d.comb += [queue.r_en.eq(~front_copies[0] | ~copies[0] | ready),
                     words.taken.eq(front_copies[0] & (~copies[0] | ready)),
                     self.next.load_if_issued.eq(front_copies[0]),
                     self.next.load_if_held.eq(front_copies[0] & ~copies[0]),
                     self.decoded.valid.eq(copies[0])]
        for name, flags in (("head", copies), ("front", front_copies)):
            m.d.sync += Assert(Cat(*flags).all() | ~Cat(*flags).any(),
                               f"decoder: the {name}'s valid copies differ")
        return m
