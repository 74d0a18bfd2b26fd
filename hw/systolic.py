"""The mesh with its input skew and output alignment: rows in, aligned result rows out."""

from amaranth.hdl import Module, ResetInserter, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .mesh import Mesh
from .pe import dsp_pes, mac_pipeline


__all__ = ["SystolicArray", "ActivationRow"]


def ActivationRow(rows):
    """Payload of one activation row: R INT8 lanes and the weight commit flag."""
    return data.StructLayout({
        "lanes":  data.ArrayLayout(signed(8), rows),
        "commit": 1,
    })


class SystolicArray(wiring.Component):
    """Weight-stationary systolic array with input skew and output alignment.

    An activation row accepted in cycle ``t`` (``act.valid`` high) enters PE row ``i`` in cycle
    ``t + i`` (the skew), reaches PE(i, j) in cycle ``t + i + j``, and its C results leave
    together on ``result`` in cycle ``t + latency`` (the alignment), where
    ``latency = rows + cols - 1``. The array never stalls: ``act`` and ``result`` are
    always ready, so whoever consumes ``result`` must take a row every cycle it is valid.

    Weights: each ``weight`` transfer shifts one row of C weights into the top of the shadow
    registers and moves the others one row south, so after R transfers (weight row ``R-1``
    first, row ``0`` last) the shadow registers hold the tile. The first activation with
    ``commit`` set makes them active, on its own wavefront. PE(i, j) copies its shadow weight
    ``i + j`` cycles after that row is accepted, so no ``weight`` transfer may happen in the
    ``rows + cols - 2`` cycles after a committing row (the controller keeps this: a
    ``MATMUL`` waits for its last result; the formal proof in ``formal/`` assumes it).

    The PEs may pipeline their products (``mac_pipeline``, see :class:`hw.pe.PE`) without
    changing any of this: the mesh feeds them earlier and the alignment waits less, so
    ``act`` to ``result`` stays ``latency`` cycles, cycle for cycle. Only ``south`` (a test
    port) shows column ``j`` ``max(j, L) - j`` cycles later than in the plain array.

    Parameters
    ----------
    rows, cols : int
        R (reduction) and C (output) extent of the array.
    mac_pipeline : int or None
        Product pipeline stages of the PEs. ``None`` (the default) asks the platform at
        elaboration (:func:`hw.pe.mac_pipeline`: 0 without a platform, 3 for the FPGA build),
        limited to ``cols - 1``, the slack the alignment has.

    Attributes
    ----------
    act : In(stream.Signature(ActivationRow(rows), always_ready=True))
        Activation rows, streamed in.
    weight : In(stream.Signature(ArrayLayout(signed(8), cols), always_ready=True))
        Weight rows for the shadow registers.
    result : Out(stream.Signature(ArrayLayout(signed(32), cols), always_ready=True))
        Aligned result rows.
    south : Out(ArrayLayout(signed(32), cols))
        The mesh's south edge before alignment (for tests and traces).
    soft_reset : In(1)
        Resets the array's state (the weights, commit and valid flags) as the domain's
        reset does, one cycle later: it is registered once per PE row
        (``core_reset_row_<i>``, reaching that row's PEs) and once for the skew and valid
        flags (``core_reset_edges``), so that no one flip-flop drives a reset to the whole
        array (on the FPGA that net, spread over the DSP rows, was a long path).
    """
    def __init__(self, rows, cols, *, mac_pipeline=None):
        if not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be a positive integer, not {rows!r}")
        if not isinstance(cols, int) or cols < 1:
            raise ValueError(f"cols must be a positive integer, not {cols!r}")
        if mac_pipeline is not None and (not isinstance(mac_pipeline, int)
                                         or not 0 <= mac_pipeline <= cols - 1):
            raise ValueError(f"mac_pipeline must be None or an integer from 0 to cols - 1 = "
                             f"{cols - 1}, not {mac_pipeline!r}")
        self.rows = rows
        self.cols = cols
        self.latency = rows + cols - 1
        self.mac_pipeline = mac_pipeline
        #: The mesh; replaced at elaboration by a pipelined one if the platform asks for it.
        self.mesh = Mesh(rows, cols, mac_pipeline=mac_pipeline or 0)
        super().__init__({
            "act":    In(stream.Signature(ActivationRow(rows), always_ready=True)),
            "weight": In(stream.Signature(data.ArrayLayout(signed(8), cols),
                                          always_ready=True)),
            "result": Out(stream.Signature(data.ArrayLayout(signed(32), cols),
                                           always_ready=True)),
            "south":  Out(data.ArrayLayout(signed(32), cols)),
            "soft_reset": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        pipeline = self.mac_pipeline
        if pipeline is None:
            pipeline = min(mac_pipeline(platform), self.cols - 1)
        budget = dsp_pes(platform)
        if (pipeline, budget) != (self.mesh.mac_pipeline, self.mesh.dsp_pes):
            # The plain mesh made in __init__ is not used: say so, or Amaranth warns.
            for block in [self.mesh, *(pe for row in self.mesh.pes for pe in row)]:
                block._MustUse__silence = True
            self.mesh = Mesh(self.rows, self.cols, mac_pipeline=pipeline, dsp_pes=budget)
        m.submodules.mesh = mesh = self.mesh

        # The soft reset's copies: one per PE row, one for the skew and valid flags (built in
        # ``edges``, a module of their own so that this one copy resets them).
        edge_reset = Signal(name="core_reset_edges")
        m.d.sync += edge_reset.eq(self.soft_reset)
        for i in range(self.rows):
            row_reset = Signal(name=f"core_reset_row_{i}")
            m.d.sync += row_reset.eq(self.soft_reset)
            m.d.comb += mesh.reset_row[i].eq(row_reset)
        edges = Module()
        m.submodules.edges = ResetInserter(edge_reset)(edges)

        # Idle cycles feed zero activations, so nothing but real rows ever reaches a psum.
        lanes = Signal.like(self.act.payload.lanes)
        commit = Signal()
        with m.If(self.act.valid):
            m.d.comb += [
                lanes.eq(self.act.payload.lanes),
                commit.eq(self.act.payload.commit),
            ]

        # Skew: row i is delayed by i registers, the time a partial sum takes to travel i rows.
        for i in range(self.rows):
            a, c = lanes[i], commit
            for stage in range(i):
                a_next = Signal(signed(8), name=f"skew_a_{i}_{stage}", reset_less=True)
                c_next = Signal(name=f"skew_commit_{i}_{stage}")
                edges.d.sync += [a_next.eq(a), c_next.eq(c)]
                a, c = a_next, c_next
            m.d.comb += [mesh.west[i].eq(a), mesh.west_commit[i].eq(c)]

        m.d.comb += [
            mesh.north_weight.eq(self.weight.payload),
            mesh.weight_shift.eq(self.weight.valid),
            self.south.eq(mesh.south),
        ]

        # Alignment: column j leaves the mesh j cycles after column 0 (max(j, L) with a
        # pipelined mesh), so it is delayed by (cols - 1 - j) registers (cols - 1 - max(j, L))
        # to let the whole row leave together.
        for j in range(self.cols):
            psum = mesh.south[j]
            for stage in range(self.cols - 1 - max(j, pipeline)):
                psum_next = Signal(signed(32), name=f"align_{j}_{stage}", reset_less=True)
                m.d.sync += psum_next.eq(psum)
                psum = psum_next
            m.d.comb += self.result.payload[j].eq(psum)

        valid = self.act.valid
        for stage in range(self.latency):
            valid_next = Signal(name=f"result_valid_{stage}")
            edges.d.sync += valid_next.eq(valid)
            valid = valid_next
        m.d.comb += self.result.valid.eq(valid)

        return m
