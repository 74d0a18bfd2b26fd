"""Quantized 2-D convolution (NHWC, INT8) on the NPU, without im2col on the host: the host
side, which checks the operands, builds the DRAM image (the padded input, HWIO weights, folded
bias, quantization parameters and output buffer) and runs it. The lowering onto the array and
the DRAM layouts it reads and writes are described in :mod:`sw.compiler.conv`; the numpy
reference is :func:`sw.reference.reference_conv2d` (re-exported here).
"""

import numpy as np

from .compiler import as_int, check_padding, compile_conv2d, plan_conv2d
from .driver import (POISON, PreparedJob, QuantResult, fold_zero_point, layout_regions,
                     place_region, quant_region, run_jobs)
from .errors import NPUValueError
from .operands import (check_config, check_config_and_sim, check_conv2d_operands, check_int,
                       check_int8_array)
from .reference import reference_conv2d


__all__ = ["reference_conv2d", "padded_input", "prepare_conv2d", "conv2d", "conv2d_batch"]


def padded_input(x, padding, zero_point, *, pixel_stride=None):
    """The pre-padded input buffer of ``x`` (NHWC int8): the border (and any bytes of a pixel
    past its channels) hold ``zero_point``.

    Returns an int8 array of shape ``(batch, Hp, Wp, pixel_stride)``.
    """
    check_int8_array("x", x, 4, "an NHWC tensor")
    top, bottom, left, right = check_padding("padding", padding)
    zero_point = check_int("zero_point", zero_point, -128, 127)
    batch, height, width, channels = x.shape
    pixel_stride = channels if pixel_stride is None else as_int("pixel_stride", pixel_stride)
    if pixel_stride < channels:
        raise NPUValueError(f"pixel_stride must be at least the {channels} channels of a "
                            f"pixel, not {pixel_stride}")
    buffer = np.full((batch, height + top + bottom, width + left + right, pixel_stride),
                     zero_point, dtype=np.int8)
    buffer[:, top:top + height, left:left + width, :channels] = x
    return buffer



def prepare_conv2d(x, w, bias, multiplier=None, shift=None, *, scale=None, stride=1, padding=0,
                   in_zero_point=0, out_zero_point, act_min, act_max, config=None,
                   schedule="auto", lowering="taps"):
    """Check the operands, compile the convolution and build its DRAM image (see
    :func:`sw.driver.run_jobs`); the arguments are those of :func:`conv2d`.

    DRAM: the program, then the regions ``x`` (padded input), ``w``, ``bias`` (folded),
    ``quant`` and ``y`` (NHWC, no border, poisoned), as in :func:`sw.driver.layout_regions`.
    """
    config = check_config(config)
    geometry, quant_mode, in_zero_point, out_zero_point, act_min, act_max = check_conv2d_operands(
        x, w, bias, multiplier, shift, scale, stride, padding, in_zero_point, out_zero_point,
        act_min, act_max)
    g = geometry
    folded_bias = fold_zero_point(bias, w.astype(np.int64).sum(axis=(0, 1, 2)), in_zero_point,
                                  "bias - in_zero_point * w.sum(axis=(0, 1, 2))")
    plan = plan_conv2d(config, geometry, schedule=schedule, lowering=lowering, weights=w)
    layout = layout_regions(plan.instructions, [
        ("x", g.input_bytes), ("w", g.weight_bytes), ("bias", 4 * g.out_channels),
        ("quant", 8 * g.out_channels), ("y", g.output_bytes)],
        what=f"a convolution of a {x.shape} input with {w.shape} weights")
    program = compile_conv2d(
        config, geometry, x_addr=layout.addr("x"), w_addr=layout.addr("w"),
        bias_addr=layout.addr("bias"), quant_addr=layout.addr("quant"),
        y_addr=layout.addr("y"), out_zero_point=out_zero_point, act_min=act_min,
        act_max=act_max, lowering=lowering, weights=w, quant_mode=quant_mode, plan=plan)

    dram = np.zeros(layout.size, dtype=np.uint8)
    dram[layout.program_addr:layout.program_addr + layout.program_bytes] = \
        np.frombuffer(program.bytes, dtype=np.uint8)
    place_region(dram, layout, "x", padded_input(x, g.padding, in_zero_point))
    place_region(dram, layout, "w", w)
    place_region(dram, layout, "bias", folded_bias.astype("<i4"))
    place_region(dram, layout, "quant", quant_region(multiplier, shift, scale))
    dram[layout.span("y")] = POISON

    def finish(result, config, sim):
        y = result.dram[layout.span("y")].view(np.int8).reshape(
            g.batch, g.out_height, g.out_width, g.out_channels).copy()
        return QuantResult(y=y, config=config, sim=sim, plan=program.plan, layout=layout,
                           cycles=result.cycles, instructions=result.instructions,
                           link=result.link)
    return PreparedJob(dram=dram, program=program, layout=layout, finish=finish)


