"""What the compiler decides and what it produces: one plan type and one program type, for
plain GEMMs, quantized GEMMs and convolutions alike."""

from dataclasses import dataclass

from hw.isa import INSTR_BYTES
from .. import codec
from ..errors import NPUTypeError, NPUValueError, PlanError


__all__ = ["SCHEDULES", "Plan", "Program", "ceil_div", "counted_plan", "check_plan",
           "check_schedule", "activation_capacity", "least_traffic"]


#: Accepted values of the ``schedule`` argument.
SCHEDULES = ("auto", "overlap", "resident", "streaming")

#: Scratchpad row where the weight tile is loaded; activations start right after it.
WEIGHT_BASE = 0
#: Most rows one DMA or MATMUL instruction moves: its ``rows`` field is 16 bits wide.
MAX_INSTRUCTION_ROWS = (1 << 16) - 1


def ceil_div(numerator, denominator):
    return -(-numerator // denominator)


@dataclass(frozen=True)
class Plan:
    """How a layer is placed on the array, and what it costs.

    A plain GEMM (:func:`~sw.compiler.plan_gemm`) is one tap; a quantized layer
    (:func:`~sw.compiler.plan_quantized`) sums ``taps`` GEMMs of ``k_tap`` rows each (the
    kernel taps of a convolution).

    Attributes
    ----------
    config : str
        Name of the configuration (``RxC``).
    rows, cols : int
        R and C of the array.
    m, k, n : int
        Output rows (rows of A, or output pixels), reduction length of one output
        (``taps * k_tap``) and output columns (channels).
    schedule : str
        ``"overlap"``, ``"resident"`` or ``"streaming"`` (see :mod:`sw.compiler`).
    k_tiles, n_tiles : int
        ``ceil(k_tap / rows)`` and ``ceil(n / cols)``.
    weight_tiles : int
        Distinct weight tiles: ``taps * k_tiles * n_tiles``.
    m_blocks : int
        Blocks of output rows, each processed against every weight tile.
    block_rows : int
        Rows of a block (the last block may have fewer).
    weight_loads : int
        ``PRELOAD`` instructions.
    spad_rows_used, acc_rows_used : int
        Highest scratchpad / accumulator row used, plus one.
    dram_bytes_read, dram_bytes_written : int
        Bytes the DMA instructions move (instruction fetch excluded; see ``program_bytes``).
    instructions : int
        Program length, ``END`` included.
    group_tiles : int
        n-tiles that share a block of the overlap schedule (1 otherwise).
    taps : int
        Kernel taps (1 for a GEMM, ``KH * KW`` for a convolution), each a ``k_tap x n``
        weight matrix.
    k_tap : int
        Reduction length of one tap (the input channels of a convolution); ``k`` by default.
    """
    config: str
    rows: int
    cols: int
    m: int
    k: int
    n: int
    schedule: str
    k_tiles: int
    n_tiles: int
    weight_tiles: int
    m_blocks: int
    block_rows: int
    weight_loads: int
    spad_rows_used: int
    acc_rows_used: int
    dram_bytes_read: int
    dram_bytes_written: int
    instructions: int
    group_tiles: int = 1
    taps: int = 1
    k_tap: "int | None" = None

    def __post_init__(self):
        if self.k_tap is None:
            object.__setattr__(self, "k_tap", self.k)

    @property
    def program_bytes(self):
        """Bytes of the program in DRAM (each instruction is fetched once)."""
        return self.instructions * INSTR_BYTES

    @property
    def macs(self):
        """Useful multiply-accumulates: ``m * k * n``."""
        return self.m * self.k * self.n

    @property
    def tile_fill(self):
        """Useful MACs over the MAC slots that the ``MATMUL`` instructions occupy.

        A ragged tile takes as many cycles as a full one (seeds, section 4.1), so this is the
        best array utilization the plan can reach, before any load or store overhead.
        """
        return self.macs / (self.m * self.weight_tiles * self.rows * self.cols)

    @property
    def mapping_efficiency(self):
        """Useful PE-cells over provisioned PE-cells of the weight tiles (seeds section 4.1):
        ``k * n / (weight_tiles * R * C)``; equal to :attr:`tile_fill`."""
        return (self.k * self.n) / (self.weight_tiles * self.rows * self.cols)

    def summary(self):
        """A few readable lines about the plan."""
        taps = f"{self.taps} taps x " if self.taps > 1 else ""
        return (f"{self.weight_tiles} weight tiles ({taps}{self.k_tiles} k-tiles x "
                f"{self.n_tiles} n-tiles of {self.rows}x{self.cols}), tile fill "
                f"{self.tile_fill:.1%}\n"
                f"{self.m_blocks} m-block(s) of up to {self.block_rows} rows, {self.schedule} "
                f"schedule, {self.weight_loads} weight loads\n"
                f"scratchpad rows {self.spad_rows_used}, accumulator rows "
                f"{self.acc_rows_used}, {self.instructions} instructions\n"
                f"DRAM bytes: {self.dram_bytes_read} read, {self.dram_bytes_written} written, "
                f"{self.program_bytes} of program")


def check_schedule(schedule):
    """Refuse a ``schedule`` that is not one of :data:`SCHEDULES`."""
    if schedule not in SCHEDULES:
        raise NPUValueError(f"schedule must be one of {', '.join(SCHEDULES)}, "
                            f"not {schedule!r}")
    return schedule


def activation_capacity(config):
    """Scratchpad rows free for activations next to one weight tile (at least 1)."""
    capacity = config.spad_depth - config.rows
    if capacity < 1:
        raise PlanError(f"config {config.name}: a scratchpad of {config.spad_depth} rows "
                        f"cannot hold a weight tile of {config.rows} rows plus one "
                        f"activation row")
    return capacity


def least_traffic(candidates):
    """The candidate plan that moves the fewest bytes over the DRAM bus (data plus program);
    the first one on a tie (the resident schedule comes first)."""
    return min(candidates, key=lambda plan: (plan.dram_bytes_read + plan.dram_bytes_written
                                             + plan.program_bytes))


def counted_plan(config, emit, *, m, k_tap, n, schedule, block_rows, taps=1, group_tiles=1):
    """The :class:`Plan` whose counts are those of the instructions ``emit`` (an
    :class:`~sw.compiler.emitter.Emitter`) was given."""
    k_tiles, n_tiles = ceil_div(k_tap, config.rows), ceil_div(n, config.cols)
    return Plan(
        config=config.name, rows=config.rows, cols=config.cols, m=m, k=taps * k_tap, n=n,
        taps=taps, k_tap=k_tap, schedule=schedule, k_tiles=k_tiles, n_tiles=n_tiles,
        weight_tiles=taps * k_tiles * n_tiles, m_blocks=ceil_div(m, block_rows),
        block_rows=block_rows, weight_loads=emit.weight_loads,
        spad_rows_used=emit.spad_rows_used, acc_rows_used=emit.acc_rows_used,
        dram_bytes_read=emit.bytes_read, dram_bytes_written=emit.bytes_written,
        instructions=emit.instructions, group_tiles=group_tiles)


def check_plan(plan, config, schedule, *, m, k, n, taps=1):
    """Check that ``plan``, given to a ``compile_*`` function, was made for this layer on
    ``config`` (and with the schedule asked for, unless that is ``"auto"``)."""
    if not isinstance(plan, Plan):
        raise NPUTypeError(f"plan must be a Plan, not {plan!r}")
    made_for = (plan.config, plan.m, plan.k, plan.n, plan.taps)
    asked = (config.name, m, k, n, taps)
    if made_for != asked:
        raise NPUValueError(f"plan was made for (config, m, k, n, taps) = {made_for}, not "
                            f"{asked}")
    if schedule not in ("auto", plan.schedule):
        raise NPUValueError(f"plan has the {plan.schedule} schedule, but schedule "
                            f"{schedule!r} was asked for")
    return plan


@dataclass(frozen=True)
class Program:
    """A compiled program.

    Attributes
    ----------
    words : list of int
        The 128-bit instruction words, ``END`` last.
    plan : Plan
        The plan, with its counts taken from ``words``.
    addresses : dict
        The DRAM addresses the program was compiled for, by argument name:
        ``a_addr, b_addr, c_addr`` for a GEMM; ``a_addr, b_addr, bias_addr, quant_addr,
        y_addr`` for a quantized one (``x_addr`` and ``w_addr`` in place of the first two for
        a convolution).
    """
    words: list
    plan: Plan
    addresses: dict

    @property
    def bytes(self):
        """The program as it is laid out in DRAM: 16 bytes per instruction, little-endian."""
        return codec.pack_words(self.words)

    @property
    def body(self):
        """The words without the final ``END``: programs chain by concatenating bodies (each
        quantized layer loads its own bias and quantization parameters), then one ``END``."""
        return self.words[:-1]

    def __len__(self):
        return len(self.words)
