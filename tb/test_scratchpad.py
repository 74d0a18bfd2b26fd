"""Unit tests of :class:`hw.scratchpad.Scratchpad`: rows written and read back, with one
two cycles of read latency (:data:`hw.bram.READ_LATENCY`)."""

import numpy as np

from hw.scratchpad import Scratchpad
from sim.amaranth_sim import run_simulation


def test_write_then_read_every_row():
    """Random rows written to every address read back exactly, whatever the order."""
    seed = 0x5B01
    rng = np.random.default_rng(seed)
    depth, row_bytes = 16, 5
    dut = Scratchpad(depth=depth, row_bytes=row_bytes)
    contents = [int.from_bytes(rng.bytes(row_bytes), "little") for _ in range(depth)]

    async def testbench(ctx):
        ctx.set(dut.write.en, 1)
        for addr in rng.permutation(depth):
            ctx.set(dut.write.addr, int(addr))
            ctx.set(dut.write.data, contents[addr])
            await ctx.tick()
        ctx.set(dut.write.en, 0)
        ctx.set(dut.act.en, 1)
        order = [int(a) for a in rng.permutation(depth)]
        for i, addr in enumerate(order + [0]):
            ctx.set(dut.act.addr, addr)
            await ctx.tick()
            if i >= 1:               # the row read in the cycle before is there now
                got, want = ctx.get(dut.act.data), contents[order[i - 1]]
                assert got == want, \
                    f"seed {seed}: row {order[i - 1]} reads {got:#x}, wrote {want:#x}"

    run_simulation(dut, testbench)


def test_read_latency_is_two_cycles():
    """act.data changes only at the second edge after act.en, and holds while act.en is
    low (what it held the cycle before is still there one cycle after en goes low)."""
    seed = 0x5B02
    rng = np.random.default_rng(seed)
    depth, row_bytes = 8, 4
    dut = Scratchpad(depth=depth, row_bytes=row_bytes)
    contents = [int.from_bytes(rng.bytes(row_bytes), "little") for _ in range(depth)]

    async def testbench(ctx):
        ctx.set(dut.write.en, 1)
        for addr, value in enumerate(contents):
            ctx.set(dut.write.addr, addr)
            ctx.set(dut.write.data, value)
            await ctx.tick()
        ctx.set(dut.write.en, 0)
        held = ctx.get(dut.act.data)            # en is 1 when undriven: it read row 0
        assert held != contents[3]
        ctx.set(dut.act.addr, 3)
        ctx.set(dut.act.en, 1)
        await ctx.tick()
        ctx.set(dut.act.en, 0)
        assert ctx.get(dut.act.data) == held, "read data came after one cycle"
        await ctx.tick()
        assert ctx.get(dut.act.data) == contents[3]
        # Back-to-back reads: a new row every cycle, each two cycles after its address.
        ctx.set(dut.act.en, 1)
        previous = 3
        for addr in (5, 0, 7, 7, 1):
            before = ctx.get(dut.act.data)
            ctx.set(dut.act.addr, addr)
            assert ctx.get(dut.act.data) == before, "read data changed before the edge"
            await ctx.tick()
            if addr != 5:
                assert ctx.get(dut.act.data) == contents[previous], f"seed {seed}: row {previous}"
            previous = addr
        # act.en low: the last row arrives, then holds whatever the address does.
        ctx.set(dut.act.en, 0)
        for addr in (2, 4, 6):
            ctx.set(dut.act.addr, addr)
            await ctx.tick()
            assert ctx.get(dut.act.data) == contents[1], "read data did not hold"
        # A write does not disturb the held read data, and is seen by the next read.
        ctx.set(dut.write.addr, 1)
        ctx.set(dut.write.data, 0xA5A5A5A5)
        ctx.set(dut.write.en, 1)
        await ctx.tick()
        ctx.set(dut.write.en, 0)
        assert ctx.get(dut.act.data) == contents[1]
        ctx.set(dut.act.addr, 1)
        ctx.set(dut.act.en, 1)
        await ctx.tick()
        ctx.set(dut.act.en, 0)
        assert ctx.get(dut.act.data) == contents[1]
        await ctx.tick()
        assert ctx.get(dut.act.data) == 0xA5A5A5A5

    run_simulation(dut, testbench)
