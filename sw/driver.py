"""The host driver: run an INT8 GEMM on the NPU (or its model) and read back the result.

DRAM layout used by :func:`gemm` (every region starts 64-byte aligned)::

    0x0000          64 zero bytes: a program pointer of 0 hits an illegal (zero) opcode
    0x0040          program, 16 bytes per instruction, END last
    a_addr          A, INT8, M x K row-major
    b_addr          B, INT8, K x N row-major
    c_addr          C, INT32 little-endian, M x N row-major, filled with a 0xA5 poison
                    pattern before the run so that a missed store cannot read as zero
    size            the end of C rounded up to a multiple of 4 KiB

The program sits below the data, so a store that ran past C could not overwrite it.

Quantized layers (:func:`qgemm`, :func:`sw.conv.conv2d`) use :func:`layout_regions`: the same
zero page and program, then one 64-byte aligned region per operand. For :func:`qgemm`::

    a       A, INT8, M x K row-major
    b       B, INT8, K x N row-major
    bias    N INT32 little-endian: bias - a_zero_point * B.sum(axis=0)
    quant   N INT32 multipliers, then N INT32 shifts (LOAD_QUANT reads both rows of an
            n-tile with dram_stride = 4 N); given ``scale=`` instead (the float mode),
            N float32 scales, then N zero words
    y       Y, INT8, M x N row-major, poisoned with 0xA5 before the run

:func:`run_jobs` runs any mix of prepared jobs (:func:`prepare_gemm`, :func:`prepare_qgemm`,
:func:`sw.conv.prepare_conv2d`) in one backend run: one simulation on the RTL backends.
"""

from dataclasses import dataclass

import numpy as np

from hw.config import NPUConfig
from . import backend
from .compiler import compile_gemm, compile_qgemm, plan_gemm, plan_qgemm
from .errors import NPURunError, NPUValueError
from .operands import (check_config, check_config_and_sim, check_gemm_operands,
                       check_qgemm_operands)
from .reference import INT32_MAX, INT32_MIN, reference_gemm, reference_qgemm, wrap_int32


__all__ = ["DramLayout", "GemmResult", "gemm", "gemm_batch", "reference_gemm", "layout_dram",
           "PROGRAM_ADDR", "REGION_ALIGN", "ROW_PITCH", "DRAM_GRANULE", "POISON",
           "RegionLayout", "QuantResult", "PreparedJob", "qgemm", "qgemm_batch",
           "reference_qgemm", "layout_regions", "prepare_gemm", "prepare_qgemm", "run_jobs",
           "fold_zero_point", "quant_region", "place_region", "wrap_int32"]


#: Byte address of the program: non-zero so that a zero program pointer cannot run it.
PROGRAM_ADDR = 0x40
#: Alignment of every DRAM region.
REGION_ALIGN = 64
#: The DRAM size is rounded up to a multiple of this.
DRAM_GRANULE = 4096
#: Byte written over C before the run.
POISON = 0xA5
#: Rows of A and B start at multiples of this in DRAM (the widest AXI beat): a k-slice of A
#: or a row of a weight tile then takes as few bus beats as its bytes need.
ROW_PITCH = 16

_ADDRESS_SPACE = 1 << 32


def _align(value, alignment):
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class DramLayout:
    """Where :func:`gemm` puts everything in DRAM (byte addresses and sizes).

    A and B are row-major with rows ``a_stride`` and ``b_stride`` bytes apart (their widths
    rounded up to :data:`ROW_PITCH`; the padding bytes are zero and never used); C is
    row-major without padding.
    """
    program_addr: int
    program_bytes: int
    a_addr: int
    a_bytes: int
    b_addr: int
    b_bytes: int
    c_addr: int
    c_bytes: int
    size: int
    a_stride: int = 0
    b_stride: int = 0


