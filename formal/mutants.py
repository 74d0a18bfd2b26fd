"""Deliberately broken copies of the designs, each with one plausible bug.

A proof that passes on these has proved nothing: ``tb/test_formal.py`` checks that every
property set fails on its mutants, and ``python -m formal --mutants`` shows it. Each mutant
subclasses the real block and changes as little as it can, so that the rest of the block is the
code under proof.
"""

from amaranth.hdl import Module, Mux, Signal, signed

from hw.controller.fetcher import Fetcher
from hw.dma import DMA
from hw.pe import PE
from hw.systolic import SystolicArray


__all__ = [
    "PEUnsignedActivation", "PELateCommit",
    "ArrayWithPE", "ArrayMissingSkewRegister", "ArrayShortAlignment",
    "DMADropsARValid", "DMAUnstableWData", "DMAIgnores4K", "DMAWLastStuck",
    "FetcherHighWaterPlusOne",
]


# ----------------------------------------------------------------------------------------- PE

class _PEVariant(PE):
    """:meth:`PE.elaborate` with the weight choice and the product as hooks."""
    def _weight(self, active):
        return Mux(self.commit_in, self.w_out, active)

    def _product(self, weight):
        return weight * self.a_in

    def elaborate(self, platform):
        m = Module()
        active = Signal(signed(8))
        weight = self._weight(active)
        m.d.sync += [
            self.a_out.eq(self.a_in),
            self.commit_out.eq(self.commit_in),
            self.psum_out.eq(self.psum_in + self._product(weight)),
        ]
        with m.If(self.commit_in):
            m.d.sync += active.eq(self.w_out)
        with m.If(self.w_shift):
            m.d.sync += self.w_out.eq(self.w_in)
        return m


class PEUnsignedActivation(_PEVariant):
    """Wrong product: the activation is taken as unsigned (a lost ``signed``)."""
    def _product(self, weight):
        return weight * self.a_in.as_unsigned()


class PELateCommit(_PEVariant):
    """Wrong commit: the committing activation still uses the old active weight."""
    def _weight(self, active):
        return active


# ------------------------------------------------------------------------------ SystolicArray

def ArrayWithPE(rows, cols, pe_class, *, row, col):
    """A real :class:`SystolicArray` with PE(``row``, ``col``) replaced by ``pe_class()``."""
    array = SystolicArray(rows, cols)
    # The replaced PE is never elaborated; say so, or Amaranth warns about it.
    array.mesh.pes[row][col]._MustUse__silence = True
    array.mesh.pes[row][col] = pe_class()
    return array


class _ArrayVariant(SystolicArray):
    """:meth:`SystolicArray.elaborate` with the skew and alignment depths as hooks."""
    def _skew_depth(self, row):
        return row

    def _align_depth(self, col):
        return self.cols - 1 - col

    def elaborate(self, platform):
        m = Module()
        m.submodules.mesh = mesh = self.mesh

        lanes = Signal.like(self.act.payload.lanes)
        commit = Signal()
        with m.If(self.act.valid):
            m.d.comb += [
                lanes.eq(self.act.payload.lanes),
                commit.eq(self.act.payload.commit),
            ]
        for i in range(self.rows):
            a, c = lanes[i], commit
            for stage in range(self._skew_depth(i)):
                a_next = Signal(signed(8), name=f"skew_a_{i}_{stage}")
                c_next = Signal(name=f"skew_commit_{i}_{stage}")
                m.d.sync += [a_next.eq(a), c_next.eq(c)]
                a, c = a_next, c_next
            m.d.comb += [mesh.west[i].eq(a), mesh.west_commit[i].eq(c)]

        m.d.comb += [
            mesh.north_weight.eq(self.weight.payload),
            mesh.weight_shift.eq(self.weight.valid),
            self.south.eq(mesh.south),
        ]
        for j in range(self.cols):
            psum = mesh.south[j]
            for stage in range(self._align_depth(j)):
                psum_next = Signal(signed(32), name=f"align_{j}_{stage}")
                m.d.sync += psum_next.eq(psum)
                psum = psum_next
            m.d.comb += self.result.payload[j].eq(psum)

        valid = self.act.valid
        for stage in range(self.latency):
            valid_next = Signal(name=f"result_valid_{stage}")
            m.d.sync += valid_next.eq(valid)
            valid = valid_next
        m.d.comb += self.result.valid.eq(valid)
        return m


class ArrayMissingSkewRegister(_ArrayVariant):
    """The last PE row gets its activation one cycle early (one skew register missing)."""
    def _skew_depth(self, row):
        return row - 1 if row == self.rows - 1 else row


class ArrayShortAlignment(_ArrayVariant):
    """Column 0 leaves one cycle early (one alignment register missing)."""
    def _align_depth(self, col):
        return self.cols - 2 if col == 0 else self.cols - 1 - col


# ---------------------------------------------------------------------------------------- DMA
# These call the real DMA.elaborate and then override one output: in an Amaranth module the
# last assignment to a signal wins, and the DMA's own logic reads the overridden value.

class DMADropsARValid(DMA):
    """Withdraws ARVALID after one cycle of back-pressure, before the slave took it."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        stalled = Signal()
        m.d.sync += stalled.eq(self.bus.arvalid & ~self.bus.arready)
        with m.If(stalled):
            m.d.comb += self.bus.arvalid.eq(0)
        return m


class DMAUnstableWData(DMA):
    """Changes WDATA while WVALID waits for WREADY."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        stalled = Signal()
        m.d.sync += stalled.eq(self.bus.wvalid & ~self.bus.wready)
        with m.If(stalled):
            m.d.comb += self.bus.wdata.eq(0)
        return m


class DMAWLastStuck(DMA):
    """Marks every write beat as the last of its burst."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.comb += self.bus.wlast.eq(1)
        return m


class DMAIgnores4K(DMA):
    """Cuts bursts at 256 beats only, so a row that straddles a 4 KiB boundary is one burst."""
    def _next_burst(self, m, beat_addr, beats_left, name):
        lg = self.bus_bytes.bit_length() - 1
        length = Signal(range(257), name=f"{name}_burst_len")
        m.d.comb += length.eq(Mux(beats_left <= 256, beats_left, 256))
        return (length, (length - 1)[:8], length == beats_left,
                (beat_addr + (length << lg))[:32], beats_left - length)


# ------------------------------------------------------------------------------------ fetcher

class FetcherHighWaterPlusOne(Fetcher):
    """Asks for a batch with one word more held than leaves room for all of it."""
    high_water = Fetcher.high_water + 1
