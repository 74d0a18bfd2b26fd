"""The streamer: ``MATMUL``, activation rows from the scratchpad through the array, results
into the accumulator."""

from amaranth.hdl import Assert, Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import ReadPort
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..accumulator import AccumulatorWriteSignature, AccWrite
from ..bram import READ_LATENCY
from ..systolic import ActivationRow
from .signatures import CommitSignature, RowRange, UnitSignature, status_copy


__all__ = ["Streamer", "StreamStatus", "WRITEBACK_SLOTS"]


#: MATMULs whose results may be in the array at once: the one streaming and the one before.
WRITEBACK_SLOTS = 2


def product_in_luts(a, b):
    """``a * b`` as a sum of shifted copies of ``b``, one per bit of ``a``: Yosys maps a
    ``*`` onto a DSP (an unregistered MULT18X18D, placed far from its users on the 85F: the
    8x8 board build's only failing path), and these widths (at most 7 bits) are a few LUTs."""
    return sum(Mux(bit, b << i, 0) for i, bit in enumerate(a))


class Writeback(data.Struct):
    """A MATMUL whose results are still to come out of the array."""
    valid:      1
    acc:        RowRange   #: the accumulator rows it writes
    rows:       16
    accumulate: 1


class StreamStatus(data.Struct):
    """What the streamer holds, for the issue stage's hazard checks and counters."""
    busy:      1    #: reading an activation row in this cycle
    free:      1    #: a MATMUL issued now streams right behind (idle, or on its last row)
    spad:      RowRange   #: the scratchpad rows it reads
    macs:      32   #: useful MACs (k_width x n_width) of the row two cycles before, or 0
    full:      1    #: every writeback slot holds a MATMUL
    drained:   1    #: no MATMUL streams, none has results to come, no write is in flight
    writes:    data.ArrayLayout(Writeback, WRITEBACK_SLOTS)
    #: the slots in use after the next edge if no MATMUL issues now ([0]) or one does ([1])
    in_use_after: data.ArrayLayout(WRITEBACK_SLOTS, 2)
    follows:   1    #: ``spad`` takes the issue stage's head's at the next edge
    slot_follows: WRITEBACK_SLOTS   #: so does the ``acc`` of each of these slots
    writing:   AccWrite   #: the accumulator's write in this cycle
    #: the writes in its pipeline that a read started in the next cycle would miss
    unseen:    data.ArrayLayout(AccWrite, READ_LATENCY)