def layout_dram(m, k, n, instructions):
    """Lay out the program and the three matrices of an ``(m x k) @ (k x n)`` GEMM.

    Parameters
    ----------
    m, k, n : int
        The GEMM shape.
    instructions : int
        Length of the program.

    Returns
    -------
    DramLayout

    Raises
    ------
    NPUValueError
        If the whole layout does not fit in the 4 GiB a 32-bit address reaches.
    """
    program_bytes = 16 * instructions
    a_stride, b_stride = _align(k, ROW_PITCH), _align(n, ROW_PITCH)
    a_addr = _align(PROGRAM_ADDR + program_bytes, REGION_ALIGN)
    b_addr = _align(a_addr + m * a_stride, REGION_ALIGN)
    c_addr = _align(b_addr + k * b_stride, REGION_ALIGN)
    size = _align(c_addr + 4 * m * n, DRAM_GRANULE)
    if size > _ADDRESS_SPACE:
        raise NPUValueError(f"a {m}x{k} @ {k}x{n} GEMM needs {size} bytes of DRAM (program "
                            f"and matrices), more than the 4 GiB a 32-bit address reaches")
    return DramLayout(program_addr=PROGRAM_ADDR, program_bytes=program_bytes,
                      a_addr=a_addr, a_bytes=m * a_stride, b_addr=b_addr,
                      b_bytes=k * b_stride, c_addr=c_addr, c_bytes=4 * m * n, size=size,
                      a_stride=a_stride, b_stride=b_stride)


@dataclass(frozen=True)
class GemmResult:
    """The product and how it was computed.

    Attributes
    ----------
    c : numpy.ndarray
        ``int32``, ``M x N``.
    config : hw.config.NPUConfig
    sim : str
        The backend that ran the program.
    plan : sw.compiler.Plan
    layout : DramLayout
    cycles : int or None
        Clock cycles of the run; ``None`` on the model.
    instructions : int
        Instructions executed, ``END`` included.
    perf : dict or None
        The hardware's performance counters (``hw.isa.PERF_COUNTERS``, plus
        ``cycles``); ``None`` on the model.
    link : dict or None
        On the SoC backends (``soc``, ``board``), the bytes moved over the host link and the
        time it took (:class:`sw.board.LinkStats`); ``None`` elsewhere.
    """
    c: np.ndarray
    config: NPUConfig
    sim: str
    plan: object
    layout: DramLayout
    cycles: "int | None"
    instructions: int
    perf: "dict | None" = None
    link: "dict | None" = None

    @property
    def weight_tiles(self):
        return self.plan.weight_tiles

    @property
    def macs(self):
        """Useful multiply-accumulates, ``M * K * N``."""
        return self.plan.macs

    @property
    def utilization(self):
        """``macs / (cycles * R * C)``, or ``None`` when the backend counts no cycles."""
        if self.cycles is None:
            return None
        return self.macs / (self.cycles * self.config.rows * self.config.cols)


def gemm(A, B, config=None, sim="model", *, schedule="auto"):
    """Compute ``A @ B`` on the NPU, bit-exactly in INT32.

    Parameters
    ----------
    A : numpy.ndarray
        ``int8``, ``M x K``.
    B : numpy.ndarray
        ``int8``, ``K x N``, with ``K <= hw.config.MAX_K``.
    config : hw.config.NPUConfig, optional
        The NPU instance; the default is ``NPUConfig()`` (8x8).
    sim : str
        ``"model"`` (default), ``"verilator"`` or ``"icarus"``.
    schedule : str
        Compiler schedule, see :func:`sw.compiler.plan_gemm`.

    Returns
    -------
    GemmResult

    Raises
    ------
    NPUTypeError
        If A or B is not an int8 numpy array, or config is not an NPUConfig.
    NPUValueError
        On a bad shape, K > MAX_K, an unknown sim, or a GEMM that does not fit in DRAM.
    sw.errors.PlanError
        If the compiler cannot place the GEMM on this config.
    NPURunError
        If the program stopped with an error instead of reaching END.
    sw.errors.BackendUnavailable
        If the chosen RTL simulator is not installed.
    """
    return gemm_batch([(A, B)], config=config, sim=sim, schedule=schedule)[0]


