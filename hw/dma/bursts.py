"""What the DMA's reader and writer share: the block command, and the geometry of rows and
bursts on the bus."""

from functools import partial

from amaranth.hdl import Cat, Const, Signal, Value
from amaranth.lib import data


__all__ = ["BlockCommand", "ReadCommand", "MAX_READS_OUTSTANDING", "ceil_div", "row_beats",
           "row_geometry", "next_burst", "geometry_for"]


#: Read bursts the reader has asked for (AR accepted) and not yet received in full, at most.
#: The reader takes every R beat the cycle it comes (``rready`` is never low: a row leaves its
#: one-row buffer the cycle after its last beat, to a consumer that is always ready), so its
#: buffer needs no bound to be safe; the bound is the depth of the queue of burst lengths that
#: the ``rlast`` check compares against, and what a slave must be able to queue. Eight keeps
#: the R channel busy with one-beat bursts (instruction fetch on a bus of 128 bits or more,
#: narrow rows) while a read's round trip, address accepted to first beat, is at most seven
#: cycles, and it is the simulated DRAM's read queue depth (``AR_DEPTH`` in
#: sim/hdl/npu_axi_dram.v), so that DRAM never holds an address back.
MAX_READS_OUTSTANDING = 8


class BlockCommand(data.Struct):
    """A 2-D strided block: row ``r`` is ``row_bytes`` bytes at ``addr + r * stride``."""
    addr:      32
    rows:      16
    row_bytes: 16
    stride:    32


class ReadCommand(data.Struct):
    """A :class:`BlockCommand` for the reader, with its first row's beats on the bus
    (:func:`row_beats` of ``addr`` and ``row_bytes``) and its second row's address
    (``addr + stride``, modulo 2**32), which the requester makes from its own registers
    before it asks: the reader needs them in the cycle after the command, and sums after
    the requesters' arbiter were long paths. The reader asserts them."""
    addr:      32
    rows:      16
    row_bytes: 16
    stride:    32
    beats:     17
    next_addr: 32


def ceil_div(a, b):
    return -(-a // b)


def row_beats(bus_bytes, addr, row_bytes):
    """The beats of a row of ``row_bytes`` at ``addr`` on a bus of ``bus_bytes``: of
    Amaranth values (only ``addr``'s low bits are read), or of integers."""
    lg = bus_bytes.bit_length() - 1
    if isinstance(addr, int) and isinstance(row_bytes, int):
        return (addr % bus_bytes + row_bytes + bus_bytes - 1) >> lg
    return (addr[:lg] + row_bytes + bus_bytes - 1) >> lg


def row_geometry(bus_bytes, m, addr, row_bytes, name):
    """Aligned first beat address, byte offset and beat count of a row."""
    lg = bus_bytes.bit_length() - 1
    offset = Signal(range(bus_bytes), name=f"{name}_offset")
    beats = Signal(17, name=f"{name}_beats")
    m.d.comb += [
        offset.eq(addr[:lg]),
        beats.eq(row_beats(bus_bytes, addr, row_bytes)),
    ]
    aligned = Cat(Const(0, lg), addr[lg:])
    return aligned, offset, beats


def next_burst(bus_bytes, m, beat_addr, beats_left, name):
    """The next burst of a row at the bus-aligned ``beat_addr`` with ``beats_left`` beats
    to go: the rest of the row, cut at 4 KiB and at 256 beats.

    Returns ``(length, length_minus_one, last, next_addr, next_left)``: the burst's beats
    (and the AXI ``len`` field), whether it ends the row, and the beat address and beats
    left after it. Each of the three possible
    lengths has its own sums, formed from the registers side by side; only the choice
    between them waits for the comparison (one carry chain), not another sum after it.
    """
    lg = bus_bytes.bit_length() - 1
    page = 4096 >> lg                    # beats in 4 KiB
    into_page = beat_addr[lg:12]         # beats of this 4 KiB before beat_addr
    to_boundary = Signal(range(page + 1), name=f"{name}_to_4k")
    m.d.comb += to_boundary.eq(page - into_page)
    # beats_left <= to_boundary, i.e. beats_left + into_page <= page (a power of two).
    narrow = len(Value.cast(beats_left))     # beats_left < 2**narrow
    if (1 << narrow) < page:
        # A row of few beats (the reader's and writer's): with into_page = high * 2**narrow +
        # low, the sum passes the page only when high is all ones and low + beats_left >
        # 2**narrow. Two small functions of the registers, no carry chain (the sum's chain
        # and compare, before the burst's end, were paths of the reader's address side).
        high, low = into_page[narrow:], into_page[:narrow]
        within_page = ~high.all() | ((low + beats_left) <= (1 << narrow))
    else:
        reach = Signal(18, name=f"{name}_reach")
        m.d.comb += reach.eq(beats_left + into_page)
        within_page = ((reach >> (12 - lg)) == 0) | (reach == page)
    within_cap = ((beats_left >> 8) == 0) | (beats_left == 256)
    last = Signal(name=f"{name}_burst_last")
    page_first = Signal(name=f"{name}_burst_to_4k")     # else cut at 256 beats
    m.d.comb += [last.eq(within_page & within_cap),
                 page_first.eq(into_page >= page - 256)]     # to_boundary <= 256

    length = Signal(range(257), name=f"{name}_burst_len")
    length_minus_one = Signal(8, name=f"{name}_burst_len_minus_one")
    next_addr = Signal(32, name=f"{name}_next_beat_addr")
    next_left = Signal(17, name=f"{name}_next_beats_left")
    # The three ends: the row's, the next 4 KiB boundary, 256 beats on.
    row_end = (beat_addr + (beats_left << lg))[:32]
    page_end = Cat(Const(0, 12), beat_addr[12:] + 1)
    cap_end = (beat_addr + (256 << lg))[:32]
    with m.If(last):
        m.d.comb += [length.eq(beats_left), length_minus_one.eq(beats_left - 1),
                     next_addr.eq(row_end), next_left.eq(0)]
    with m.Elif(page_first):
        # to_boundary - 1 = (page - 1) - into_page; beats_left - to_boundary =
        # beats_left + (into_page - page), and into_page - page is into_page with a
        # sign bit on top.
        m.d.comb += [length.eq(to_boundary), length_minus_one.eq(~into_page),
                     next_addr.eq(page_end),
                     next_left.eq(beats_left + Cat(into_page, Const(1, 1)).as_signed())]
    with m.Else():
        m.d.comb += [length.eq(256), length_minus_one.eq(255), next_addr.eq(cap_end),
                     next_left.eq(beats_left - 256)]
    return length, length_minus_one, last, next_addr, next_left


def geometry_for(bus_bytes, owner=None):
    """``(row_geometry, next_burst)`` for a bus of ``bus_bytes``, each called as
    ``f(m, ...)``: ``owner``'s ``_row_geometry`` and ``_next_burst`` (the DMA passes itself,
    so that the formal/ mutants that override them reach its reader and writer), or without
    one, the functions above."""
    if owner is not None:
        return owner._row_geometry, owner._next_burst
    return partial(row_geometry, bus_bytes), partial(next_burst, bus_bytes)
