"""The layouts and signatures the controller's blocks talk through, defined once."""

from amaranth.hdl import Assert, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..dma import BlockCommand, ReadCommand
from ..isa import Instruction, Opcode, QuantMode


__all__ = ["PerfCounters", "CountedEvents", "HostLinkSignature", "Fault", "RowRange", "Issued",
           "UnitSignature", "ReaderSignature", "WriterSignature", "QuantState", "CommitSignature",
           "status_copy", "KIND_OPCODES", "Kind", "Decoded",
           "decoded_slices", "Issuable", "NextHeadSignature"]


class PerfCounters(data.Struct):
    """The performance counters (``hw.isa.Reg.PERF_*``), 32 bits each, cleared at start."""
    array_rows:    32   #: activation rows streamed into the array (R x C MAC slots each)
    useful_macs:   32   #: MACs on real operands: rows x the MATMUL's ``k_width x n_width``
    stall_fetch:   32   #: issue cycles with no instruction fetched yet
    stall_load:    32   #: issue cycles waiting for the load unit
    stall_store:   32   #: issue cycles waiting for the store unit
    stall_array:   32   #: issue cycles waiting for the array (streamer, weights, drain)
    instructions:  32   #: instructions issued (END included)


class CountedEvents(data.Struct):
    """The :class:`PerfCounters` that the issue stage counts a cycle late: a flag each, set
    in the cycle of the event."""
    stall_fetch:   1
    stall_load:    1
    stall_store:   1
    stall_array:   1
    instructions:  1


def HostLinkSignature():
    """The link between the host registers and the controller, as the controller sees it.

    ``start`` and ``soft_reset`` are one-cycle pulses. ``prog_addr`` and ``prog_len`` are
    the registers as the host wrote them, unchanged since at least the cycle before a
    ``start`` (the host's writes end three before); the controller latches them a cycle after
    ``start``. ``busy`` is high from the cycle after
    ``start`` to done or error, and while a soft reset is pending. ``started`` pulses in
    the cycle a start begins a run (the cycle after ``start``; also a run that fails at once
    with ``PROGRAM``), ``ended`` in the first cycle of ``done`` or ``error``: the host's
    pending interrupts (``Reg.IRQ_PENDING``) are cleared by the one and set by the other.
    """
    return wiring.Signature({
        "start":      In(1),
        "soft_reset": In(1),
        "prog_addr":  In(32),
        "prog_len":   In(32),
        "busy":       Out(1),
        "started":    Out(1),
        "ended":      Out(1),
        "done":       Out(1),
        "error":      Out(1),
        "error_code": Out(8),
        "error_pc":   Out(32),
        "pc":         Out(32),
        "cycles":     Out(64),
        "perf":       Out(PerfCounters),
    })


class Fault(data.Struct):
    """An error raised in this cycle: its :class:`hw.isa.ErrorCode` and the index of the
    instruction that failed."""
    valid: 1
    code:  8
    pc:    32


class RowRange(data.Struct):
    """Local memory rows ``[lo, hi)``: the decoder sums the end once, so that a hazard check
    is two comparisons."""
    lo: 16
    hi: 17


class Issued(data.Struct):
    """An instruction as the issue stage hands it to a unit: the instruction, its index, the
    DRAM bytes ``[lo, hi)`` it touches (zero for instructions that touch none) and the
    scratchpad and accumulator rows it touches (empty ranges for none)."""
    instr: Instruction
    pc:    32
    lo:    32
    hi:    33
    spad:  RowRange
    acc:   RowRange


def UnitSignature(status, *, fault=False, halt=False):
    """The link from the issue stage to one unit, as the issue stage sees it.

    ``cmd`` is valid for one cycle when the unit's instruction issues; ``status`` is what the
    unit holds (for the hazard checks); ``fault`` the error the unit raises, if it can raise
    any; ``halt``: a soft reset is pending, so start no new bus transaction.
    """
    members = {
        "cmd":    Out(stream.Signature(Issued, always_ready=True)),
        "status": In(status),
    }
    if fault:
        members["fault"] = In(Fault)
    if halt:
        members["halt"] = Out(1)
    return wiring.Signature(members)