def prepare_gemm(A, B, *, config=None, schedule="auto"):
    """Check the operands, compile the GEMM and build its DRAM image (see :func:`run_jobs`)."""
    config = check_config(config)
    check_gemm_operands(A, B)
    m, k = A.shape
    n = B.shape[1]
    plan = plan_gemm(config, m, k, n, schedule=schedule)
    layout = layout_dram(m, k, n, plan.instructions)
    program = compile_gemm(config, m, k, n, a_addr=layout.a_addr, b_addr=layout.b_addr,
                           c_addr=layout.c_addr, a_stride=layout.a_stride,
                           b_stride=layout.b_stride, plan=plan)

    dram = np.zeros(layout.size, dtype=np.uint8)
    dram[layout.program_addr:layout.program_addr + layout.program_bytes] = \
        np.frombuffer(program.bytes, dtype=np.uint8)
    dram[layout.a_addr:layout.a_addr + layout.a_bytes].reshape(m, layout.a_stride)[:, :k] = \
        np.asarray(A).view(np.uint8)
    dram[layout.b_addr:layout.b_addr + layout.b_bytes].reshape(k, layout.b_stride)[:, :n] = \
        np.asarray(B).view(np.uint8)
    dram[layout.c_addr:layout.c_addr + layout.c_bytes] = POISON

    def finish(result, config, sim):
        c = (result.dram[layout.c_addr:layout.c_addr + layout.c_bytes].view("<i4")
             .reshape(m, n).astype(np.int32))
        return GemmResult(c=c, config=config, sim=sim, plan=program.plan, layout=layout,
                          cycles=result.cycles, instructions=result.instructions,
                          perf=result.perf, link=result.link)
    return PreparedJob(dram=dram, program=program, layout=layout, finish=finish)


def gemm_batch(pairs, config=None, sim="model", *, schedule="auto"):
    """Compute ``A @ B`` for each ``(A, B)`` in ``pairs``, in one run of the backend.

    On the RTL backends the GEMMs run one after another in a single simulation (one
    simulator start instead of one per GEMM); the NPU is not reset between them. Every pair
    is checked before anything runs. Arguments, results and errors are as for :func:`gemm`.
    """
    config = check_config_and_sim(config, sim)
    jobs = [prepare_gemm(A, B, config=config, schedule=schedule) for A, B in pairs]
    return run_jobs(jobs, config, sim)


# Quantized layers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RegionLayout:
    """Where a quantized layer's program and operands sit in DRAM.

    Attributes
    ----------
    program_addr, program_bytes : int
    regions : dict
        ``name -> (addr, bytes)``, in address order, each region 64-byte aligned.
    size : int
        DRAM size: the end of the last region rounded up to a multiple of 4 KiB.
    """
    program_addr: int
    program_bytes: int
    regions: dict
    size: int

    def addr(self, name):
        return self.regions[name][0]

    def span(self, name):
        """``slice`` of the region in a DRAM array."""
        addr, size = self.regions[name]
        return slice(addr, addr + size)


def layout_regions(instructions, regions, what="the layer"):
    """Lay out a program of ``instructions`` and then ``regions`` (``[(name, bytes), ...]``),
    each 64-byte aligned, starting with the program at :data:`PROGRAM_ADDR`.

    Raises
    ------
    NPUValueError
        If everything does not fit in the 4 GiB a 32-bit address reaches.
    """
    program_bytes = 16 * instructions
    addr = _align(PROGRAM_ADDR + program_bytes, REGION_ALIGN)
    placed = {}
    for name, size in regions:
        placed[name] = (addr, size)
        addr = _align(addr + size, REGION_ALIGN)
    size = _align(addr, DRAM_GRANULE)
    if size > _ADDRESS_SPACE:
        raise NPUValueError(f"{what} needs {size} bytes of DRAM (program and operands), more "
                            f"than the 4 GiB a 32-bit address reaches")
    return RegionLayout(program_addr=PROGRAM_ADDR, program_bytes=program_bytes,
                        regions=placed, size=size)


@dataclass(frozen=True)
class QuantResult:
    """The INT8 output of a quantized layer and how it was computed.

    Attributes
    ----------
    y : numpy.ndarray
        ``int8``: ``M x N`` for :func:`qgemm`, ``batch x OH x OW x C_out`` for
        :func:`sw.conv.conv2d`.
    config : hw.config.NPUConfig
    sim : str
    plan : sw.compiler.Plan
    layout : RegionLayout
    cycles : int or None
        Clock cycles of the run; ``None`` on the model.
    instructions : int
        Instructions executed, ``END`` included.
    link : dict or None
        On the SoC backends, the host link's bytes and time (as :class:`GemmResult`'s).
    """
    y: np.ndarray
    config: NPUConfig
    sim: str
    plan: object
    layout: RegionLayout
    cycles: "int | None"
    instructions: int
    link: "dict | None" = None

    @property
    def weight_tiles(self):
        return self.plan.weight_tiles

    @property
    def macs(self):
        """Useful multiply-accumulates."""
        return self.plan.macs

    @property
    def utilization(self):
        """``macs / (cycles * R * C)``, or ``None`` when the backend counts no cycles."""
        if self.cycles is None:
            return None
        return self.macs / (self.cycles * self.config.rows * self.config.cols)


