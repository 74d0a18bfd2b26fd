"""Property set 2: a small :class:`hw.systolic.SystolicArray` computes exact dot products."""

from amaranth.asserts import AnyConst, AnySeq
from amaranth.hdl import (Assert, Assume, Cat, Cover, Elaboratable, Module, Mux, ResetSignal,
                          Signal, signed)
from amaranth.lib import data

from hw.systolic import SystolicArray


__all__ = ["SystolicProperties"]


class SystolicProperties(Elaboratable):
    """Two weight tiles ``W1`` and ``W2`` (``AnyConst``) are loaded by the documented protocol
    and committed on the first activation row after each load; every other activation row is
    free (``AnySeq``: whether there is one, and its lanes). For each row accepted in cycle
    ``t`` with lanes ``a``, computed with tile ``W`` (``W1`` from its commit on, ``W2`` from
    its own commit on):

    * ``result`` is valid in cycle ``t + R + C - 1`` exactly, with
      ``result[j] == sum_i a[i] * W[i][j]``, and is not valid in any cycle that no row was
      accepted ``R + C - 1`` cycles before;
    * the mesh's south edge shows column ``j`` of it in cycle ``t + R + j``: PE(R-1, j)
      computes it in cycle ``t + R - 1 + j``, as in the ``2x2`` trace of
      ``docs/architecture.md``.

    The schedule, in cycles from reset: ``W1`` row ``R-1`` first, one row per cycle in cycles
    ``0 .. R-1``; the committing row in cycle ``R``; ``W2`` in cycles ``T .. T+R-1`` with
    ``T = 2R + C - 2``, the first cycle in which a weight transfer leaves the commit of ``W1``
    intact (PE(i, j) copies its shadow weight ``i + j`` cycles after the committing row was
    accepted, so the shadow registers must hold still for ``R + C - 2`` cycles); the
    committing row of ``W2`` in cycle ``T + R``. Rows are free in every other cycle from
    ``R + 1`` on, so they stream while ``W2`` shifts in, and ``weight.payload`` is free
    whenever ``weight.valid`` is low.

    Parameters
    ----------
    rows, cols : int
        Shape of the array.
    array : SystolicArray, optional
        The design under proof; a fresh ``SystolicArray(rows, cols)`` by default.
    """
    def __init__(self, rows, cols, array=None):
        self.array = SystolicArray(rows, cols) if array is None else array
        if (self.array.rows, self.array.cols) != (rows, cols):
            raise ValueError(f"array must be {rows}x{cols}, not "
                             f"{self.array.rows}x{self.array.cols}")
        self.rows = rows
        self.cols = cols
        self.latency = rows + cols - 1
        self.second_load = 2 * rows + cols - 2
        self.second_commit = self.second_load + rows

    @property
    def min_depth(self):
        """Cycles until the first result row computed with ``W2`` has left the array."""
        return self.second_commit + self.latency + 1

    def elaborate(self, platform):
        m = Module()
        m.submodules.array = array = self.array
        rows, cols, latency = self.rows, self.cols, self.latency

        m.d.comb += Assume(~ResetSignal())

        cycle = Signal(range(self.min_depth + 1))
        with m.If(cycle != self.min_depth):
            m.d.sync += cycle.eq(cycle + 1)

        tile = data.ArrayLayout(data.ArrayLayout(signed(8), cols), rows)
        tile_1 = Signal(tile)
        tile_2 = Signal(tile)
        m.d.comb += [
            tile_1.eq(AnyConst(len(tile_1.as_value()))),
            tile_2.eq(AnyConst(len(tile_2.as_value()))),
        ]

        # Weight stream: row R-1 first, one row per cycle.
        m.d.comb += [
            array.weight.valid.eq(0),
            array.weight.payload.eq(AnySeq(len(array.weight.payload.as_value()))),
        ]
        for start, weights in ((0, tile_1), (self.second_load, tile_2)):
            for k in range(rows):
                with m.If(cycle == start + k):
                    m.d.comb += [
                        array.weight.valid.eq(1),
                        array.weight.payload.eq(weights[rows - 1 - k]),
                    ]

        # Activation stream: free, but none before the first commit, and a committing row
        # right after each load.
        m.d.comb += [
            array.act.valid.eq(AnySeq(1)),
            array.act.payload.lanes.eq(AnySeq(len(array.act.payload.lanes.as_value()))),
            array.act.payload.commit.eq(0),
        ]
        with m.If(cycle < rows):
            m.d.comb += array.act.valid.eq(0)
        with m.If((cycle == rows) | (cycle == self.second_commit)):
            m.d.comb += [array.act.valid.eq(1), array.act.payload.commit.eq(1)]

        # Expected result of the row accepted in this cycle. The lanes are gated by valid just
        # as SystolicArray gates them (the same for a valid row) so that the solver sees the
        # same multiplier operands in the specification and in the design.
        lanes = Signal.like(array.act.payload.lanes)
        with m.If(array.act.valid):
            m.d.comb += lanes.eq(array.act.payload.lanes)
        weights = Signal(tile)
        m.d.comb += weights.eq(Mux(cycle < self.second_commit, tile_1, tile_2))
        expected = Signal(data.ArrayLayout(signed(32), cols))
        for j in range(cols):
            partial = 0
            for i in range(rows):
                partial_next = Signal(signed(32), name=f"ref_partial_{i}_{j}")
                m.d.comb += partial_next.eq(partial + weights[i][j] * lanes[i])
                partial = partial_next
            m.d.comb += expected[j].eq(partial)

        # Delay lines: what each output must show, and when.
        delayed_valid = [array.act.valid]
        delayed_row = [expected]
        for stage in range(latency):
            valid_next = Signal(name=f"ref_valid_{stage}")
            row_next = Signal.like(expected, name=f"ref_row_{stage}")
            m.d.sync += [valid_next.eq(delayed_valid[-1]), row_next.eq(delayed_row[-1])]
            delayed_valid.append(valid_next)
            delayed_row.append(row_next)

        m.d.comb += Assert(array.result.valid == delayed_valid[latency])
        with m.If(delayed_valid[latency]):
            for j in range(cols):
                m.d.comb += Assert(array.result.payload[j] == delayed_row[latency][j])
        for j in range(cols):
            with m.If(delayed_valid[rows + j]):
                m.d.comb += Assert(array.south[j] == delayed_row[rows + j][j])

        # Non-vacuity: the first W2 result leaves with non-zero, different tiles.
        m.d.comb += Cover((cycle == self.second_commit + latency) & array.result.valid &
                          (tile_1.as_value() != tile_2.as_value()) &
                          Cat(array.result.payload[j] != 0 for j in range(cols)).all())
        return m
