"""Unit tests of :class:`hw.dma.DMA` against an AXI4 slave memory model with random stalls.

The model (:class:`sim.amaranth_sim.AXI4MemoryModel`) checks the bus rules on every cycle:
INCR, full-width, aligned bursts of at most 256 beats that never cross 4 KiB, stable payloads,
AW before its W data, ``wlast`` on the last beat of each burst. The tests check the data.
"""

import numpy as np
import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from hw.axi import Resp
from hw.config import BUS_WIDTHS
from hw.dma import DMA, MAX_READS_OUTSTANDING, row_beats
from sim.amaranth_sim import AXI4MemoryModel, run_simulation


WIDTHS = BUS_WIDTHS
#: The DMA's row width by bus width: a 3x5 array's accumulator row up to 128 bits, two and a
#: half beats or more on the wider buses; never a power of two.
ROW_BYTES = {32: 20, 64: 20, 128: 20, 256: 85, 512: 165}
TIMEOUT = 2000           # cycles any one block may take
MODEL_TIMING = {
    "stalls": dict(ready_probability=0.6, max_latency=5),
    "full_rate": dict(ready_probability=1.0, max_latency=0),   # every handshake at once
}


def _fill(model, rng, start, length):
    model.load(start, rng.bytes(length))


async def _handshake(ctx, stream, timeout=TIMEOUT):
    """Hold ``stream.valid`` until the edge at which ``ready`` is high."""
    ctx.set(stream.valid, 1)
    for _ in range(timeout):
        _, _, ready = await ctx.tick().sample(stream.ready)
        if ready:
            ctx.set(stream.valid, 0)
            return
    raise AssertionError(f"stream not accepted in {timeout} cycles")


def _set_command(ctx, command, addr, rows, row_bytes, stride, bus_bytes=None):
    """A block command; with ``bus_bytes``, a read's, with its first row's beats and its
    second row's address."""
    ctx.set(command.payload.addr, addr)
    ctx.set(command.payload.rows, rows)
    ctx.set(command.payload.row_bytes, row_bytes)
    ctx.set(command.payload.stride, stride)
    if bus_bytes is not None:
        ctx.set(command.payload.beats, row_beats(bus_bytes, addr, row_bytes))
        ctx.set(command.payload.next_addr, (addr + stride) % (1 << 32))


async def read_block(ctx, dut, addr, rows, row_bytes, stride):
    """Run one read command; returns ``(rows delivered, read_error at read_done)``."""
    _set_command(ctx, dut.read_cmd, addr, rows, row_bytes, stride, dut.bus_bytes)
    await _handshake(ctx, dut.read_cmd)
    delivered = []
    for _ in range(TIMEOUT):
        _, _, valid, payload, done, error = await ctx.tick().sample(
            dut.read_row.valid, dut.read_row.payload, dut.read_done, dut.read_error)
        if valid:
            delivered.append(payload.to_bytes(dut.read_row_bytes, "little"))
        if done:
            return delivered, error
    raise AssertionError(f"read of {rows} rows at {addr:#x} did not finish")


async def write_block(ctx, dut, rng, addr, rows, row_bytes, stride, payloads, *,
                      after_command=None):
    """Run one write command, offering each row after a random delay; returns
    ``write_error`` at ``write_done``. ``after_command`` (an async function of ``ctx``) runs
    once the command is taken, before the first row is offered."""
    _set_command(ctx, dut.write_cmd, addr, rows, row_bytes, stride)
    await _handshake(ctx, dut.write_cmd)
    if after_command is not None:
        await after_command(ctx)
    for payload in payloads:
        for _ in range(int(rng.integers(0, 3))):
            await ctx.tick()
        ctx.set(dut.write_row.payload, int.from_bytes(payload, "little"))
        await _handshake(ctx, dut.write_row)
    for _ in range(TIMEOUT):
        _, _, done, error = await ctx.tick().sample(dut.write_done, dut.write_error)
        if done:
            return error
    raise AssertionError(f"write of {rows} rows at {addr:#x} did not finish")


def _expected_row(model, addr, row_bytes, width):
    return model.peek(addr, row_bytes) + bytes(width - row_bytes)