@dataclass(frozen=True)
class PreparedJob:
    """A program in its DRAM image, and how to read its result back.

    Attributes
    ----------
    dram : numpy.ndarray
        The initial DRAM image.
    program : object
        The compiled program (``len()`` is its length).
    layout : RegionLayout or DramLayout
    finish : callable
        ``finish(run_result, config, sim)`` returns the result object.
    """
    dram: np.ndarray
    program: object
    layout: object
    finish: object


def run_jobs(jobs, config, sim):
    """Run prepared jobs in one backend run (one simulation on the RTL backends) and return
    their results; a job whose program stopped with an error raises :class:`NPURunError`."""
    results = backend.run_programs(
        config, sim, [(job.dram, job.layout.program_addr, len(job.program)) for job in jobs])
    finished = []
    for job, result in zip(jobs, results):
        if not result.done:
            raise NPURunError(result.error_code, result.error_pc,
                              f"the NPU program stopped with error {result.error_code.name} "
                              f"at instruction {result.error_pc} of {len(job.program)} "
                              f"({sim}, {config.name})")
        finished.append(job.finish(result, config, sim))
    return finished


def fold_zero_point(bias, weight_sums, zero_point, name):
    """``bias - zero_point * weight_sums`` as int32, refusing a value that does not fit.

    With ``x - zero_point`` in place of ``x``, every output gains
    ``-zero_point * (sum of its weights)``: a constant per channel, so it joins the bias and
    the NPU multiplies the raw INT8 inputs.
    """
    folded = bias.astype(np.int64) - zero_point * weight_sums.astype(np.int64)
    bad = np.flatnonzero((folded < INT32_MIN) | (folded > INT32_MAX))
    if bad.size:
        channel = bad[0]
        raise NPUValueError(f"the bias with the input zero point folded in ({name}) does not "
                            f"fit INT32: channel {channel} gives {bias[channel]} - "
                            f"{zero_point} * {weight_sums[channel]} = {folded[channel]}")
    return folded.astype(np.int32)


def quant_region(multiplier, shift, scale=None):
    """The ``LOAD_QUANT`` region: multipliers then shifts, INT32 little-endian; or (given
    ``scale``, the float mode) the float32 scales, little-endian, then as many zero words."""
    if scale is not None:
        return np.concatenate([scale.astype("<f4").view(np.uint8),
                               np.zeros(4 * scale.size, np.uint8)])
    return np.concatenate([multiplier.astype("<i4"), shift.astype("<i4")]).view(np.uint8)


def place_region(dram, layout, name, array):
    """Copy ``array``'s bytes (C order) into region ``name`` of ``dram``; sizes must match."""
    dram[layout.span(name)] = np.ascontiguousarray(array).view(np.uint8).reshape(-1)


def prepare_qgemm(A, B, bias, multiplier=None, shift=None, *, scale=None, out_zero_point,
                  act_min, act_max, a_zero_point=0, config=None, schedule="auto"):
    """Check the operands, compile the quantized GEMM and build its DRAM image (see
    :func:`run_jobs`); the arguments are those of :func:`qgemm`."""
    config = check_config(config)
    quant_mode, out_zero_point, act_min, act_max, a_zero_point = check_qgemm_operands(
        A, B, bias, multiplier, shift, scale, out_zero_point, act_min, act_max, a_zero_point)
    m, k = A.shape
    n = B.shape[1]
    folded_bias = fold_zero_point(bias, B.astype(np.int64).sum(axis=0), a_zero_point,
                                  "bias - a_zero_point * B.sum(axis=0)")
    plan = plan_qgemm(config, m, k, n, schedule=schedule)
    layout = layout_regions(plan.instructions, [
        ("a", m * k), ("b", k * n), ("bias", 4 * n), ("quant", 8 * n), ("y", m * n)],
        what=f"a {m}x{k} @ {k}x{n} quantized GEMM")
    program = compile_qgemm(
        config, m, k, n, a_addr=layout.addr("a"), b_addr=layout.addr("b"),
        bias_addr=layout.addr("bias"), quant_addr=layout.addr("quant"),
        y_addr=layout.addr("y"), out_zero_point=out_zero_point, act_min=act_min,
        act_max=act_max, quant_mode=quant_mode, plan=plan)

    dram = np.zeros(layout.size, dtype=np.uint8)
    dram[layout.program_addr:layout.program_addr + layout.program_bytes] = \
        np.frombuffer(program.bytes, dtype=np.uint8)
    place_region(dram, layout, "a", A)
    place_region(dram, layout, "b", B)
    place_region(dram, layout, "bias", folded_bias.astype("<i4"))
    place_region(dram, layout, "quant", quant_region(multiplier, shift, scale))
    dram[layout.span("y")] = POISON

    def finish(result, config, sim):
        y = result.dram[layout.span("y")].view(np.int8).reshape(m, n).copy()
        return QuantResult(y=y, config=config, sim=sim, plan=program.plan, layout=layout,
                           cycles=result.cycles, instructions=result.instructions,
                           link=result.link)
    return PreparedJob(dram=dram, program=program, layout=layout, finish=finish)