def status_copy(m, name, original, value_next, *, init=None):
    """A flip-flop that holds what ``original`` holds, loaded with ``value_next`` (the value
    ``original`` takes at the next edge; asserted equal every cycle): the unit's status as
    the issue stage reads it. The issue decision reads it and drives hundreds of enables; a
    status flip-flop that the unit's own logic reads too is placed by that logic, often far
    from the issue stage, and its route came before the decision (the 4x4's longest paths:
    the streamer's ``last`` into the decoder's head and front registers). The copy serves
    only the issue stage, so it can sit there; its name (``status_copy_*``) keeps Yosys from
    merging it with the original (fpga/flow.py's ``KEEP_APART``). ``init``: what
    ``original`` holds after a reset, if it is not a flip-flop of its own."""
    if init is None:
        init = original.init if isinstance(original, Signal) else 0
    copy = Signal(Value.cast(original).shape(), name=f"status_copy_{name}", init=init)
    m.d.sync += copy.eq(value_next)
    m.d.sync += Assert(copy == original, f"the issue stage's copy of {name} out of step")
    return copy


def lut_term(m, name, value):
    """``value`` (at most four or five inputs: one LUT) as a net of its own, named
    ``lut_term_<name>``: synthesis keeps it (fpga/flow.py's ``KEEP_APART``), so that logic
    written as a tree of such terms is mapped as that tree, not rebuilt deeper by ABC."""
    term = Signal(name=f"lut_term_{name}")
    m.d.comb += term.eq(value)
    return term


def ReaderSignature(row_bits):
    """A share of the DMA reader, as its user sees it: a block command, the rows it reads
    (one per cycle, never stalled), and ``done`` (with ``error`` on a bus error) at its end."""
    return wiring.Signature({
        "cmd":   Out(stream.Signature(ReadCommand)),
        "row":   In(stream.Signature(row_bits, always_ready=True)),
        "done":  In(1),
        "error": In(1),
    })


def WriterSignature(row_bits):
    """The DMA writer, as its user sees it: a block command, then its rows, then ``done``
    (with ``error`` on a bus error)."""
    return wiring.Signature({
        "cmd":   Out(stream.Signature(BlockCommand)),
        "row":   Out(stream.Signature(row_bits)),
        "done":  In(1),
        "error": In(1),
    })


def QuantState(cols):
    """The requantization state ``LOAD_QUANT`` sets and ``STORE_Q`` uses. ``multiplier`` is
    DRAM row 0: the INT32 multipliers, or in float mode the float32 scales' bit patterns."""
    return data.StructLayout({
        "mode":       QuantMode,
        "multiplier": data.ArrayLayout(signed(32), cols),
        "shift":      data.ArrayLayout(signed(6), cols),
        "zero_point": signed(9),
        "act_min":    signed(8),
        "act_max":    signed(8),
    })


def CommitSignature():
    """Between the weight loader and the streamer, as the weight loader sees it: ``pending``,
    a complete weight tile waits in the shadow registers; ``take``, the MATMUL that commits
    it issues (the streamer then marks its first row)."""
    return wiring.Signature({
        "pending": Out(1),
        "take":    In(1),
    })


#: The opcodes of each :class:`Kind` flag: what the issue stage asks of an instruction.
KIND_OPCODES = {
    "end":        (Opcode.END,),
    "load_spad":  (Opcode.LOAD_SPAD,),
    "load_acc":   (Opcode.LOAD_ACC,),
    "load_quant": (Opcode.LOAD_QUANT,),
    "preload":    (Opcode.PRELOAD,),
    "matmul":     (Opcode.MATMUL,),
    "store":      (Opcode.STORE, Opcode.STORE_Q),
}