class Streamer(wiring.Component):
    """Streams a MATMUL's activation rows into the array and writes its results.

    A MATMUL issued while the last row of the one before is read streams right behind it;
    results leave the array in order and each goes to the oldest MATMUL's next row. The
    accumulator's write port is the streamer's; the load unit's ``LOAD_ACC`` writes through
    ``load_acc`` (the issue stage starts a LOAD_ACC only once the array is drained).

    Attributes
    ----------
    issue : In(UnitSignature(StreamStatus))
    commit : In(CommitSignature())
        The first row of a MATMUL issued while ``commit.pending`` commits the shadow weights.
    spad : In(ReadPort.Signature)
        The scratchpad's activation read port.
    act : Out(stream.Signature(ActivationRow(rows), always_ready=True))
    result : In(stream.Signature(ArrayLayout(signed(32), cols), always_ready=True))
    acc : In(AccumulatorWriteSignature)
        The accumulator's write port.
    load_acc : Out(AccumulatorWriteSignature)
        The load unit's share of it.
    """
    def __init__(self, config):
        self.config = config
        acc_port = AccumulatorWriteSignature(config.acc_depth, config.cols)
        super().__init__({
            "issue":    In(UnitSignature(StreamStatus)),
            "commit":   In(CommitSignature()),
            "spad":     In(ReadPort.Signature(addr_width=ceil_log2(config.spad_depth),
                                              shape=8 * config.spad_row_bytes)),
            "act":      Out(stream.Signature(ActivationRow(config.rows), always_ready=True)),
            "result":   In(stream.Signature(data.ArrayLayout(signed(32), config.cols),
                                            always_ready=True)),
            "acc":      In(acc_port),
            "load_acc": Out(acc_port),
        })

    def elaborate(self, platform):
        m = Module()
        rows, cols = self.config.rows, self.config.cols
        cmd, status = self.issue.cmd, self.issue.status

        busy = Signal()
        spad = Signal(RowRange)
        # The row of this cycle: whether it is the MATMUL's last, how many follow it, and
        # the address of the next, all registered (no sum or comparison before the block
        # RAM's address or the issue stage's ``free``).
        read_addr = Signal.like(self.spad.addr)
        last = Signal()
        rows_after = Signal(16)
        # The MATMUL's widths, registered at its issue; the useful MACs of a row are their
        # product, registered after the cycle it is read (``macs``, for the perf counter, two
        # cycles after the row, ``product_in_luts``): the multiplier is not at the end of
        # the head's operands and the widths' defaults (that path was the 4x4's longest).
        k_used = Signal(range(rows + 1))
        n_used = Signal(range(cols + 1))
        macs = Signal(32)
        read = Signal()              # a row was read in the cycle before: here in the next
        read_commit = Signal()
        arrive = Signal()
        arrive_commit = Signal()
        # The MATMULs whose results are still to be written, oldest at ``head``.
        slots = [Signal(Writeback, name=f"writeback_{i}") for i in range(WRITEBACK_SLOTS)]
        head = Signal(range(WRITEBACK_SLOTS))
        queued = Signal(range(WRITEBACK_SLOTS + 1))
        push = Signal()
        pop = Signal()
        oldest = Signal(Writeback)
        m.d.comb += oldest.eq(Mux(head, slots[1], slots[0]))
        out_count = Signal(16)

        # What the issue stage decides from comes from flip-flops: ``full``, ``drained`` and
        # the slots in use are registered from their values in the next cycle (the same
        # terms, of the next head, count, busy and accumulator pipeline).
        full = Signal()
        drained = Signal(init=1)
        in_use = Signal(WRITEBACK_SLOTS)
        busy_next = Signal()
        head_next = Signal.like(head)
        queued_next = Signal.like(queued)
        stays = busy & ~last         # streaming in the next cycle without a new MATMUL
        m.d.comb += [
            busy_next.eq(cmd.valid | stays),
            head_next.eq(head ^ pop),
            queued_next.eq(queued + push - pop),
        ]
        # The accumulator is busy in the next cycle with this cycle's write and the two before
        # it (its s1 and s2, ``unseen``): its own ``busy`` adds the one in S, written now.
        acc_busy_next = self.acc.en | Cat(*[write.valid for write in self.acc.unseen]).any()

        def flags_after(issued):
            """``full``, ``drained`` and the slots in use after the next edge, if a MATMUL
            issues now (``issued``, a constant) or not: both are formed before the issue
            decision, which comes late in the cycle and only chooses between them."""
            queued_after = queued + issued - pop
            # Slot i is in use when it is the head and the queue is not empty, or the tail.
            return Cat(queued_after == WRITEBACK_SLOTS,
                       ~(issued | stays) & (queued_after == 0) & ~acc_busy_next,
                       *[((head_next == i) & (queued_after >= 1)) |
                         ((head_next != i) & (queued_after == 2))
                         for i in range(WRITEBACK_SLOTS)])
        m.d.sync += Cat(full, drained, in_use).eq(Mux(cmd.valid, flags_after(1),
                                                      flags_after(0)))
        m.d.comb += [status.in_use_after[k].eq(flags_after(k)[2:]) for k in (0, 1)]
        m.d.sync += [
            Assert(full == (queued == WRITEBACK_SLOTS), "streamer: full out of step"),
            Assert(drained == (~busy & (queued == 0) & ~self.acc.busy),
                   "streamer: drained out of step"),
        ]
        # A MATMUL issued now streams right behind: idle, or reading the last row this cycle
        # (``~busy | last``, a flip-flop of its own: its LUT came before the scratchpad read
        # address's choice, on the way to the scratchpad's forwarding compare).
        free, free_next = Signal(init=1), Signal()
        m.d.sync += [free.eq(free_next),
                     Assert(free == (~busy | last), "streamer: free out of step")]
        m.d.comb += [
            status.spad.eq(spad),
            status.macs.eq(macs),
            status.full.eq(full),
            status.drained.eq(drained),
            status.writing.valid.eq(self.acc.en),
            status.writing.addr.eq(self.acc.addr),
            status.unseen.eq(self.acc.unseen),
        ]
        for i in range(WRITEBACK_SLOTS):
            m.d.comb += [status.writes[i].eq(slots[i]), status.writes[i].valid.eq(in_use[i])]

        # Each row is read a cycle ahead of its cycle in ``busy`` (the scratchpad's read
        # takes two cycles), so that it reaches the array in the cycle after that one: the
        # first in the cycle its MATMUL issues (the port reads the head's first row in
        # every cycle the streamer is free, whether it issues or not), each next one in the
        # cycle of the row before. ``read_addr`` is the row after the one of this cycle.
        m.d.comb += [self.spad.en.eq(1),
                     self.spad.addr.eq(Mux(free, cmd.payload.spad.lo, read_addr))]
        m.d.sync += [
            read.eq(busy_next),
            read_commit.eq(cmd.valid & self.commit.pending),
            arrive.eq(read),
            arrive_commit.eq(read_commit),
        ]
        with m.If(busy):
            m.d.sync += [
                read_addr.eq(read_addr + 1),
                last.eq(rows_after == 1),
                rows_after.eq(rows_after - 1),
            ]
            with m.If(last):
                m.d.sync += busy.eq(0)
        # While a MATMUL could issue, the registers (and the free tail slot) follow the
        # instruction at the issue stage's head, so that the issue decision enables only
        # ``busy`` and the slot count, not the operands' flip-flops. A MATMUL issues only
        # when free and not full.
        m.d.comb += self.commit.take.eq(cmd.valid)
        m.d.comb += push.eq(cmd.valid)
        with m.If(cmd.valid):
            m.d.sync += busy.eq(1)
        matmul = cmd.payload.instr.args.matmul
        # Each slot's rows after its first and whether it has one, formed as it follows the
        # head (for ``out_left``/``out_last``: the slot mux before a subtraction and a 16-bit
        # comparison was a path of the 8x8).
        cmd_left, cmd_single = matmul.rows - 1, matmul.rows == 1
        slots_left = [Signal(16, name=f"writeback_{i}_left") for i in range(WRITEBACK_SLOTS)]
        slots_single = [Signal(name=f"writeback_{i}_single") for i in range(WRITEBACK_SLOTS)]
        with m.If(~status.full):
            for i in range(WRITEBACK_SLOTS):
                # The tail: the slot after the head when one MATMUL is queued, else the head.
                with m.If((head ^ (queued == 1)) == i):
                    m.d.comb += status.slot_follows[i].eq(1)
                    m.d.sync += [slots[i].acc.eq(cmd.payload.acc),
                                 slots[i].rows.eq(matmul.rows),
                                 slots[i].accumulate.eq(matmul.accumulate),
                                 slots_left[i].eq(cmd_left), slots_single[i].eq(cmd_single)]
        with m.If(free):
            m.d.sync += [
                spad.eq(cmd.payload.spad), read_addr.eq(cmd.payload.spad.lo + 1),
                last.eq(matmul.rows == 1), rows_after.eq(matmul.rows - 1),
                k_used.eq(Mux(matmul.k_width == 0, rows, matmul.k_width)),
                n_used.eq(Mux(matmul.n_width == 0, cols, matmul.n_width)),
            ]
        # The product passes a register of its own (by the widths) before ``macs`` (by the
        # counter): from the widths to ``macs`` in one cycle was a path of the 8x8. ``arrive``
        # is ``busy`` a cycle late (``read`` is ``busy``, registered from its next value).
        row_macs = Signal(32)
        m.d.sync += [row_macs.eq(product_in_luts(k_used, n_used)),
                     macs.eq(Mux(arrive, row_macs, 0))]
        # The issue stage's copies of ``busy`` and ``free`` (``status_copy``): free next when
        # free now and no MATMUL issues or one of one row does, or on the row before the last.
        status_busy = status_copy(m, "stream_busy", busy, busy_next)
        m.d.comb += free_next.eq(Mux(free, ~cmd.valid | (matmul.rows == 1), rows_after == 1))
        status_free = status_copy(m, "stream_free", free, free_next, init=1)
        m.d.comb += [status.busy.eq(status_busy), status.free.eq(status_free),
                     status.follows.eq(status_free)]
        m.d.comb += [
            self.act.valid.eq(arrive),
            self.act.payload.lanes.eq(self.spad.data[:8 * rows]),
            self.act.payload.commit.eq(arrive_commit),
        ]

        # Results leave the array in order: each goes to the oldest MATMUL's next row. The
        # write port is the load unit's otherwise. That row's address (oldest.acc.lo +
        # out_count) is kept in a flip-flop, so that the accumulator's block RAM, across the
        # die, is not at the end of the slot mux and an adder: it steps with each result,
        # takes the next MATMUL's first row when the oldest's last leaves (the other slot's,
        # or the issue stage's head's, which the tail slot follows, when that slot is the
        # tail), and follows the head while no MATMUL is queued.
        write_addr = Signal.like(self.acc.addr)
        with m.If(self.result.valid):
            with m.If(pop):
                m.d.sync += write_addr.eq(Mux(queued == 1, cmd.payload.acc.lo,
                                              Mux(head, slots[0].acc.lo, slots[1].acc.lo)))
            with m.Else():
                m.d.sync += write_addr.eq(write_addr + 1)
        with m.Elif(queued == 0):
            m.d.sync += write_addr.eq(cmd.payload.acc.lo)
        m.d.sync += Assert(~self.result.valid |
                           (write_addr == (oldest.acc.lo + out_count)[:len(write_addr)]),
                           "streamer: write_addr out of step")
        # Whether this result is the oldest MATMUL's last, in a flip-flop kept as write_addr
        # is (from a count of the rows left after this one): the slot mux, a subtraction
        # and a 16-bit comparison into the slot count and the issue stage's flags were a
        # long path.
        out_left = Signal(16)
        out_last = Signal()
        with m.If(self.result.valid):
            with m.If(pop):
                m.d.sync += [
                    out_left.eq(Mux(queued == 1, cmd_left,
                                    Mux(head, slots_left[0], slots_left[1]))),
                    out_last.eq(Mux(queued == 1, cmd_single,
                                    Mux(head, slots_single[0], slots_single[1]))),
                ]
            with m.Else():
                m.d.sync += [out_left.eq(out_left - 1), out_last.eq(out_left == 1)]
        with m.Elif(queued == 0):
            m.d.sync += [out_left.eq(cmd_left), out_last.eq(cmd_single)]
        m.d.sync += Assert(Cat(*[~in_use[i] | ((slots_left[i] == (slots[i].rows - 1)[:16]) &
                                                    (slots_single[i] == (slots[i].rows == 1)))
                                 for i in range(WRITEBACK_SLOTS)]).all(),
                           "streamer: a slot's row count copies out of step")
        m.d.sync += Assert(~self.result.valid | (out_last == (out_count == oldest.rows - 1)),
                           "streamer: out_last out of step")
        with m.If(self.result.valid):
            m.d.sync += out_count.eq(out_count + 1)
            with m.If(out_last):
                m.d.comb += pop.eq(1)
                m.d.sync += [out_count.eq(0), head.eq(~head)]
        # The write port's row, address and mode are the array's while a MATMUL has results
        # to come, else the load unit's: a choice from flip-flops of the streamer's own
        # (``due_lane_<lane>``, one per lane's 32 bits and one for the address, kept apart
        # on the FPGA), made from the MATMULs queued in the cycle before, not from the
        # array's result flag, which comes from across the die (its route into the picks of
        # the accumulator's block RAM addresses and rows was a group of the 8x8's failing
        # paths), nor from the issue decision (its route to them was another). A result
        # comes only with a MATMUL queued since cycles before (the array's latency), a
        # LOAD_ACC row only with none since (it issues on a drained array, its rows come
        # from the bus, and no MATMUL issues while it runs): asserted.
        dues = [Signal(name=f"due_lane_{lane}") for lane in range(cols + 1)]
        m.d.sync += [due.eq(queued != 0) for due in dues]
        m.d.sync += Assert(~self.result.valid | dues[cols],
                           "streamer: a result of the array with no MATMUL queued")
        m.d.sync += Assert(~self.load_acc.en | ~dues[cols],
                           "streamer: a LOAD_ACC row with a MATMUL queued")
        m.d.comb += [
            self.acc.addr.eq(Mux(dues[cols], write_addr, self.load_acc.addr)),
            self.acc.accumulate.eq(Mux(dues[cols], oldest.accumulate,
                                       self.load_acc.accumulate)),
            self.acc.en.eq(self.result.valid | self.load_acc.en),
        ]
        for lane in range(cols):
            m.d.comb += self.acc.data[lane].eq(Mux(dues[lane], self.result.payload[lane],
                                                   self.load_acc.data[lane]))
        m.d.comb += [self.load_acc.busy.eq(self.acc.busy),
                     self.load_acc.unseen.eq(self.acc.unseen)]
        # The issue stage starts a LOAD_ACC only on a drained array: no write is ever dropped.
        m.d.sync += Assert(~(self.result.valid & self.load_acc.en),
                           "an accumulator write of LOAD_ACC met a result of the array")

        m.d.sync += queued.eq(queued_next)
        return m