def qgemm(A, B, bias, multiplier=None, shift=None, *, scale=None, out_zero_point, act_min,
          act_max, a_zero_point=0, config=None, sim="model", schedule="auto"):
    """Compute ``Y = requantize((A - a_zero_point) @ B + bias)`` on the NPU, in INT8.

    The input zero point is folded into the bias on the host
    (``bias - a_zero_point * B.sum(axis=0)``), so the array multiplies the raw INT8 values;
    the bias is loaded into the accumulator, every k-tile accumulates onto it, and ``STORE_Q``
    requantizes per output column: with ``multiplier`` and ``shift`` as TFLite does
    (:func:`sw.quant.requantize`), with ``scale`` instead as onnxruntime does
    (:func:`sw.quant.requantize_float`).

    Parameters
    ----------
    A : numpy.ndarray
        ``int8``, ``M x K``.
    B : numpy.ndarray
        ``int8``, ``K x N``, ``K <= hw.config.MAX_K``.
    bias, multiplier, shift : numpy.ndarray
        ``int32`` of shape ``(N,)``; shifts within -31 .. 31 (positive: right shift).
        ``multiplier`` and ``shift`` are None when ``scale`` is given.
    scale : numpy.ndarray, optional
        ``float32`` of shape ``(N,)``, finite: the float mode's scales, instead of
        ``multiplier`` and ``shift``.
    out_zero_point, act_min, act_max : int
        Output zero point and clamp, within -128 .. 127, ``act_min <= act_max``.
    a_zero_point : int
        Zero point of A, within -128 .. 127.
    config : hw.config.NPUConfig, optional
        Default ``NPUConfig()`` (8x8).
    sim : str
        ``"model"`` (default), ``"verilator"`` or ``"icarus"``.
    schedule : str
        See :func:`sw.compiler.plan_quantized`.

    Returns
    -------
    QuantResult
        ``y`` is ``int8``, ``M x N``.

    Raises
    ------
    NPUTypeError, NPUValueError
        On a bad operand (the message names it), or a folded bias that does not fit INT32.
    sw.errors.PlanError, NPURunError, sw.errors.BackendUnavailable
        As for :func:`gemm`.
    """
    return qgemm_batch([dict(A=A, B=B, bias=bias, multiplier=multiplier, shift=shift,
                             scale=scale, out_zero_point=out_zero_point, act_min=act_min,
                             act_max=act_max, a_zero_point=a_zero_point)],
                       config=config, sim=sim, schedule=schedule)[0]


def qgemm_batch(problems, config=None, sim="model", *, schedule="auto"):
    """Run several quantized GEMMs in one run of the backend (one simulation on the RTL).

    Parameters
    ----------
    problems : iterable of dict
        Each holds the arguments of :func:`qgemm` by name: ``A, B, bias, multiplier, shift,
        out_zero_point, act_min, act_max`` and optionally ``a_zero_point``, or ``scale``
        instead of ``multiplier`` and ``shift``.

    Every problem is checked and compiled before anything runs. Returns a list of
    :class:`QuantResult`.
    """
    config = check_config_and_sim(config, sim)
    jobs = [prepare_qgemm(**problem, config=config, schedule=schedule)
            for problem in problems]
    return run_jobs(jobs, config, sim)
