"""One weight-stationary processing element."""

from amaranth.hdl import ClockSignal, Const, Instance, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


__all__ = ["PE", "MAX_MAC_PIPELINE", "ECP5_MAC_PIPELINE", "mac_pipeline", "dsp_pes", "mult18x18d"]


#: Deepest product pipeline a PE builds (see :class:`PE`).
MAX_MAC_PIPELINE = 4
#: The product pipeline of every ECP5 build, out of context and on a board: a MULT18X18D with
#: registered inputs and output, and one more register after it.
ECP5_MAC_PIPELINE = 4


def dsp_pes(platform):
    """How many PEs may take a DSP block on this platform (``npu_dsp_pes``; all of them if the
    platform does not say). It limits the PEs only: the requantizer's and the decoder's
    products stay on DSPs (``fpga.flow.dsp_budget`` leaves theirs out of the count)."""
    count = getattr(platform, "npu_dsp_pes", None)
    if count is not None and (not isinstance(count, int) or count < 0):
        raise ValueError(f"npu_dsp_pes must be None or a non-negative integer, not {count!r}")
    return count


def mac_pipeline(platform):
    """Product pipeline stages the platform asks the PEs for: ``npu_mac_pipeline`` of the
    platform object, 0 (the plain PE) without one. The FPGA builds' platforms
    (``fpga.flow.ECP5Target``, ``fpga.board.BOARDS``) ask for :data:`ECP5_MAC_PIPELINE`."""
    stages = getattr(platform, "npu_mac_pipeline", 0)
    if not isinstance(stages, int) or not 0 <= stages <= MAX_MAC_PIPELINE:
        raise ValueError(f"npu_mac_pipeline must be an integer from 0 to {MAX_MAC_PIPELINE}, "
                         f"not {stages!r}")
    return stages


class PE(wiring.Component):
    """Weight-stationary INT8 multiply-accumulate cell with a shadow weight register.

    Every cycle the PE computes ``psum_out <= psum_in + weight * a_in`` and forwards the
    activation east (``a_out <= a_in``); both outputs are registered, so a value reaches the
    neighbour one cycle later, exactly as in the seeds' section 1.2 trace.

    The *shadow* weight is loaded from the north (``w_in``, shifted south through ``w_out``
    while ``w_shift`` is high) without disturbing the *active* weight. ``commit_in`` travels
    east with the activation it belongs to: in the cycle it is high the PE computes with the
    shadow weight and makes it the active one, so the new weights take effect exactly on the
    wavefront of the first activation of the next tile.

    With ``mac_pipeline = L > 0`` the product ``weight * a_in`` of cycle ``x`` passes ``L``
    registers and is added in cycle ``x + L``: ``psum_out <= psum_in + product`` where
    ``product`` is ``weight * a_in`` from ``L`` cycles before. That is the form an FPGA DSP
    block runs fast (``L = 3``: the PE's own ``a_out`` and active-weight flip-flops, then the
    DSP's input and output registers; ``L = 4`` adds a flip-flop next to the DSP, so the
    long route from the DSP to the adder's carry chain gets a cycle of its own).
    :class:`hw.mesh.Mesh` feeds such PEs their activations ``L`` cycles early so that the
    array's timing stays the same. It also gives them ``w_in`` and ``w_shift`` a cycle late
    (to register the enable once per row), so a pipelined PE commits the value its shadow
    register is about to take: ``w_in`` if ``w_shift`` is high, else ``w_out``.

    On an ECP5 platform (``platform.family == "ecp5"``) a pipelined PE instantiates a
    MULT18X18D; anywhere else (simulation) it builds the same registers in plain logic.

    Parameters
    ----------
    mac_pipeline : int
        ``L``, from 0 (the product is added in the cycle it is formed) to 4.
    dsp : bool
        On ECP5, put the pipelined product on a MULT18X18D (default). Without, the same
        registers are built around a plain ``*``, which Yosys maps as it likes (LUTs when
        the device has run out of DSPs and synthesis is told ``-nodsp``).

    Attributes
    ----------
    a_in : In(signed(8))
        Activation from the west.
    a_out : Out(signed(8))
        Activation to the east, one cycle later.
    commit_in, commit_out : In(1), Out(1)
        Weight commit flag, travelling with the activation.
    psum_in : In(signed(32))
        Partial sum from the north.
    psum_out : Out(signed(32))
        Partial sum to the south: ``psum_in`` plus the product due in the previous cycle.
    w_in, w_out : In(signed(8)), Out(signed(8))
        Shadow weight shift chain, north to south.
    w_shift : In(1)
        Shift the shadow weight chain by one PE.
    """
    a_in: In(signed(8))
    a_out: Out(signed(8))
    commit_in: In(1)
    commit_out: Out(1)
    psum_in: In(signed(32))
    psum_out: Out(signed(32))
    w_in: In(signed(8))
    w_out: Out(signed(8))
    w_shift: In(1)

    def __init__(self, mac_pipeline=0, *, dsp=True):
        if (not isinstance(mac_pipeline, int) or isinstance(mac_pipeline, bool)
                or not 0 <= mac_pipeline <= MAX_MAC_PIPELINE):
            raise ValueError(f"mac_pipeline must be an integer from 0 to {MAX_MAC_PIPELINE}, "
                             f"not {mac_pipeline!r}")
        self.mac_pipeline = mac_pipeline
        self.dsp = bool(dsp)
        super().__init__()

    def elaborate(self, platform):
        m = Module()

        active = Signal(signed(8))
        # A pipelined PE's shadow shifts come a cycle late (see Mesh): commit what comes in.
        shadow = self.w_out if self.mac_pipeline == 0 else Mux(self.w_shift, self.w_in,
                                                               self.w_out)
        weight = Mux(self.commit_in, shadow, active)

        # The data registers (activation, products, partial sum) have no reset: only the
        # weights and the commit flag are state; what flows through is qualified by the
        # array's valid flags. A reset would reach thousands of flip-flops (a long net).
        a_out = Signal(signed(8), name="a_reg", reset_less=True)
        psum_out = Signal(signed(32), name="psum_reg", reset_less=True)
        m.d.comb += [self.a_out.eq(a_out), self.psum_out.eq(psum_out)]
        m.d.sync += [
            a_out.eq(self.a_in),
            self.commit_out.eq(self.commit_in),
        ]
        if self.mac_pipeline == 0:
            m.d.sync += psum_out.eq(self.psum_in + weight * self.a_in)
        with m.If(self.commit_in):
            m.d.sync += active.eq(shadow)
        with m.If(self.w_shift):
            m.d.sync += self.w_out.eq(self.w_in)

        if self.mac_pipeline == 0:
            return m

        # After the edge that ends cycle x, a_out holds a_in(x) and active holds weight(x):
        # from L = 3 on, that first product stage is free. The multiplier takes up to two of
        # the other stages (its input and output registers); any left are plain registers.
        if self.mac_pipeline >= 3:
            operands, stages = (a_out, active), self.mac_pipeline - 1
        else:
            operands, stages = (self.a_in, weight), self.mac_pipeline
        multiplier_stages = min(stages, 2)
        value = Signal(signed(16))
        if self.dsp and getattr(platform, "family", None) == "ecp5":
            mult18x18d(m, *operands, value, registered_inputs=(multiplier_stages == 2))
        else:
            product = operands[0] * operands[1]
            for stage in range(multiplier_stages):
                registered = Signal(signed(16), name=f"product_stage_{stage}",
                                    reset_less=True)
                m.d.sync += registered.eq(product)
                product = registered
            m.d.comb += value.eq(product)
        for stage in range(stages - multiplier_stages):
            registered = Signal(signed(16), name=f"product_{stage}", reset_less=True)
            m.d.sync += registered.eq(value)
            value = registered
        m.d.sync += psum_out.eq(self.psum_in + value)
        return m


