"""Property set 3: the AXI4 master side of :class:`hw.dma.DMA`."""

from amaranth.asserts import AnyConst, AnySeq
from amaranth.hdl import (Assert, Assume, Cover, Elaboratable, Module, ResetSignal, Signal,
                          Value)

from hw.axi import Burst
from hw.dma import DMA, row_beats


__all__ = ["DMAProperties", "BurstSplitProperties"]


def _ceil_div(a, b):
    return -(-a // b)


class DMAProperties(Elaboratable):
    """The DMA with every bus input free (``AnySeq``: any ready, any response, any data, at
    any time, even ones a real slave would never give) and free commands that are assumed
    legal as the controller guarantees (``rows >= 1``, ``1 <= row_bytes <=`` the row width);
    addresses and strides are free 32-bit values; rows to write are free but, as the store
    unit sends them, offered only after their command is taken and no more than it has. In
    every cycle:

    * **handshakes hold**: while ``ARVALID`` is high and ``ARREADY`` low, ``ARVALID`` stays
      high and ``araddr/arlen/arsize/arburst`` stay as they are in the next cycle; the same
      for ``AWVALID`` with ``awaddr/awlen/awsize/awburst``, and for ``WVALID`` with
      ``wdata/wstrb/wlast``;
    * **bursts are legal**: INCR, full-width beats (``arsize``/``awsize``), bus-aligned start,
      no burst crosses a 4 KiB boundary, and no burst is longer than a row can need
      (``arlen + 1 <= ceil((row bytes + bus bytes - 1) / bus bytes)``, so never above 255 and
      never a zero-length burst wrapped round to 256 beats);
    * **write data follows its address**: a W beat is sent only for a burst whose address was
      accepted, one burst at a time, and ``wlast`` is high exactly on its ``awlen + 1``-th
      beat.

    Parameters
    ----------
    data_width, read_row_bytes, write_row_bytes : int
        The DMA's parameters; small rows keep the proof small.
    dma_class : type, optional
        :class:`~hw.dma.DMA` or a subclass of it (the mutation tests pass broken ones).
    """
    def __init__(self, *, data_width=32, read_row_bytes=8, write_row_bytes=8, dma_class=DMA):
        self.dma = dma_class(data_width=data_width, read_row_bytes=read_row_bytes,
                             write_row_bytes=write_row_bytes)
        self.bus_bytes = data_width // 8
        self.read_row_bytes = read_row_bytes
        self.write_row_bytes = write_row_bytes

    def _assume_legal(self, m, cmd, row_bytes):
        with m.If(cmd.valid):
            m.d.comb += Assume((cmd.payload.rows >= 1) & (cmd.payload.row_bytes >= 1) &
                               (cmd.payload.row_bytes <= row_bytes))

    def _stable_while_stalled(self, m, valid, ready, payload, name):
        """VALID high and READY low: next cycle VALID still high, payload unchanged."""
        stalled = Signal(name=f"{name}_stalled")
        past = [Signal.like(p, name=f"{name}_past_{p.name}") for p in payload]
        m.d.sync += stalled.eq(valid & ~ready)
        m.d.sync += [q.eq(p) for q, p in zip(past, payload)]
        # A failure is reported at the caller's line, which names the channel.
        with m.If(stalled):
            m.d.comb += Assert(valid, src_loc_at=1)
            for q, p in zip(past, payload):
                m.d.comb += Assert(p == q, src_loc_at=1)

    def _legal_burst(self, m, valid, addr, length, size, burst, row_bytes):
        lg = self.bus_bytes.bit_length() - 1
        with m.If(valid):
            m.d.comb += [
                Assert(burst == Burst.INCR),
                Assert(size == lg),
                Assert(addr[:lg] == 0),
                Assert(length + 1 <= _ceil_div(row_bytes + self.bus_bytes - 1, self.bus_bytes)),
                Assert(addr[:12] + ((length + 1) << lg) <= 4096),
            ]

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma = dma = self.dma
        bus = dma.bus

        m.d.comb += Assume(~ResetSignal())
        for port in (bus.awready, bus.wready, bus.bid, bus.bresp, bus.bvalid, bus.arready,
                     bus.rid, bus.rdata, bus.rresp, bus.rlast, bus.rvalid,
                     dma.read_cmd.valid, dma.read_cmd.payload,
                     dma.write_cmd.valid, dma.write_cmd.payload,
                     dma.write_row.valid, dma.write_row.payload):
            m.d.comb += port.eq(AnySeq(len(Value.cast(port))))
        self._assume_legal(m, dma.read_cmd, self.read_row_bytes)
        self._assume_legal(m, dma.write_cmd, self.write_row_bytes)
        read = dma.read_cmd.payload        # its first row's beats, its second row's address
        m.d.comb += Assume(~dma.read_cmd.valid |
                           ((read.beats == row_beats(self.bus_bytes, read.addr, read.row_bytes)) &
                            (read.next_addr == (read.addr + read.stride)[:32])))
        # Rows come to the writer as the store unit sends them: only once their command is
        # taken, and no more than it has. (The writer takes a row whenever its buffer is
        # empty, whatever its state, and asserts this.)
        rows_wanted = Signal(16)
        with m.If(dma.write_cmd.valid & dma.write_cmd.ready):
            m.d.sync += rows_wanted.eq(dma.write_cmd.payload.rows)
        with m.Elif(dma.write_row.valid & dma.write_row.ready):
            m.d.sync += rows_wanted.eq(rows_wanted - 1)
        m.d.comb += Assume(~dma.write_row.valid | (rows_wanted != 0))

        self._stable_while_stalled(m, bus.arvalid, bus.arready,
                                   [bus.araddr, bus.arlen, bus.arsize, bus.arburst], "ar")
        self._stable_while_stalled(m, bus.awvalid, bus.awready,
                                   [bus.awaddr, bus.awlen, bus.awsize, bus.awburst], "aw")
        self._stable_while_stalled(m, bus.wvalid, bus.wready,
                                   [bus.wdata, bus.wstrb, bus.wlast], "w")
        self._legal_burst(m, bus.arvalid, bus.araddr, bus.arlen, bus.arsize, bus.arburst,
                          self.read_row_bytes)
        self._legal_burst(m, bus.awvalid, bus.awaddr, bus.awlen, bus.awsize, bus.awburst,
                          self.write_row_bytes)

        # W follows AW: the burst whose address was accepted and whose data is not done.
        burst_open = Signal()
        burst_len = Signal(8)
        beats_sent = Signal(8)
        aw_fire = bus.awvalid & bus.awready
        w_fire = bus.wvalid & bus.wready
        m.d.comb += Assert(~(bus.awvalid & burst_open))
        m.d.comb += Assert(~bus.wvalid | burst_open)
        with m.If(bus.wvalid):
            m.d.comb += Assert(bus.wlast == (beats_sent == burst_len))
        with m.If(aw_fire):
            m.d.sync += [burst_open.eq(1), burst_len.eq(bus.awlen), beats_sent.eq(0)]
        with m.If(w_fire):
            m.d.sync += beats_sent.eq(beats_sent + 1)
            with m.If(bus.wlast):
                m.d.sync += burst_open.eq(0)

        # Non-vacuity: a stalled read burst that stops exactly at a 4 KiB boundary after a
        # row was split there, and a stalled multi-beat write burst.
        lg = self.bus_bytes.bit_length() - 1
        ar_split = Signal()
        with m.If(bus.arvalid & bus.arready & ((bus.araddr[:12] + ((bus.arlen + 1) << lg))
                                               == 4096)):
            m.d.sync += ar_split.eq(1)
        ar_stalled = Signal()
        m.d.sync += ar_stalled.eq(bus.arvalid & ~bus.arready)
        m.d.comb += Cover(ar_split & ar_stalled & bus.arvalid & (bus.araddr[:12] == 0))
        w_stalled = Signal()
        m.d.sync += w_stalled.eq(bus.wvalid & ~bus.wready)
        m.d.comb += Cover(w_stalled & bus.wvalid & bus.wlast & (burst_len >= 1))
        return m


class BurstSplitProperties(Elaboratable):
    """The DMA's burst splitter (``DMA._next_burst``, shared by reader and writer) for every
    bus-aligned 32-bit beat address and every beat count from 1 to ``2**count_bits - 1`` (17
    bits by default: a row of 65535 bytes needs at most ``65535 / bus bytes + 1`` beats; a
    few bits take the splitter's narrow page test): the burst is 1 to 256 beats,
    no longer than what is left, ends at or before the next 4 KiB boundary, and is as long as
    those three limits allow; its AXI ``len``, whether it ends the row, and the address and
    beats left after it agree with its length. Combinational, so one cycle proves it for all
    inputs.
    """
    def __init__(self, data_width, dma_class=DMA, *, count_bits=17):
        self.dma = dma_class(data_width=data_width, read_row_bytes=4, write_row_bytes=4)
        # Only the helper method is used; the DMA itself is never elaborated.
        self.dma._MustUse__silence = True
        self.bus_bytes = data_width // 8
        self.count_bits = count_bits

    def elaborate(self, platform):
        m = Module()
        lg = self.bus_bytes.bit_length() - 1
        beat_addr = Signal(32)
        beats_left = Signal(self.count_bits)
        m.d.comb += [beat_addr.eq(AnyConst(32)), beats_left.eq(AnyConst(self.count_bits))]
        m.d.comb += Assume((beat_addr[:lg] == 0) & (beats_left >= 1))
        length, length_minus_one, last, next_addr, next_left = self.dma._next_burst(
            m, beat_addr, beats_left, "split")
        to_boundary = (4096 - beat_addr[:12]) >> lg
        m.d.comb += [
            Assert((length >= 1) & (length <= 256)),
            Assert(length <= beats_left),
            Assert(beat_addr[:12] + (length << lg) <= 4096),
            Assert((length == beats_left) | (length == 256) | (length == to_boundary)),
            Assert(length_minus_one == length - 1),
            Assert(last == (length == beats_left)),
            Assert(next_addr == (beat_addr + (length << lg))[:32]),
            Assert(next_left == beats_left - length),
        ]
        return m
