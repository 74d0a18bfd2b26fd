"""The R x C grid of processing elements, wired to their neighbours and nothing else."""

from amaranth.hdl import Module, ResetInserter, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .pe import PE


__all__ = ["Mesh"]


class Mesh(wiring.Component):
    """A grid of :class:`PE`: PE(i, j) sits in row i (reduction) and column j (output).

    Activations enter row i at the west edge and move east; partial sums enter every column
    at the north edge as zero and move south; shadow weights enter at the north edge and shift
    south. The mesh has no skew or alignment of its own (see :class:`SystolicArray`).

    With ``mac_pipeline = L`` (see :class:`PE`) each PE adds its product ``L`` cycles after
    it saw the activation, so the activation must reach it ``L`` cycles earlier than in the
    plain array: the first ``L + 1`` columns all take the row's west input, and the
    east-moving chain starts at column ``L``. Column ``j``'s partial sums then run
    ``max(j, L) - j`` cycles behind the plain array's, which the alignment in
    :class:`SystolicArray` absorbs (it has ``C - 1 - j`` registers for column ``j``, so
    ``L <= C - 1``).

    A pipelined mesh also takes ``north_weight`` and ``weight_shift`` one cycle late, through
    registers of its own, the shift enable once per row (``weight_shift_row_<i>``): the
    enable reaches all ``8 R C`` shadow flip-flops, and one net that wide would be the
    slowest of the array. Its PEs commit the value their shadow register is about to take,
    which is the value the plain PE's shadow register holds in that cycle.

    Parameters
    ----------
    rows, cols : int
        R and C.
    mac_pipeline : int
        ``L``, the product pipeline of every PE (0: the plain PE).
    dsp_pes : int or None
        On an FPGA, only the first ``dsp_pes`` PEs (row by row) put their product on a DSP
        block; None: all.

    Attributes
    ----------
    west : In(ArrayLayout(signed(8), rows))
        Activation entering each row.
    west_commit : In(ArrayLayout(1, rows))
        Weight commit flag entering each row with its activation.
    north_weight : In(ArrayLayout(signed(8), cols))
        Shadow weight entering the top of each column.
    weight_shift : In(1)
        Shift every column's shadow weights one PE south.
    south : Out(ArrayLayout(signed(32), cols))
        Partial sum leaving the bottom PE of each column (registered in that PE).
    reset_row : In(ArrayLayout(1, rows))
        A reset of each row's PEs (and its weight shift enable), beside the domain's: the
        soft reset's copy for that row (:class:`SystolicArray`).
    """
    def __init__(self, rows, cols, *, mac_pipeline=0, dsp_pes=None):
        if not isinstance(mac_pipeline, int) or not 0 <= mac_pipeline <= max(cols - 1, 0):
            raise ValueError(f"mac_pipeline must be an integer from 0 to cols - 1 = "
                             f"{cols - 1}, not {mac_pipeline!r}")
        self.rows = rows
        self.cols = cols
        self.mac_pipeline = mac_pipeline
        #: The PEs, ``pes[i][j]``; made here so that tests and traces can watch them.
        self.pes = [[PE(mac_pipeline, dsp=dsp_pes is None or i * cols + j < dsp_pes)
                     for j in range(cols)] for i in range(rows)]
        self.dsp_pes = dsp_pes
        super().__init__({
            "west":         In(data.ArrayLayout(signed(8), rows)),
            "west_commit":  In(data.ArrayLayout(1, rows)),
            "north_weight": In(data.ArrayLayout(signed(8), cols)),
            "weight_shift": In(1),
            "south":        Out(data.ArrayLayout(signed(32), cols)),
            "reset_row":    In(data.ArrayLayout(1, rows)),
        })

    def elaborate(self, platform):
        m = Module()

        pes = self.pes
        north_weight, row_shifts = self.north_weight, [self.weight_shift] * self.rows
        if self.mac_pipeline:
            north_weight = Signal.like(self.north_weight, name="north_weight_late")
            m.d.sync += north_weight.eq(self.north_weight)
            row_shifts = [Signal(name=f"weight_shift_row_{i}") for i in range(self.rows)]
            for i, shift in enumerate(row_shifts):
                m.d.sync += shift.eq(self.weight_shift & ~self.reset_row[i])
        for i, pe_row in enumerate(pes):
            for j, pe in enumerate(pe_row):
                m.submodules[f"pe_{i}_{j}"] = ResetInserter(self.reset_row[i])(pe)
                m.d.comb += pe.w_shift.eq(row_shifts[i])
                if j <= self.mac_pipeline:
                    m.d.comb += [
                        pe.a_in.eq(self.west[i]),
                        pe.commit_in.eq(self.west_commit[i]),
                    ]
                else:
                    m.d.comb += [
                        pe.a_in.eq(pe_row[j - 1].a_out),
                        pe.commit_in.eq(pe_row[j - 1].commit_out),
                    ]
                if i == 0:
                    m.d.comb += [
                        pe.psum_in.eq(0),
                        pe.w_in.eq(north_weight[j]),
                    ]
                else:
                    m.d.comb += [
                        pe.psum_in.eq(pes[i - 1][j].psum_out),
                        pe.w_in.eq(pes[i - 1][j].w_out),
                    ]
        for j in range(self.cols):
            m.d.comb += self.south[j].eq(pes[self.rows - 1][j].psum_out)

        return m