class Kind(data.Struct):
    """An instruction's opcode decoded before the queue (one flag of :data:`KIND_OPCODES`
    at most), and ``faulty``: its fetch failed or its check did not pass. The issue stage's
    decision then starts from these flip-flops, not from comparisons of the opcode."""
    end:        1
    load_spad:  1
    load_acc:   1
    load_quant: 1
    preload:    1
    matmul:     1
    store:      1
    faulty:     1


class Decoded(data.Struct):
    """A decoded instruction: the operand check's :class:`~hw.isa.ErrorCode` (0 when it
    passes), the DRAM bytes ``[lo, hi)`` it touches (exact whenever the check passes, when
    ``hi <= 2**32``), and whether its fetch failed instead."""
    instr:     Instruction
    lo:        32
    hi:        33
    spad:      RowRange   #: the scratchpad rows it touches
    acc:       RowRange   #: the accumulator rows it touches
    #: ``spad.hi`` for a LOAD_SPAD, ``acc.hi`` for a STORE or STORE_Q, else 0 (the range
    #: empty): the ends the issue stage compares with the streamer's rows, so that its
    #: flags hold only for the kinds they stop
    written_spad_hi: 17
    read_acc_hi: 17
    check:     8
    bus_error: 1
    kind:      Kind


# The ranges the issue stage compares, as (lo, hi) pairs of [lo, hi).
def overlaps(a, b):
    return (a[0] < b[1]) & (b[0] < a[1])


def holds(a, b):                 # the range a holds row b[0]
    return (a[0] <= b[0]) & (b[0] < a[1])


def pair(rows):                  # a RowRange
    return (rows.lo, rows.hi)


def spad_of(entry):              # of a Decoded entry: its scratchpad rows, ...
    return pair(entry.spad)


def acc_of(entry):               # ... its accumulator rows, its DRAM bytes, ...
    return pair(entry.acc)


def bytes_of(entry):
    return (entry.lo, entry.hi)


def written_spad_of(entry):      # ... a LOAD_SPAD's rows (empty for other kinds), ...
    return (entry.spad.lo, entry.written_spad_hi)


def read_acc_of(entry):          # ... a store's rows (empty for other kinds)
    return (entry.acc.lo, entry.read_acc_hi)


def decoded_slices(*groups, widest=33):
    """The bit ranges ``(start, stop)`` of :class:`Decoded` that ``groups`` of its fields
    take, a group wider than ``widest`` bits cut into pieces of at most that many."""
    layout = data.Layout.cast(Decoded)
    assert sorted(sum(groups, ())) == sorted(name for name, _ in layout)
    ranges = []
    for group in groups:
        start = min(layout[name].offset for name in group)
        stop = max(layout[name].offset + layout[name].width for name in group)
        assert stop - start == sum(layout[name].width for name in group), group
        pieces = -(-(stop - start) // widest)
        ranges += [(start + (stop - start) * k // pieces, start + (stop - start) * (k + 1) //
                    pieces) for k in range(pieces)]
    return tuple(ranges)


#: One flag per :data:`KIND_OPCODES` kind: :class:`NextHeadSignature`'s ``issuable``.
Issuable = data.StructLayout({name: 1 for name in KIND_OPCODES})


def NextHeadSignature():
    """What the decoder's head register takes at the next edge: ``entry`` when it loads
    (else it keeps what it holds), so that the issue stage can compare the next head with
    its units a cycle ahead. It loads if ``load_if_issued`` and the head issues (``ready``),
    or if ``load_if_held`` and it does not: both from flip-flops, so that the issue stage's
    decision, late in its cycle, chooses between them last.
    ``end_at_head``: the head holds an END (``decoded.valid`` and its ``kind.end``), from a
    flip-flop of its own beside the head's valid flags. ``issuable``: the head's kind flags
    while it is valid and not faulty (0 otherwise), from flip-flops of their own, for the
    issue decision only."""
    return wiring.Signature({"load_if_issued": Out(1), "load_if_held": Out(1),
                             "entry": Out(Decoded), "end_at_head": Out(1),
                             "issuable": Out(Issuable)})
