"""The DMA reader's queue of the bursts it asked for: a first-in first-out queue whose oldest
entry is a flip-flop."""

from amaranth.hdl import Assert, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


__all__ = ["LengthQueue"]


class LengthQueue(wiring.Component):
    """A first-in first-out queue of ``depth`` 9-bit entries whose oldest is a flip-flop
    (``head``), with what it will hold after the edge (``r_rdy_next``; ``w_to_head``: the
    entry written now, else ``head_next``, the entry below it or itself): the entries shift
    down as the oldest leaves, and one written goes to the first free place. As
    :class:`amaranth.lib.fifo.SyncFIFO` (an entry written is readable in the next cycle),
    but its head is not a read of distributed RAM and its flags are flip-flops. (No library
    queue has ``head_next``.) ``head_next`` leaves out the entry written so that a user can
    make its own copy of what goes to the head from the entry's terms rather than after
    them (the DMA reader's burst length was its address side's sums before the data
    side's flip-flops)."""
    def __init__(self, depth):
        self.depth = depth
        super().__init__({
            "w_data": In(9), "w_en": In(1), "w_rdy": Out(1),
            "head": Out(9), "head_next": Out(9), "w_to_head": Out(1), "r_en": In(1),
            "r_rdy": Out(1), "r_rdy_next": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self.depth
        entries = [Signal(9, name=f"entry_{i}", reset_less=True) for i in range(depth)]
        level = Signal(range(depth + 1))
        # The level one-hot too (bit i: level == i), so that a write's place is one bit
        # chosen by the pop, not the level minus the pop compared (asserted).
        at = Signal(depth + 1, init=1)
        pop = self.r_en & self.r_rdy
        push = self.w_en & self.w_rdy
        kept = []                    # each entry after the edge, but for a write into it
        for i, entry in enumerate(entries):
            kept.append(Mux(pop, entries[i + 1] if i + 1 < depth else entry, entry))
            after = Signal(9, name=f"entry_{i}_next")
            m.d.comb += after.eq(kept[i])
            with m.If(push & Mux(pop, at[i + 1], at[i])):
                m.d.comb += after.eq(self.w_data)
            m.d.sync += entry.eq(after)
        with m.If(push & ~pop):
            m.d.sync += at.eq(at << 1)
        with m.If(pop & ~push):
            m.d.sync += at.eq(at >> 1)
        m.d.sync += Assert(at == (1 << level)[:depth + 1],
                           "length queue: one-hot level out of step")
        # Not empty and not full, in flip-flops beside the level (their users are the
        # reader's beat enables and its address valid).
        level_next = Signal.like(level)
        nonempty = Signal()
        room = Signal(init=1)
        m.d.comb += level_next.eq(level + push - pop)
        m.d.sync += [level.eq(level_next), nonempty.eq(level_next != 0),
                     room.eq(level_next != depth)]
        m.d.comb += [
            self.head.eq(entries[0]), self.head_next.eq(kept[0]),
            self.w_to_head.eq(push & Mux(pop, at[1], at[0])),
            self.r_rdy.eq(nonempty), self.r_rdy_next.eq(level_next != 0), self.w_rdy.eq(room),
        ]
        m.d.sync += Assert((nonempty == (level != 0)) & (room == (level != depth)),
                           "length queue: flags out of step with the level")
        return m