def _expected_writes(addr, row_bytes, stride, payloads):
    written = {}
    for row, payload in enumerate(payloads):
        for byte in range(row_bytes):
            written[(addr + row * stride + byte) & 0xFFFF_FFFF] = payload[byte]
    return written


def _blocks(rng, bus_bytes):
    """Edge-case blocks, then random ones: ``(addr, rows, row_bytes, stride)``."""
    row_width = ROW_BYTES[8 * bus_bytes]
    blocks = [
        (0x0FF9, 3, row_width, 0x1001),        # every row crosses a 4 KiB boundary
        (0x1FFF, 2, 1, 3),                     # single bytes, the first just below 4 KiB
        (0x2003, 3, row_width, 0),             # the same row three times
        (0x3001, 4, 9, 7),                     # overlapping rows, odd stride
        (0x4000, 2, row_width, bus_bytes),     # aligned start
        (0x5000 - bus_bytes, 1, bus_bytes, 0), # exactly one beat, ending at 4 KiB
        (0x5FFF, 1, 2, 0),                     # two bytes, one each side of 4 KiB
        (2**32 - row_width, 1, row_width, 0),  # ends at the top of the address space
    ]
    for _ in range(10):
        page = int(rng.integers(0, 0x100)) << 12
        if rng.random() < 0.4:
            offset = 4096 - int(rng.integers(1, 2 * row_width))
        else:
            offset = int(rng.integers(0, 4096))
        stride = int(rng.choice([0, 1, 3, 13, 64, 4095, 4097, int(rng.integers(0, 9000))]))
        blocks.append((page + offset, int(rng.integers(1, 5)),
                       int(rng.integers(1, row_width + 1)), stride))
    return blocks


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("stalls", ["stalls", "full_rate"])
def test_read_blocks(width, stalls):
    """Each row of a 2-D strided block comes back exactly, bytes past row_bytes zero."""
    row_width = ROW_BYTES[width]
    seed = 0xD0A0 + width + (stalls == "full_rate")
    rng = np.random.default_rng(seed)
    dut = DMA(data_width=width, read_row_bytes=row_width, write_row_bytes=row_width)
    model = AXI4MemoryModel(dut.bus, data_width=width, seed=seed, **MODEL_TIMING[stalls])
    blocks = _blocks(rng, width // 8)
    for addr, rows, row_bytes, stride in blocks:
        _fill(model, rng, addr, (rows - 1) * stride + row_bytes)

    async def testbench(ctx):
        for addr, rows, row_bytes, stride in blocks:
            where = (f"seed {seed}: block at {addr:#x}, {rows} rows of {row_bytes} bytes, "
                     f"stride {stride}")
            delivered, error = await read_block(ctx, dut, addr, rows, row_bytes, stride)
            assert error == 0, where
            assert delivered == [
                _expected_row(model, addr + row * stride, row_bytes, row_width)
                for row in range(rows)
            ], where
            await ctx.tick()
            assert model.idle and ctx.get(dut.idle), f"{where}: not idle after read_done"
        assert model.written == {}

    run_simulation(dut, testbench, processes=[model.process])
    assert len(model.read_bursts) > sum(rows for _, rows, _, _ in blocks)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("stalls", ["stalls", "full_rate"])
def test_write_blocks(width, stalls):
    """Exactly the bytes of each row's first row_bytes are written (wstrb), nothing else,
    although the rows offered carry non-zero bytes past row_bytes."""
    row_width = ROW_BYTES[width]
    seed = 0xD0B0 + width + (stalls == "full_rate")
    rng = np.random.default_rng(seed)
    dut = DMA(data_width=width, read_row_bytes=row_width, write_row_bytes=row_width)
    model = AXI4MemoryModel(dut.bus, data_width=width, seed=seed, **MODEL_TIMING[stalls])
    blocks = _blocks(rng, width // 8)

    async def testbench(ctx):
        for addr, rows, row_bytes, stride in blocks:
            where = (f"seed {seed}: block at {addr:#x}, {rows} rows of {row_bytes} bytes, "
                     f"stride {stride}")
            payloads = [rng.bytes(row_width) for _ in range(rows)]
            model.written = {}
            error = await write_block(ctx, dut, rng, addr, rows, row_bytes, stride, payloads)
            assert error == 0, where
            assert model.idle, f"{where}: write_done before every response"
            assert model.written == _expected_writes(addr, row_bytes, stride, payloads), where
            await ctx.tick()
            assert ctx.get(dut.idle), f"{where}: not idle after write_done"

    run_simulation(dut, testbench, processes=[model.process])


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("stalls", ["stalls", "full_rate"])
def test_write_waits_for_a_late_row(width, stalls):
    """Each row offered only once the last beat of the row before has gone: after every row
    but the last the writer finds its buffer empty at that beat and waits for the next row
    (``hw/dma/writer.py``: DATA, the row's last beat, ``next_valid`` low). In the NPU the
    store unit has the next row in the buffer by then (``sim/coverage.py``'s WAIVERS), so
    only this test takes that branch. Exactly the rows' bytes are written; the first row
    crosses 4 KiB (two bursts)."""
    row_width = ROW_BYTES[width]
    seed = 0xD140 + width + (stalls == "full_rate")
    rng = np.random.default_rng(seed)
    dut = DMA(data_width=width, read_row_bytes=row_width, write_row_bytes=row_width)
    model = AXI4MemoryModel(dut.bus, data_width=width, seed=seed, **MODEL_TIMING[stalls])
    addr, rows, stride = 0x8000 - row_width // 2 - 3, 4, row_width + 9
    payloads = [rng.bytes(row_width) for _ in range(rows)]
    where = f"seed {seed}, {rows} rows of {row_width} bytes at {addr:#x}, stride {stride}"

    async def testbench(ctx):
        _set_command(ctx, dut.write_cmd, addr, rows, row_width, stride)
        await _handshake(ctx, dut.write_cmd)
        for row, payload in enumerate(payloads):
            if row:
                # The row before has gone when its last byte is written: its last beat.
                last_byte = addr + (row - 1) * stride + row_width - 1
                for _ in range(TIMEOUT):
                    if last_byte in model.written:
                        break
                    await ctx.tick()
                else:
                    raise AssertionError(f"{where}: row {row - 1} not written")
                await ctx.tick().repeat(2)
            ctx.set(dut.write_row.payload, int.from_bytes(payload, "little"))
            await _handshake(ctx, dut.write_row)
        for _ in range(TIMEOUT):
            _, _, done, error = await ctx.tick().sample(dut.write_done, dut.write_error)
            if done:
                assert error == 0, where
                break
        else:
            raise AssertionError(f"{where}: write_done did not come")
        assert model.written == _expected_writes(addr, row_width, stride, payloads), where
        first_bursts = [burst_addr for burst_addr, _ in model.write_bursts[:2]]
        assert first_bursts == [addr & ~(width // 8 - 1), 0x8000], \
            f"{where}: bursts {model.write_bursts}"

    run_simulation(dut, testbench, processes=[model.process])


@pytest.mark.parametrize("width", WIDTHS)
def test_read_and_write_at_once(width):
    """The reader and the writer run at the same time on their own channels."""
    row_width = ROW_BYTES[width]
    seed = 0xD0C0 + width
    rng = np.random.default_rng(seed)
    dut = DMA(data_width=width, read_row_bytes=row_width, write_row_bytes=row_width)
    model = AXI4MemoryModel(dut.bus, data_width=width, seed=seed)
    read_addr, write_addr, rows, stride = 0x1FF3, 0x8FF5, 5, 23
    _fill(model, rng, read_addr, rows * stride)
    payloads = [rng.bytes(row_width) for _ in range(rows)]
    outcome = {}

    async def reader(ctx):
        outcome["read"] = await read_block(ctx, dut, read_addr, rows, row_width, stride)

    async def writer(ctx):
        outcome["write"] = await write_block(ctx, dut, rng, write_addr, rows, row_width - 3,
                                             stride, payloads)

    run_simulation(dut, reader, writer, processes=[model.process])
    assert outcome["read"] == ([_expected_row(model, read_addr + row * stride, row_width,
                                              row_width) for row in range(rows)], 0)
    assert outcome["write"] == 0
    assert model.written == _expected_writes(write_addr, row_width - 3, stride, payloads)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("resp", [Resp.SLVERR, Resp.DECERR])
def test_bus_errors(width, resp):
    """A beat answered SLVERR or DECERR gives read_error / write_error at done: rows before
    the bad one are delivered, none after it; the next command starts clean."""
    row_width = ROW_BYTES[width]
    seed = 0xD0E0 + width + resp.value
    rng = np.random.default_rng(seed)
    base = 0x3000
    bad = (base + 256, base + 512, resp)
    dut = DMA(data_width=width, read_row_bytes=row_width, write_row_bytes=row_width)
    model = AXI4MemoryModel(dut.bus, data_width=width, seed=seed,
                            read_errors=[bad], write_errors=[bad])
    _fill(model, rng, base, 0x1000)

    async def testbench(ctx):
        addr, rows, stride = base + 3, 4, 256   # row 1 lies in the bad range
        delivered, error = await read_block(ctx, dut, addr, rows, row_width, stride)
        assert error == 1, f"seed {seed}: no read_error"
        assert delivered == [_expected_row(model, addr, row_width, row_width)], \
            f"seed {seed}: rows after the bad beat were delivered"
        delivered, error = await read_block(ctx, dut, base + 0x801, 2, 5, 9)
        assert error == 0, f"seed {seed}: read_error stuck"
        assert delivered == [_expected_row(model, base + 0x801 + row * 9, 5, row_width)
                             for row in range(2)]

        payloads = [rng.bytes(row_width) for _ in range(3)]
        error = await write_block(ctx, dut, rng, addr, 3, row_width, stride, payloads)
        assert error == 1, f"seed {seed}: no write_error"
        good = _expected_writes(addr, row_width, stride, payloads)
        assert model.written == {a: v for a, v in good.items() if not bad[0] <= a < bad[1]}
        model.written = {}
        payloads = [rng.bytes(row_width) for _ in range(2)]
        error = await write_block(ctx, dut, rng, base + 0x901, 2, 4, 4, payloads)
        assert error == 0, f"seed {seed}: write_error stuck"
        assert model.written == _expected_writes(base + 0x901, 4, 4, payloads)

    run_simulation(dut, testbench, processes=[model.process])


def test_long_rows_split_at_256_beats_and_4k():
    """Rows of more than 256 beats: bursts are cut at 256 beats (arlen/awlen = 255) and at
    4 KiB boundaries, and the data is still exact."""
    seed = 0xD0F0
    rng = np.random.default_rng(seed)
    width, row_bytes = 32, 1040
    dut = DMA(data_width=width, read_row_bytes=row_bytes, write_row_bytes=row_bytes)
    model = AXI4MemoryModel(dut.bus, data_width=width, seed=seed, ready_probability=0.8)
    # Row 0 at 0x2001: 261 beats from 0x2000, cut at 256. Row 1 at 0x3F02: cut at 0x4000.
    addr, stride = 0x2001, 0x1F01
    _fill(model, rng, addr, stride + row_bytes)
    payloads = [rng.bytes(row_bytes) for _ in range(2)]

    async def testbench(ctx):
        delivered, error = await read_block(ctx, dut, addr, 2, row_bytes, stride)
        assert error == 0
        assert delivered == [model.peek(addr + row * stride, row_bytes) for row in range(2)]
        assert model.read_bursts == [(0x2000, 256), (0x2400, 5), (0x3F00, 64), (0x4000, 197)]
        write_addr = addr + 0x10000
        error = await write_block(ctx, dut, rng, write_addr, 2, row_bytes, stride, payloads)
        assert error == 0
        assert model.written == _expected_writes(write_addr, row_bytes, stride, payloads)
        assert model.write_bursts == [(0x12000, 256), (0x12400, 5), (0x13F00, 64),
                                      (0x14000, 197)]

    run_simulation(dut, testbench, processes=[model.process])


def _burst_rule(bus_bytes, beat_addr, beats_left):
    """The next burst of a row, as the AXI rules and the DMA's docstring say: the rest of the
    row, cut at the next 4 KiB boundary and at 256 beats. (length, len field, last, beat
    address after it, beats left after it)."""
    to_boundary = (4096 - beat_addr % 4096) // bus_bytes
    length = min(beats_left, to_boundary, 256)
    return (length, (length - 1) % 256, int(length == beats_left),
            (beat_addr + length * bus_bytes) % (1 << 32), beats_left - length)


def _check_burst_split(data_width, row_width, count_bits, cases):
    """The splitter (``DMA._next_burst``) with a ``count_bits``-bit beat count against the
    rule, for each ``(beat address, beats left)`` of ``cases``."""
    bus_bytes = data_width // 8
    dma = DMA(data_width=data_width, read_row_bytes=row_width, write_row_bytes=row_width)
    dma._MustUse__silence = True
    m = Module()
    beat_addr, beats_left = Signal(32), Signal(count_bits)
    outputs = dma._next_burst(m, beat_addr, beats_left, "test")

    async def testbench(ctx):
        for addr, left in cases:
            ctx.set(beat_addr, addr)
            ctx.set(beats_left, left)
            got = tuple(ctx.get(value) for value in outputs)
            assert got == _burst_rule(bus_bytes, addr, left), (hex(addr), left, got)

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()


@pytest.mark.parametrize("data_width", WIDTHS)
def test_burst_split(data_width):
    """The burst arithmetic (its three ends formed side by side) against the rule, on rows
    near 4 KiB boundaries and the 256-beat cap and on random ones."""
    bus_bytes = data_width // 8
    seed = 0xB0 + data_width
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    cases = [(page + offset, left) for page in (0, 4096, (1 << 32) - 4096)
             for offset in (0, bus_bytes, 2048, 4096 - 256 * bus_bytes, 4096 - bus_bytes)
             if 0 <= offset < 4096
             for left in (1, 2, 255, 256, 257, 511, 512, 513, 1024, (1 << 17) - 1)]
    cases += [(int(rng.integers(0, 1 << 32)) // bus_bytes * bus_bytes,
               int(rng.choice([rng.integers(1, 600), rng.integers(1, 1 << 17)])))
              for _ in range(3000)]
    _check_burst_split(data_width, ROW_BYTES[data_width], 17, cases)


@pytest.mark.parametrize("data_width", WIDTHS)
@pytest.mark.parametrize("narrow", (1, 3, 5))
def test_burst_split_narrow(data_width, narrow):
    """The burst arithmetic for a beat count of few bits (the reader's and the writer's,
    whose rows are a few beats: no carry chain), against the rule at every beat address of a
    page and every count the width holds."""
    bus_bytes = data_width // 8
    page = (1 << 32) - 4096
    cases = [(page + beat * bus_bytes, left) for beat in range(4096 // bus_bytes)
             for left in range(1, 1 << narrow)]
    _check_burst_split(data_width, 20, narrow, cases)


async def _wait_idle(ctx, dut, model, where, timeout=50):
    """Wait until both the DMA and the slave have nothing outstanding (a broken slave's
    extra beats may still be on the bus when the DMA is done)."""
    for _ in range(timeout):
        if model.idle and ctx.get(dut.idle):
            return
        await ctx.tick()
    raise AssertionError(f"{where}: DMA idle {ctx.get(dut.idle)}, slave idle {model.idle} "
                         f"after {timeout} cycles")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("misframing", AXI4MemoryModel.MISFRAMINGS)
@pytest.mark.parametrize("stalls", ["stalls", "full_rate"])
def test_read_rlast_checked(width, misframing, stalls):
    """A slave that ends a read burst a beat early (``short``), a beat late (``long``) or
    never raises ``rlast`` (``no_rlast``): the command ends in read_done with read_error,
    the rows before the bad burst are delivered and none from it on; every beat the slave
    sends is taken, so both sides end idle; the next command is exact and error-free."""
    row_width = ROW_BYTES[width]
    seed = 0xD110 + width + 7 * AXI4MemoryModel.MISFRAMINGS.index(misframing) + (
        stalls == "full_rate")
    rng = np.random.default_rng(seed)
    bus_bytes = width // 8
    base, stride, rows = 0x6000, 0x100, 6
    addr = base + (bus_bytes - 7) % bus_bytes    # two beats or more a row, one burst
    bad_row = 2
    bad = (base + bad_row * stride, base + (bad_row + 1) * stride, misframing)
    dut = DMA(data_width=width, read_row_bytes=row_width, write_row_bytes=row_width)
    model = AXI4MemoryModel(dut.bus, data_width=width, seed=seed, misframed_reads=[bad],
                            **MODEL_TIMING[stalls])
    _fill(model, rng, base, 0x1000)

    async def testbench(ctx):
        where = f"seed {seed}, {misframing} burst at {bad[0]:#x}"
        delivered, error = await read_block(ctx, dut, addr, rows, row_width, stride)
        assert error == 1, f"{where}: no read_error"
        assert delivered == [_expected_row(model, addr + row * stride, row_width, row_width)
                             for row in range(bad_row)], f"{where}: rows delivered"
        await _wait_idle(ctx, dut, model, where)
        clean = base + 0x800 + 5
        delivered, error = await read_block(ctx, dut, clean, 3, row_width, stride)
        assert error == 0, f"{where}: read_error stuck"
        assert delivered == [_expected_row(model, clean + row * stride, row_width, row_width)
                             for row in range(3)], f"{where}: the next command"
        await _wait_idle(ctx, dut, model, where)

    run_simulation(dut, testbench, processes=[model.process])


@pytest.mark.parametrize("width", WIDTHS)
def test_reads_outstanding_are_bounded(width):
    """A slave that holds back every R beat sees exactly MAX_READS_OUTSTANDING read
    addresses (one-beat bursts, every address accepted at once); once it answers, every row
    arrives exactly."""
    row_width = ROW_BYTES[width]
    seed = 0xD120 + width
    rng = np.random.default_rng(seed)
    bus_bytes = width // 8
    rows, stride = 3 * MAX_READS_OUTSTANDING, 2 * bus_bytes
    addr = 0x7000
    dut = DMA(data_width=width, read_row_bytes=row_width, write_row_bytes=row_width)
    model = AXI4MemoryModel(dut.bus, data_width=width, seed=seed, **MODEL_TIMING["full_rate"])
    _fill(model, rng, addr, rows * stride)
    row_bytes = min(row_width, bus_bytes)   # a row is one beat: a burst per row
    outcome = {}

    async def reader(ctx):
        outcome["read"] = await read_block(ctx, dut, addr, rows, row_bytes, stride)

    async def slave(ctx):
        model.hold_reads = True
        for _ in range(4 * rows):
            await ctx.tick()
        outcome["held"] = len(model.read_bursts)
        model.hold_reads = False

    run_simulation(dut, reader, slave, processes=[model.process])
    assert outcome["held"] == MAX_READS_OUTSTANDING, f"seed {seed}"
    assert len(model.read_bursts) == rows
    assert outcome["read"] == ([_expected_row(model, addr + row * stride, row_bytes, row_width)
                                for row in range(rows)], 0)


@pytest.mark.parametrize("width", WIDTHS)
def test_spurious_write_response(width):
    """A write response that no write burst asked for: with the writer idle it is ignored
    (the DMA stays idle, the next write is exact and error-free); during a write command,
    before any burst of it is answered, the command ends in write_done with write_error and
    all its data written; the DMA is idle after either."""
    row_width = ROW_BYTES[width]
    seed = 0xD130 + width
    rng = np.random.default_rng(seed)
    dut = DMA(data_width=width, read_row_bytes=row_width, write_row_bytes=row_width)
    model = AXI4MemoryModel(dut.bus, data_width=width, seed=seed)
    addr, rows, stride = 0x9003, 3, 37

    async def spurious(ctx):
        model.send_spurious_write_response()
        for _ in range(3):
            await ctx.tick()

    async def testbench(ctx):
        await spurious(ctx)
        await _wait_idle(ctx, dut, model, f"seed {seed}: spurious B while idle")
        for during, expected_error in ((False, 0), (True, 1)):
            where = f"seed {seed}, spurious B {'during' if during else 'before'} the command"
            payloads = [rng.bytes(row_width) for _ in range(rows)]
            model.written = {}
            error = await write_block(ctx, dut, rng, addr, rows, row_width, stride, payloads,
                                      after_command=spurious if during else None)
            assert error == expected_error, where
            assert model.written == _expected_writes(addr, row_width, stride, payloads), where
            await _wait_idle(ctx, dut, model, where)
        payloads = [rng.bytes(row_width) for _ in range(rows)]
        model.written = {}
        error = await write_block(ctx, dut, rng, addr, rows, row_width, stride, payloads)
        assert error == 0, f"seed {seed}: write_error stuck"
        assert model.written == _expected_writes(addr, row_width, stride, payloads)

    run_simulation(dut, testbench, processes=[model.process])
