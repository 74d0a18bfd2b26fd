"""The issue stage: runs the program (start, stop, errors), takes decoded instructions in
program order and hands each to its unit once no hazard holds it back."""

from functools import partial

from amaranth.hdl import Assert, Cat, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..copies import flag_with_next
from ..isa import INSTR_BYTES, ErrorCode
from .error_arbiter import FAULT_SOURCES, ErrorArbiter
from .fetcher import FetchControlSignature
from .load_unit import LoadStatus
from .signatures import (KIND_OPCODES, CountedEvents, Decoded, Fault, HostLinkSignature,
                         NextHeadSignature, PerfCounters, UnitSignature, acc_of, bytes_of,
                         holds, lut_term, overlaps, pair, read_acc_of, spad_of,
                         status_copy, written_spad_of)
from .store_unit import StoreStatus
from .streamer import WRITEBACK_SLOTS, StreamStatus
from .weight_loader import WeightStatus


__all__ = ["IssueStage"]


class IssueStage(wiring.Component):
    """Starts and ends the program, issues its instructions in order, counts the stalls.

    An instruction waits while it would conflict with one that a unit still runs (hazards on
    scratchpad rows, accumulator rows, DRAM bytes, the shadow weights and the requantization
    state), so every program computes what it computes one instruction at a time
    (:mod:`sw.model`). A store starts only once no load before it can still fail.

    Errors are precise: the first failing instruction in program order wins, and the program
    stops with its code and index once every unit is idle.

    A cycle after ``start`` (ignored while a soft reset is pending, so also in the write that
    asks for one) the program registers are checked and latched: a host write to them while
    busy takes effect at the next start. A soft reset (``host.soft_reset``) sets
    ``soft_reset_pending``, which stops the units from starting bus transactions; the NPU
    resets its core once the DMA is idle (:mod:`hw.top`).

    A bus timeout (``bus_timeout``, the watchdog's, :class:`hw.watchdog.BusWatchdog`) ends
    the run at once, whatever is pending: ``BUS_TIMEOUT`` at the oldest instruction waiting
    on the bus (the load unit's or the store unit's, the older of the two if both are busy,
    else the one at ``pc``, which waits for its fetch or, as ``END``, for the reader). The
    units are left as they are, waiting for the slave; until the core reset clears
    ``bus_timeout`` every start ends at once with ``BUS_TIMEOUT`` at 0.

    Attributes
    ----------
    host : Out(HostLinkSignature())
    soft_reset_pending : Out(1)
    fetch : Out(FetchControlSignature())
    decoded : In(stream.Signature(Decoded))
    next_head : In(NextHeadSignature())
        What the head will be in the next cycle: the hazard comparisons are made a cycle
        ahead, between it and what each unit's ranges will be, into registers.
    load, weights, stream, store : Out(UnitSignature(...))
        The links to the load unit, weight loader, streamer and store unit.
    bus_timeout : In(1)
        The bus watchdog expired (high until the core reset).
    """
    def __init__(self, config):
        self.config = config
        super().__init__({
            "host":               Out(HostLinkSignature()),
            "soft_reset_pending": Out(1),
            "fetch":              Out(FetchControlSignature()),
            "decoded":            In(stream.Signature(Decoded)),
            "next_head":          In(NextHeadSignature()),
            "load":               Out(UnitSignature(LoadStatus, fault=True)),
            "weights":            Out(UnitSignature(WeightStatus)),
            "stream":             Out(UnitSignature(StreamStatus)),
            "store":              Out(UnitSignature(StoreStatus, fault=True, halt=True)),
            "bus_timeout":        In(1),
        })

    def elaborate(self, platform):
        m = Module()
        host = self.host
        m.d.sync += host.ended.eq(0)     # set below, in the cycle done or error is set
        # The counters (288 flip-flops) are cleared in the cycle after a reset, by a flip-flop
        # the reset sets (``core_reset_counters``): the stage's reset reached them all, over
        # the die. Nothing counts in that cycle (``running`` is low); a start in it sets them.
        perf = Signal(PerfCounters, reset_less=True)
        cycles = Signal.like(host.cycles, name="cycles", reset_less=True)
        m.d.comb += [host.perf.eq(perf), host.cycles.eq(cycles)]
        counting, counted = Signal(CountedEvents), Signal(CountedEvents)
        counters_reset = Signal(init=1, name="core_reset_counters")
        m.d.sync += counters_reset.eq(0)
        with m.If(counters_reset):
            m.d.sync += [perf.eq(0), cycles.eq(0)]
        load, weights, stream_, store = (self.load.status, self.weights.status,
                                         self.stream.status, self.store.status)

        # ------------------------------------------------------------ run state
        running, running_next = flag_with_next(m, "running")   # between start and done/error
        m.d.sync += Assert(~(counters_reset & running),
                           "issue stage: running in the cycle after a reset")
        halting = Signal()           # a soft reset is pending (the core reset clears it)
        with m.If(host.soft_reset):
            m.d.sync += halting.eq(1)
        # The host's start and program registers (by its AXI4-Lite port, far from here) pass
        # flip-flops of the stage's own: the run begins a cycle after the host's pulse, the
        # check a cycle after the copies. The program registers do not change in the cycle of
        # a start (HostLinkSignature), so both are current then (asserted).
        start_seen, prog_addr_seen, prog_len_seen = Signal(), Signal(32), Signal(32)
        m.d.sync += [start_seen.eq(host.start), prog_addr_seen.eq(host.prog_addr),
                     prog_len_seen.eq(host.prog_len)]

        def bad_program(addr, length):
            return (addr[:4] != 0) | (length == 0) | (addr + length * INSTR_BYTES > (1 << 32))
        program_bad = Signal()
        m.d.sync += program_bad.eq(bad_program(prog_addr_seen, prog_len_seen))
        m.d.sync += Assert(
            ~start_seen | ((prog_addr_seen == host.prog_addr) & (prog_len_seen == host.prog_len)
                           & (program_bad == bad_program(prog_addr_seen, prog_len_seen))),
            "issue stage: a program register changed in the cycle of a start")
        start = Signal()
        begin, begin_next = Signal(), Signal()   # ~running & start, from a flip-flop (below)
        m.d.comb += [
            start.eq(start_seen & ~halting),
            self.soft_reset_pending.eq(halting),
            host.busy.eq(running | halting | start_seen),
            self.store.halt.eq(halting),
        ]
        with m.If(running):
            m.d.sync += cycles.eq(cycles + 1)
        start_while_busy, start_while_busy_next = flag_with_next(m, "start_while_busy")
        m.d.comb += start_while_busy_next.eq(running & (start | start_while_busy))
        # pc == prog_len, and pc + 1 == prog_len compared a cycle ahead (pc == prog_len - 2,
        # set at begin): pc + 1 == prog_len into the ``go`` copy was a path of every run.
        at_prog_end, at_prog_end_next = flag_with_next(m, "at_prog_end")
        at_prog_last, prog_len_minus_two = Signal(), Signal(32)
        m.d.sync += Assert(~running |
                           (at_prog_last == (host.pc == (prog_len_minus_two + 1)[:32])),
                           "issue stage: at_prog_last out of step")
        stopping, stopping_next = flag_with_next(m, "stopping")
        stop_code, stop_pc = Signal(8), Signal(32)

        # ------------------------------------------------------------ hazards
        head = self.decoded.payload
        instr, kind = head.instr, head.kind
        issue = Signal()                 # the decision (below)
        drained = stream_.drained

        def against(name, compare, ours, theirs, follows=None, valid=1, taken=None):
            """A comparison made in the cycle before, into a register: the next head (the
            decoder's entry if it loads one, else this head; ``ours`` of it) against what a
            unit's registers will hold: the head's (``taken`` of it, by default ``ours``) if
            they follow it, else their own (``theirs``). All are compared; ``follows`` (from
            the unit's flip-flops) picks after the comparators, the issue last; ``valid``
            (the next cycle's; a pair if it depends on the issue: if so, if not) folded in."""
            flag = Signal(name=f"{name}_ahead")
            entry, now = ours(self.next_head.entry), ours(head)
            if follows is None:
                on_entry, on_head = compare(entry, theirs), compare(now, theirs)
            else:
                took = (taken or ours)(head)
                on_entry = Mux(follows, compare(entry, took), compare(entry, theirs))
                on_head = Mux(follows, compare(now, took), compare(now, theirs))
            if_issued, if_held = valid if isinstance(valid, tuple) else (valid, valid)
            m.d.sync += flag.eq(Mux(
                issue, if_issued & Mux(self.next_head.load_if_issued, on_entry, on_head),
                if_held & Mux(self.next_head.load_if_held, on_entry, on_head)))
            return flag

        # Each flag holds only for a head of the kinds it stops or of kinds that wait for the
        # whole unit anyway (other kinds' ranges are empty, or their ends 0: Decoded), so the
        # decision ORs all flags (``hazard``), not choosing them by kind as the stalls do.
        spad_vs_stream = against("spad_vs_stream", overlaps, written_spad_of,
                                 pair(stream_.spad), stream_.follows, taken=spad_of)
        spad_vs_weights, spad_vs_load = (
            against(f"spad_vs_{name}", overlaps, spad_of, pair(unit.spad), unit.follows)
            for name, unit in (("weights", weights), ("load", load)))
        acc_vs_store = against("acc_vs_store", overlaps, acc_of, pair(store.acc),
                               store.follows)
        bytes_vs_store = against("bytes_vs_store", overlaps, bytes_of,
                                 (store.lo, store.hi), store.follows)
        # A store waits for MATMULs that still write any of its accumulator rows, and for the
        # writes of them that its first read (the cycle after the issue) would miss, in the
        # accumulator's pipeline: next cycle, this cycle's write and the first of them. Each
        # flag has the slot's or write's next valid flag folded in (a slot's, if the head
        # issues or not; the valid flags sit by the accumulator, across the die; asserted).
        def checked(hit, valid, now, what):
            m.d.sync += Assert(~running | ~self.decoded.valid | (hit == (valid & now)),
                               f"issue stage: the comparison with {what} out of step")
            return hit
        held_after, issued_after = stream_.in_use_after
        slot_hazards = [checked(against(
            f"acc_vs_slot{i}", overlaps, read_acc_of, pair(write.acc), stream_.slot_follows[i],
            taken=acc_of, valid=(Mux(kind.matmul, issued_after[i], held_after[i]),
                                 held_after[i])),
            write.valid, overlaps(read_acc_of(head), pair(write.acc)), f"writeback slot {i}")
            for i, write in enumerate(stream_.writes)]
        unseen_next = [stream_.writing, stream_.unseen[0]]
        assert len(unseen_next) == len(stream_.unseen)
        unseen_hazards = [checked(against(f"acc_vs_unseen{i}", holds, read_acc_of, (write.addr,),
                                          valid=write.valid),
                                  unseen.valid, holds(read_acc_of(head), (unseen.addr,)),
                                  f"unseen write {i}")
                          for i, (write, unseen) in enumerate(zip(unseen_next, stream_.unseen))]
        store_raw = Cat(*slot_hazards, *unseen_hazards).any()
        store_dram_hazard = store.busy & bytes_vs_store

        # Why the head waits, for the stall counters: for each kind of instruction (the
        # decoder's flags, at most one set), the units it waits for, by their status alone
        # and by the hazard flags.
        status_waits = {   # kind: (load, array, store)
            "end":        (load.busy | self.fetch.reader_busy, weights.busy | ~drained,
                           store.busy),
            "load_spad":  (load.busy, 0, 0),
            "load_acc":   (load.busy, ~drained, store.busy),
            "load_quant": (load.busy, 0, store.busy),
            "preload":    (0, weights.busy, 0),
            "matmul":     (load.to_acc, ~stream_.free | stream_.full | weights.busy, 0),
            # No load before a store may still fail.
            "store":      (load.busy, 0, store.busy),
        }
        hazard_waits = {
            "load_spad":  (0, (stream_.busy & spad_vs_stream) |
                           (weights.busy & spad_vs_weights), store_dram_hazard),
            "preload":    (load.to_spad & spad_vs_load, 0, 0),
            "matmul":     (load.to_spad & spad_vs_load, 0, store.busy & acc_vs_store),
            "store":      (0, store_raw, 0),
        }
        waits = {name: tuple(Value.cast(a) | b for a, b in zip(terms, hazard_waits.get(
                     name, (0, 0, 0)))) for name, terms in status_waits.items()}
        hazard = Cat(*[Value.cast(t) for terms in hazard_waits.values() for t in terms]).any()
        assert waits.keys() == KIND_OPCODES.keys()
        blocked_load, blocked_array, blocked_store = (
            Signal(name=f"blocked_{unit}") for unit in ("load", "array", "store"))
        for i, blocked in enumerate((blocked_load, blocked_array, blocked_store)):
            m.d.comb += blocked.eq(Cat(*[kind[name] & terms[i]
                                        for name, terms in waits.items()]).any())

        # ------------------------------------------------------------ issue
        # The decision: the run may issue (``go``, no ``refetch``), no hazard flag holds, and
        # the head's kind while valid and not faulty (the decoder's ``issuable``) waits for
        # none of its units by their status, each from copies made for it. Written as a tree
        # of LUT-sized terms kept by synthesis (``lut_term``; as one expression ABC made six
        # LUTs of it before the head's enables, now three), asserted equal to the tables
        # above, as the chain below (errors, stalls) is. ``advance``: an issue of anything
        # but END, the pc's enable (``issue & ~kind.end`` into the pc was a path of the 8x8).
        go = status_copy(m, "issue_go",
                         running & ~stopping & ~start_while_busy & ~at_prog_end,
                         running_next & ~stopping_next & ~start_while_busy_next &
                         ~at_prog_end_next)
        issuable, advance, refetch = self.next_head.issuable, Signal(), self.fetch.refetch
        lut = partial(lut_term, m)
        (slot0, slot1), (hit0, hit1) = slot_hazards, unseen_hazards
        busy_w = weights.busy
        clear = lut("clear", ~(lut("h_array", (stream_.busy & spad_vs_stream) |
                                              (weights.busy & spad_vs_weights)) |
                               lut("h_store", store_dram_hazard | (store.busy & acc_vs_store) |
                                   ~go) |
                               lut("h_load", (load.to_spad & spad_vs_load) | slot0) |
                               lut("h_raw", slot1 | hit0 | hit1 | refetch)))
        ready_a = lut("ready_a", Cat(
            lut("k_spad", (issuable.load_spad & ~load.busy) | (issuable.preload & ~busy_w)),
            lut("k_ls", (issuable.store | issuable.load_quant) & ~load.busy & ~store.busy),
            lut("k_acc", issuable.load_acc & ~load.busy & drained & ~store.busy)).any())
        k_mm = lut("k_mm", issuable.matmul & ~load.to_acc & stream_.free & ~stream_.full)
        ready_b = lut("ready_b", ~busy_w & (k_mm | (~store.busy & lut(
            "k_end", issuable.end & ~load.busy & ~self.fetch.reader_busy & drained))))
        m.d.comb += [issue.eq(clear & (ready_a | ready_b)),
                     advance.eq(clear & (ready_a | (~busy_w & k_mm)))]
        for flag, kinds in ((issue, waits), (advance, [k for k in waits if k != "end"])):
            m.d.sync += Assert(flag == (go & ~refetch & ~hazard & Cat(*[
                issuable[name] & ~Cat(*status_waits[name]).any() for name in kinds]).any()),
                "issue stage: the decision's terms out of step")
        m.d.sync += Assert(advance == (issue & ~kind.end), "issue stage: advance out of step")
        decided, issue_fault = Signal(), Signal(Fault)
        m.d.comb += issue_fault.pc.eq(host.pc)

        def raise_error(code):
            m.d.comb += [issue_fault.valid.eq(1), issue_fault.code.eq(code)]

        with m.If(running & ~stopping & ~self.fetch.refetch):
            with m.If(start_while_busy):
                raise_error(ErrorCode.START_BUSY)
            with m.Elif(at_prog_end):
                raise_error(ErrorCode.PROGRAM)
            with m.Elif(~self.decoded.valid):
                m.d.comb += counting.stall_fetch.eq(1)
            with m.Elif(kind.faulty):
                with m.If(head.bus_error):
                    raise_error(ErrorCode.BUS_READ)
                with m.Else():
                    raise_error(head.check)
            with m.Elif(blocked_load | blocked_store | blocked_array):
                with m.If(blocked_load):
                    m.d.comb += counting.stall_load.eq(1)
                with m.Elif(blocked_store):
                    m.d.comb += counting.stall_store.eq(1)
                with m.Else():
                    m.d.comb += counting.stall_array.eq(1)
            with m.Else():
                m.d.comb += decided.eq(1)
        m.d.sync += Assert(issue == decided, "issue stage: the decision's flags out of step")
        m.d.comb += self.decoded.ready.eq(issue)

        units = {
            self.load:    ("load_spad", "load_acc", "load_quant"),
            self.weights: ("preload",),
            self.stream:  ("matmul",),
            self.store:   ("store",),
        }
        for unit, kinds in units.items():
            m.d.comb += [
                unit.cmd.valid.eq(issue & Cat(*[kind[name] for name in kinds]).any()),
                unit.cmd.payload.instr.eq(instr),
                unit.cmd.payload.pc.eq(host.pc),
                unit.cmd.payload.lo.eq(head.lo),
                unit.cmd.payload.hi.eq(head.hi),
                unit.cmd.payload.spad.eq(head.spad),
                unit.cmd.payload.acc.eq(head.acc),
            ]
        with m.If(issue):
            m.d.comb += counting.instructions.eq(1)
            with m.If(kind.end):
                m.d.comb += running_next.eq(0)
                m.d.sync += [host.done.eq(1), host.ended.eq(1)]
        with m.If(advance):
            m.d.sync += [host.pc.eq(host.pc + 1), at_prog_last.eq(host.pc == prog_len_minus_two)]
            m.d.comb += at_prog_end_next.eq(at_prog_last)
        # Stalls and issues count a cycle late, from flags registered here: the decision and
        # its blockers reached the counters' enables, spread over the die, on every run.
        m.d.sync += counted.eq(counting)
        for name in data.Layout.cast(CountedEvents).members:
            with m.If(counted[name]):
                m.d.sync += perf[name].eq(perf[name] + 1)
        with m.If(stream_.busy):
            m.d.sync += perf.array_rows.eq(perf.array_rows + 1)
        # A row's MACs come two cycles after it (0 after none).
        m.d.sync += perf.useful_macs.eq(perf.useful_macs + stream_.macs)

        m.d.comb += [
            self.fetch.begin.eq(status_copy(m, "fetch_begin", begin, begin_next)),
            # Not once END is at the head (the last word needed; the reader's command must
            # not start in the cycle END issues), from the head, not the issue; running and
            # not stopping from a copy by the fetcher (stopping's route led a group).
            self.fetch.enable.eq(status_copy(m, "fetch_go", running & ~stopping,
                                             running_next & ~stopping_next) &
                                 ~self.next_head.end_at_head),
            self.fetch.halt.eq(halting),
            # Read in the cycle of begin: the copies of the host's registers being latched.
            self.fetch.prog_addr.eq(prog_addr_seen),
            self.fetch.prog_len.eq(prog_len_seen),
            self.fetch.pc.eq(host.pc),
            self.fetch.store_issued.eq(self.store.cmd.valid),
            self.fetch.store_lo.eq(head.lo),
            self.fetch.store_hi.eq(head.hi),
            self.fetch.store_busy.eq(store.busy),
        ]
        # The fetcher's program end is stale only in the cycle of begin (not while running).
        m.d.sync += Assert(~(self.fetch.begin & self.fetch.store_issued),
                           "issue stage: a store in the cycle of begin")
        # The fetcher refetches from pc as registered a cycle before: nothing issues while
        # ``refetch`` is high, and in its first cycle (pc moved) the store unit is busy.
        pc_moved = Signal()
        m.d.sync += pc_moved.eq(advance)
        m.d.sync += Assert(~(pc_moved & self.fetch.refetch & ~store.busy),
                           "issue stage: the fetcher may refetch from a pc that just moved")

        # ------------------------------------------------------------ errors, stop
        m.submodules.errors = errors = ErrorArbiter()
        m.d.comb += [
            errors.pending.valid.eq(stopping), errors.pending.code.eq(stop_code),
            errors.pending.pc.eq(stop_pc),
            errors.faults.eq(Cat(issue_fault, self.load.fault, self.store.fault)),
            errors.load_issued.eq(self.load.cmd.valid),
            errors.store_issued.eq(self.store.cmd.valid),
            errors.record.eq(running),
        ]
        assert FAULT_SOURCES == ("issue", "load", "store")
        with m.If(running):
            m.d.comb += stopping_next.eq(errors.first.valid)
            m.d.sync += [stop_code.eq(errors.first.code), stop_pc.eq(errors.first.pc)]
        all_idle = (~load.busy & ~weights.busy & drained & ~store.busy &
                    ~self.fetch.reader_busy & ~self.fetch.refetch)
        with m.If(running & stopping & all_idle):
            m.d.comb += [running_next.eq(0), stopping_next.eq(0)]
            m.d.sync += [host.error.eq(1), host.error_code.eq(stop_code),
                         host.error_pc.eq(stop_pc), host.ended.eq(1)]

        # ------------------------------------------------------------ bus timeout
        # The slave stopped answering: no unit waiting on it can finish, so the run ends now
        # (over any end above) at the oldest instruction waiting on the bus.
        timed_out = running & self.bus_timeout
        load_older = ~store.busy | ~errors.store_newer
        timeout_pc = Mux(load.busy & load_older, self.load.fault.pc,
                         Mux(store.busy, self.store.fault.pc, host.pc))
        with m.If(timed_out):
            m.d.comb += [running_next.eq(0), stopping_next.eq(0)]
            m.d.sync += [host.done.eq(0), host.error.eq(1),
                         host.error_code.eq(ErrorCode.BUS_TIMEOUT),
                         host.error_pc.eq(timeout_pc), host.ended.eq(1)]

        # ------------------------------------------------------------ start
        # ``begin`` (not running, a start) from a flip-flop, the fetcher's from a copy by it:
        # it restarts the fetcher and the decoder's queue (some 200 flip-flops; running's
        # routes, then one flip-flop's, were long paths). Loaded with its next value: a start
        # seen in the next cycle, no soft reset pending then, and not running then (not now,
        # or this cycle's END or stop ends the run: no start follows a start within four
        # cycles, HostLinkSignature).
        running_after = running & ~(issue & kind.end) & ~(stopping & all_idle) & ~timed_out
        m.d.comb += begin_next.eq(host.start & ~halting & ~host.soft_reset & ~running_after)
        m.d.sync += begin.eq(begin_next)
        m.d.sync += Assert(begin == (~running & start), "issue stage: begin out of step")
        with m.If(begin):
            m.d.sync += [
                host.done.eq(0), host.error.eq(0), host.error_code.eq(0),
                host.error_pc.eq(0), host.pc.eq(0), cycles.eq(1), perf.eq(0),
                prog_len_minus_two.eq(prog_len_seen - 2), at_prog_last.eq(prog_len_seen == 1),
            ]
            m.d.comb += [at_prog_end_next.eq(prog_len_seen == 0), stopping_next.eq(0),
                         host.started.eq(1)]
            with m.If(self.bus_timeout):
                m.d.sync += [host.error.eq(1), host.error_code.eq(ErrorCode.BUS_TIMEOUT),
                             host.ended.eq(1)]
            with m.Elif(program_bad):
                m.d.sync += [host.error.eq(1), host.error_code.eq(ErrorCode.PROGRAM),
                             host.ended.eq(1)]
            with m.Else():
                m.d.comb += running_next.eq(1)
        return m