def conv2d(x, w, bias, multiplier=None, shift=None, *, scale=None, stride=1, padding=0,
           in_zero_point=0, out_zero_point, act_min, act_max, config=None, sim="model",
           schedule="auto", lowering="taps"):
    """Run a quantized 2-D convolution (groups = 1) on the NPU.

    ``y = requantize(conv(x - in_zero_point, w) + bias)``, with the input padded by its zero
    point, per output channel.

    Parameters
    ----------
    x : numpy.ndarray
        ``int8``, NHWC: ``batch x H x W x C_in``.
    w : numpy.ndarray
        ``int8``, HWIO: ``KH x KW x C_in x C_out``.
    bias, multiplier, shift : numpy.ndarray
        ``int32`` of shape ``(C_out,)``; shifts within -31 .. 31 (positive: right shift).
        ``multiplier`` and ``shift`` are None when ``scale`` is given.
    scale : numpy.ndarray, optional
        ``float32`` of shape ``(C_out,)``: the float mode (onnxruntime's requantization,
        :func:`sw.quant.requantize_float`) instead of ``multiplier`` and ``shift``.
    stride : int
    padding : int or (top, bottom, left, right)
    in_zero_point, out_zero_point, act_min, act_max : int
        Within -128 .. 127, ``act_min <= act_max``.
    config : hw.config.NPUConfig, optional
    sim : str
        ``"model"`` (default), ``"verilator"`` or ``"icarus"``.
    schedule : str
        See :func:`sw.compiler.plan_quantized`.
    lowering : str
        ``"taps"`` (default) or ``"kernel_rows"``, see :data:`sw.compiler.LOWERINGS`; the
        result is the same, the cycles differ.

    Returns
    -------
    sw.driver.QuantResult
        ``y`` is ``int8``, ``batch x OH x OW x C_out``.
    """
    return conv2d_batch([dict(x=x, w=w, bias=bias, multiplier=multiplier, shift=shift,
                              scale=scale, stride=stride, padding=padding,
                              in_zero_point=in_zero_point, out_zero_point=out_zero_point,
                              act_min=act_min, act_max=act_max)],
                        config=config, sim=sim, schedule=schedule, lowering=lowering)[0]


def conv2d_batch(problems, config=None, sim="model", *, schedule="auto", lowering="taps"):
    """Run several convolutions in one run of the backend (one simulation on the RTL).

    ``problems`` holds dicts of :func:`conv2d`'s operands by name (``x, w, bias, multiplier,
    shift, out_zero_point, act_min, act_max`` and optionally ``stride, padding,
    in_zero_point``; ``scale`` instead of ``multiplier`` and ``shift``). Returns a list of
    :class:`sw.driver.QuantResult`.
    """
    config = check_config_and_sim(config, sim)
    jobs = [prepare_conv2d(**problem, config=config, schedule=schedule, lowering=lowering)
            for problem in problems]
    return run_jobs(jobs, config, sim)
