"""Unit tests of :class:`hw.scratchpad.Scratchpad`: rows written and read back, with one
cycle of read latency."""

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
        for addr in rng.permutation(depth):
            ctx.set(dut.act.addr, int(addr))
            await ctx.tick()
            got = ctx.get(dut.act.data)
            assert got == contents[addr], \
                f"seed {seed}: row {addr} reads {got:#x}, wrote {contents[addr]:#x}"

    run_simulation(dut, testbench)


def test_read_latency_is_one_cycle():
    """act.data changes only at the edge after act.en, and holds while act.en is low."""
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
        ctx.set(dut.act.addr, 3)
        ctx.set(dut.act.en, 1)
        await ctx.tick()
        assert ctx.get(dut.act.data) == contents[3]
        # Back-to-back reads: a new row every cycle, each one cycle after its address.
        for addr in (5, 0, 7, 7, 1):
            before = ctx.get(dut.act.data)
            ctx.set(dut.act.addr, addr)
            assert ctx.get(dut.act.data) == before, "read data changed before the edge"
            await ctx.tick()
            assert ctx.get(dut.act.data) == contents[addr], f"seed {seed}: row {addr}"
        # act.en low: the last row holds whatever the address does.
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
        assert ctx.get(dut.act.data) == 0xA5A5A5A5

    run_simulation(dut, testbench)