def mult18x18d(m, a, b, product, *, registered_inputs, name="multiplier"):
    """``product`` <= ``a * b`` (signed, up to 18 bits each) on an ECP5 MULT18X18D, the
    submodule ``name`` of ``m``: output register, and input registers when
    ``registered_inputs``, on the ``sync`` clock. An operand is sign-extended from its top
    bit (give an unsigned one a zero bit on top).

    Its registers are not reset: they hold only values in flight, never state, and a reset
    net to every DSP would be the slowest net of the array. After a reset, the at most two
    stale products they still hold are added to partial sums of rows that entered the array
    before the reset, which the array's result-valid chain (reset) has already dropped; the
    rows after the reset are exact."""
    def sign_extend(value):
        return [value[min(bit, len(value) - 1)] for bit in range(18)]

    clock = "CLK0" if registered_inputs else "NONE"
    ports = {
        "i_SIGNEDA": Const(1), "i_SIGNEDB": Const(1),
        "i_SOURCEA": Const(0), "i_SOURCEB": Const(0),
        "i_CLK0": ClockSignal("sync"), "i_CE0": Const(1), "i_RST0": Const(0),
    }
    for port in ("CLK", "CE", "RST"):
        for index in (1, 2, 3):
            ports[f"i_{port}{index}"] = Const(0)
    for bit, (a_bit, b_bit) in enumerate(zip(sign_extend(a), sign_extend(b))):
        ports[f"i_A{bit}"] = a_bit
        ports[f"i_B{bit}"] = b_bit
        ports[f"i_C{bit}"] = Const(0)
    for bit in range(len(product)):
        ports[f"o_P{bit}"] = product[bit]
    m.submodules[name] = Instance(
        "MULT18X18D",
        p_REG_INPUTA_CLK=clock, p_REG_INPUTA_CE="CE0", p_REG_INPUTA_RST="RST0",
        p_REG_INPUTB_CLK=clock, p_REG_INPUTB_CE="CE0", p_REG_INPUTB_RST="RST0",
        p_REG_INPUTC_CLK="NONE",
        p_REG_PIPELINE_CLK="NONE",
        p_REG_OUTPUT_CLK="CLK0", p_REG_OUTPUT_CE="CE0", p_REG_OUTPUT_RST="RST0",
        p_CLK0_DIV="ENABLED", p_CLK1_DIV="ENABLED", p_CLK2_DIV="ENABLED",
        p_CLK3_DIV="ENABLED", p_HIGHSPEED_CLK="NONE", p_GSR="DISABLED",
        p_CAS_MATCH_REG="FALSE", p_SOURCEB_MODE="B_SHIFT", p_MULT_BYPASS="DISABLED",
        p_RESETMODE="SYNC",
        **ports,
    )
