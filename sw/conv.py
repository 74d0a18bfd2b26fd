"""Quantized 2-D convolution (NHWC, INT8) on the NPU, without im2col on the host.

A ``KH x KW`` convolution is ``KH * KW`` pointwise convolutions, one per kernel tap, summed
in the accumulator: tap ``(kh, kw)`` multiplies the input pixel ``(oh * s + kh, ow * s + kw)``
of the padded input by the ``C_in x C_out`` weight matrix ``w[kh, kw]``. The DMA's 2-D strided
addressing gathers those pixels straight from the input tensor, so no patch matrix is built.

DRAM layouts (all row-major, NHWC):

* **Input**: a *pre-padded* buffer of ``batch x Hp x Wp`` pixels, ``Hp = H + top + bottom``,
  ``Wp = W + left + right``, each pixel ``in_pixel_stride`` bytes apart (``C_in`` by default)
  holding ``C_in`` INT8 channels. The border holds the input zero point, so that a padded
  position contributes ``(zero_point - zero_point) * w = 0`` like TFLite's padding. A producer
  layer writes its output straight into the interior of its consumer's padded buffer (its
  ``out_padding`` is the consumer's ``padding``); the border is written once, when the buffer
  is set up, and no host copy is needed between layers.
* **Weights**: ``KH x KW x C_in x C_out`` INT8 (HWIO); tap ``t = kh * KW + kw`` is the
  ``C_in x C_out`` matrix at ``w_addr + t * C_in * C_out``.
* **Bias**: ``C_out`` INT32 with the input zero point folded in:
  ``bias - in_zero_point * w.sum(axis=(0, 1, 2))``.
* **Quantization parameters**: ``C_out`` INT32 multipliers, then ``C_out`` INT32 shifts;
  in the float mode (``scale=``) ``C_out`` float32 scales, then ``C_out`` zero words.
* **Output**: ``batch x OHb x OWb`` pixels, ``out_pixel_stride`` bytes apart (``C_out`` by
  default), where ``OHb = OH + out top + out bottom`` and likewise ``OWb``: the output is
  written to the interior and the border is left alone.

For output row ``(b, oh)``, tap ``(kh, kw)`` and the k-tile starting at channel ``k0``, the
activation rows of all output pixels ``ow`` are one ``LOAD_SPAD``: ``rows = OW`` from
``x_addr + ((b * Hp + oh * s + kh) * Wp + kw) * in_pixel_stride + k0`` with
``dram_stride = s * in_pixel_stride`` and ``row_bytes`` the k-tile's width. Blocks of output
pixels are whole output rows where they fit; rows whose runs continue one another (a 1x1
convolution with stride 1 and no padding is one contiguous GEMM) share one instruction. The
schedule around those loads is :func:`sw.compiler.compile_quantized`'s.

With ``lowering="kernel_rows"`` (:data:`LOWERINGS`) a kernel row ``kh`` is one reduction of
``KW * C_in``: the same loads with ``kw = 0`` and ``row_bytes`` up to ``KW * C_in``, against
the weight rows ``kh * KW * C_in ..``; it fills the array's rows when ``C_in`` is small.
"""

from dataclasses import dataclass

import numpy as np

from hw.config import MAX_K
from hw.isa import QuantMode
from .compiler import RowGather, _as_int, _compile_quantized, merge_runs, plan_quantized
from .errors import NPUTypeError, NPUValueError


__all__ = ["Conv2dGeometry", "LOWERINGS", "check_lowering", "plan_conv2d", "compile_conv2d",
           "reference_conv2d", "padded_input", "prepare_conv2d", "conv2d", "conv2d_batch"]


def _padding(name, value):
    """An int or a ``(top, bottom, left, right)`` sequence, as a tuple of four ints >= 0."""
    if isinstance(value, (tuple, list)):
        if len(value) != 4:
            raise NPUValueError(f"{name} must be an integer or (top, bottom, left, right), "
                                f"not {value!r}")
        sides = tuple(_as_int(name, side) for side in value)
    else:
        sides = (_as_int(name, value),) * 4
    if min(sides) < 0:
        raise NPUValueError(f"{name} must not be negative, not {value!r}")
    return sides


@dataclass(frozen=True)
class Conv2dGeometry:
    """The shape of one convolution and of its input and output buffers in DRAM.

    Parameters
    ----------
    batch, height, width, in_channels : int
        The input tensor (NHWC), without padding.
    out_channels, kernel_height, kernel_width : int
        The weights (HWIO: ``kernel_height x kernel_width x in_channels x out_channels``).
    stride : int
        The same in both directions.
    padding : int or (top, bottom, left, right)
        Padding of the input; the input buffer is padded by exactly this much.
    out_padding : int or (top, bottom, left, right)
        Border of the output buffer (the next layer's ``padding``); 0 for a plain tensor.
    in_pixel_stride, out_pixel_stride : int, optional
        Bytes from one pixel to the next in the input and output buffers: the channel counts
        by default; larger to read or write a channel slice of a wider tensor.

    ``padding`` and ``out_padding`` are stored as ``(top, bottom, left, right)``.
    """
    batch: int
    height: int
    width: int
    in_channels: int
    out_channels: int
    kernel_height: int
    kernel_width: int
    stride: int = 1
    padding: tuple = 0
    out_padding: tuple = 0
    in_pixel_stride: "int | None" = None
    out_pixel_stride: "int | None" = None

    def __post_init__(self):
        for name in ("batch", "height", "width", "in_channels", "out_channels",
                     "kernel_height", "kernel_width", "stride"):
            value = _as_int(name, getattr(self, name))
            if value < 1:
                raise NPUValueError(f"{name} must be a positive integer, not {value}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "padding", _padding("padding", self.padding))
        object.__setattr__(self, "out_padding", _padding("out_padding", self.out_padding))
        for name, channels in (("in_pixel_stride", self.in_channels),
                               ("out_pixel_stride", self.out_channels)):
            value = getattr(self, name)
            value = channels if value is None else _as_int(name, value)
            if value < channels:
                raise NPUValueError(f"{name} must be at least the {channels} channels of a "
                                    f"pixel, not {value}")
            object.__setattr__(self, name, value)
        if self.padded_height < self.kernel_height or self.padded_width < self.kernel_width:
            raise NPUValueError(
                f"the {self.kernel_height}x{self.kernel_width} kernel does not fit the padded "
                f"{self.padded_height}x{self.padded_width} input "
                f"({self.height}x{self.width} with padding {self.padding})")
        if self.k > MAX_K:
            raise NPUValueError(
                f"kernel_height * kernel_width * in_channels = {self.k} is larger than MAX_K "
                f"= {MAX_K}: a longer INT8 dot product could overflow the INT32 accumulator")

    @property
    def padded_height(self):
        return self.height + self.padding[0] + self.padding[1]

    @property
    def padded_width(self):
        return self.width + self.padding[2] + self.padding[3]

    @property
    def out_height(self):
        return (self.padded_height - self.kernel_height) // self.stride + 1

    @property
    def out_width(self):
        return (self.padded_width - self.kernel_width) // self.stride + 1

    @property
    def out_buffer_height(self):
        return self.out_height + self.out_padding[0] + self.out_padding[1]

    @property
    def out_buffer_width(self):
        return self.out_width + self.out_padding[2] + self.out_padding[3]

    @property
    def taps(self):
        return self.kernel_height * self.kernel_width

    @property
    def m(self):
        """Output pixels: the rows of the equivalent GEMM."""
        return self.batch * self.out_height * self.out_width

    @property
    def k(self):
        """Reduction length of one output: ``kernel_height * kernel_width * in_channels``."""
        return self.taps * self.in_channels

    @property
    def input_bytes(self):
        """Bytes of the padded input buffer."""
        return self.batch * self.padded_height * self.padded_width * self.in_pixel_stride

    @property
    def output_bytes(self):
        """Bytes of the (padded) output buffer."""
        return (self.batch * self.out_buffer_height * self.out_buffer_width
                * self.out_pixel_stride)

    @property
    def weight_bytes(self):
        return self.k * self.out_channels


#: How a convolution becomes GEMMs on the array. ``"taps"``: one ``C_in x C_out`` weight
#: matrix per kernel tap, ``KH * KW`` GEMMs accumulated on chip. ``"kernel_rows"``: one
#: ``KW * C_in x C_out`` matrix per kernel *row*. In NHWC the ``KW`` neighbouring pixels of a
#: kernel row lie next to each other, so the ``KW * C_in`` bytes from pixel
#: ``(oh * stride + kh, ow * stride)`` on are the activation row of the whole kernel row
#: ``kh``, and HWIO weight rows ``kh * KW * C_in ..`` are its matrix (the same bytes as the
#: per-tap layout). Each reduction is ``KW`` times longer, which fills the array's R rows when
#: ``C_in < R``: a 1-channel 3x3 convolution on 8 rows takes 3 weight tiles of 3 rows instead
#: of 9 of 1. It needs the input's pixels packed (``in_pixel_stride == in_channels``).
LOWERINGS = ("taps", "kernel_rows")


def check_lowering(lowering):
    """Raise :class:`~sw.errors.NPUValueError` unless ``lowering`` is one of
    :data:`LOWERINGS`."""
    if lowering not in LOWERINGS:
        raise NPUValueError(f"lowering must be one of {LOWERINGS}, not {lowering!r}")


def _check_lowering(lowering, geometry):
    check_lowering(lowering)
    if lowering == "kernel_rows" and geometry.in_pixel_stride != geometry.in_channels:
        raise NPUValueError(
            f"the kernel_rows lowering reads a kernel row's {geometry.kernel_width} pixels as "
            f"one row, so it needs packed input pixels: in_pixel_stride "
            f"{geometry.in_pixel_stride} is not in_channels {geometry.in_channels}")
    return lowering


class _ConvGather(RowGather):
    """Output pixel ``p = (b * OH + oh) * OW + ow`` of a convolution, and its taps: kernel
    taps, or kernel rows (``lowering``, see :data:`LOWERINGS`)."""

    def __init__(self, geometry, lowering="taps"):
        self.geometry = geometry
        self.lowering = _check_lowering(lowering, geometry)
        self.m = geometry.m
        self.n = geometry.out_channels
        if lowering == "taps":
            self.taps = geometry.taps
            self.k_tap = geometry.in_channels
        else:
            self.taps = geometry.kernel_height
            self.k_tap = geometry.kernel_width * geometry.in_channels
        self.row_group = geometry.out_width
        self.activation_bytes = geometry.input_bytes
        self.output_bytes = geometry.output_bytes

    def _image_rows(self, start, stop):
        """``(offset, b, oh, ow, count)``: the output pixels ``start .. stop-1``, cut at
        image rows."""
        out_height, out_width = self.geometry.out_height, self.geometry.out_width
        pixel = start
        while pixel < stop:
            image_row, ow = divmod(pixel, out_width)
            b, oh = divmod(image_row, out_height)
            count = min(out_width - ow, stop - pixel)
            yield pixel - start, b, oh, ow, count
            pixel += count

    def activation_runs(self, tap, start, stop):
        g = self.geometry
        # A kernel row starts at its first pixel (kw = 0) and spans k_tap bytes from there.
        kh, kw = divmod(tap, g.kernel_width) if self.lowering == "taps" else (tap, 0)
        step = g.stride * g.in_pixel_stride
        return merge_runs(
            (offset, count, ((b * g.padded_height + oh * g.stride + kh) * g.padded_width
                             + ow * g.stride + kw) * g.in_pixel_stride, step)
            for offset, b, oh, ow, count in self._image_rows(start, stop))

    def output_runs(self, start, stop):
        g = self.geometry
        top, _, left, _ = g.out_padding
        return merge_runs(
            (offset, count, ((b * g.out_buffer_height + oh + top) * g.out_buffer_width
                             + ow + left) * g.out_pixel_stride, g.out_pixel_stride)
            for offset, b, oh, ow, count in self._image_rows(start, stop))


def _check_geometry(geometry):
    if not isinstance(geometry, Conv2dGeometry):
        raise NPUTypeError(f"geometry must be a Conv2dGeometry, not {geometry!r}")
    return geometry


def _gather(geometry, lowering, weights):
    gather = _ConvGather(_check_geometry(geometry), lowering)
    return gather if weights is None else gather.know_weights(weights)


def plan_conv2d(config, geometry, *, schedule="auto", lowering="taps", weights=None):
    """The :class:`sw.compiler.QuantPlan` of a convolution: ``m`` output pixels,
    ``n = out_channels``, and ``KH * KW`` taps of ``k_tap = in_channels`` (``lowering="taps"``)
    or ``KH`` kernel rows of ``k_tap = KW * in_channels`` (``"kernel_rows"``). With
    ``weights`` (HWIO int8), all-zero weight tiles are skipped (a depthwise convolution's
    block-diagonal weights)."""
    return plan_quantized(config, _gather(geometry, lowering, weights), schedule=schedule)


def compile_conv2d(config, geometry, *, x_addr, w_addr, bias_addr, quant_addr, y_addr,
                   out_zero_point, act_min, act_max, schedule="auto", lowering="taps",
                   weights=None, quant_mode=QuantMode.FIXED):
    """Compile one quantized convolution into a program.

    Parameters
    ----------
    config : hw.config.NPUConfig
    geometry : Conv2dGeometry
    x_addr : int
        The padded input buffer (``geometry.input_bytes``), border filled with the input
        zero point.
    w_addr : int
        The HWIO weights (``geometry.weight_bytes``).
    bias_addr : int
        ``out_channels`` INT32: ``bias - in_zero_point * w.sum(axis=(0, 1, 2))``.
    quant_addr : int
        ``out_channels`` INT32 multipliers, then ``out_channels`` INT32 shifts; with
        ``quant_mode=FLOAT``, float32 scales, then zero words.
    y_addr : int
        The output buffer (``geometry.output_bytes``); only its interior is written.
    out_zero_point, act_min, act_max : int
        Output zero point and clamp.
    schedule : str
        One of :data:`sw.compiler.SCHEDULES`.
    lowering : str
        One of :data:`LOWERINGS`; the weights' layout (HWIO) is the same for both.
    weights : numpy.ndarray, optional
        The HWIO weights themselves: their all-zero tiles are skipped (as by
        :func:`plan_conv2d`).
    quant_mode : hw.isa.QuantMode
        ``FIXED`` (default) or ``FLOAT``, see :func:`sw.compiler.compile_qgemm`.

    Returns
    -------
    sw.compiler.QuantProgram
        ``addresses`` has the keys ``x_addr, w_addr, bias_addr, quant_addr, y_addr``. To chain
        layers into one program, concatenate the ``body`` of each and append one ``END``.
    """
    return _compile_quantized(
        config, _gather(geometry, lowering, weights),
        dict(x_addr=x_addr, w_addr=w_addr, bias_addr=bias_addr, quant_addr=quant_addr,
             y_addr=y_addr), out_zero_point, act_min, act_max, schedule, quant_mode)


def padded_input(x, padding, zero_point, *, pixel_stride=None):
    """The pre-padded input buffer of ``x`` (NHWC int8): the border (and any bytes of a pixel
    past its channels) hold ``zero_point``.

    Returns an int8 array of shape ``(batch, Hp, Wp, pixel_stride)``.
    """
    from .driver import check_int, check_int8_array
    check_int8_array("x", x, 4, "an NHWC tensor")
    top, bottom, left, right = _padding("padding", padding)
    zero_point = check_int("zero_point", zero_point, -128, 127)
    batch, height, width, channels = x.shape
    pixel_stride = channels if pixel_stride is None else _as_int("pixel_stride", pixel_stride)
    if pixel_stride < channels:
        raise NPUValueError(f"pixel_stride must be at least the {channels} channels of a "
                            f"pixel, not {pixel_stride}")
    buffer = np.full((batch, height + top + bottom, width + left + right, pixel_stride),
                     zero_point, dtype=np.int8)
    buffer[:, top:top + height, left:left + width, :channels] = x
    return buffer


def _check_conv2d(x, w, bias, multiplier, shift, scale, stride, padding, in_zero_point,
                  out_zero_point, act_min, act_max):
    from .driver import check_channel_vector, check_int, check_int8_array, check_requantization
    check_int8_array("x", x, 4, "an NHWC tensor")
    check_int8_array("w", w, 4, "an HWIO weight tensor")
    if w.shape[2] != x.shape[3]:
        raise NPUValueError(f"input channels differ: x has {x.shape[3]} (shape {x.shape}) and "
                            f"w has {w.shape[2]} (shape {w.shape}, HWIO)")
    out_channels = w.shape[3]
    check_channel_vector("bias", bias, out_channels, "output channel")
    quant_mode, out_zero_point, act_min, act_max = check_requantization(
        multiplier, shift, out_zero_point, act_min, act_max, out_channels, "output channel",
        scale)
    in_zero_point = check_int("in_zero_point", in_zero_point, -128, 127)
    batch, height, width, in_channels = x.shape
    geometry = Conv2dGeometry(batch=batch, height=height, width=width,
                              in_channels=in_channels, out_channels=out_channels,
                              kernel_height=w.shape[0], kernel_width=w.shape[1],
                              stride=stride, padding=padding)
    return geometry, quant_mode, in_zero_point, out_zero_point, act_min, act_max


def reference_conv2d(x, w, bias, multiplier=None, shift=None, *, scale=None, stride=1,
                     padding=0, in_zero_point=0, out_zero_point, act_min, act_max):
    """The exact result :func:`conv2d` must return, computed plainly with numpy.

    The input is padded with ``in_zero_point``, the zero point subtracted, every tap's
    products summed with the bias in INT64 and wrapped to INT32 (as the accumulator wraps),
    then requantized per output channel with :func:`sw.quant.requantize` (or, given
    ``scale``, :func:`sw.quant.requantize_float`).

    Returns
    -------
    numpy.ndarray
        ``int8``, ``batch x OH x OW x C_out``.
    """
    from .driver import reference_requantize, wrap_int32
    geometry, _, in_zero_point, out_zero_point, act_min, act_max = _check_conv2d(
        x, w, bias, multiplier, shift, scale, stride, padding, in_zero_point, out_zero_point,
        act_min, act_max)
    g = geometry
    centred = padded_input(x, g.padding, in_zero_point).astype(np.int64) - in_zero_point
    acc = np.zeros((g.batch, g.out_height, g.out_width, g.out_channels), dtype=np.int64)
    for kh in range(g.kernel_height):
        for kw in range(g.kernel_width):
            window = centred[:, kh:kh + g.stride * (g.out_height - 1) + 1:g.stride,
                             kw:kw + g.stride * (g.out_width - 1) + 1:g.stride, :]
            acc += window @ w[kh, kw].astype(np.int64)
    acc += bias.astype(np.int64)
    return reference_requantize(wrap_int32(acc), multiplier, shift, scale, out_zero_point,
                                act_min, act_max)


def prepare_conv2d(x, w, bias, multiplier=None, shift=None, *, scale=None, stride=1, padding=0,
                   in_zero_point=0, out_zero_point, act_min, act_max, config=None,
                   schedule="auto", lowering="taps"):
    """Check the operands, compile the convolution and build its DRAM image (see
    :func:`sw.driver.run_jobs`); the arguments are those of :func:`conv2d`.

    DRAM: the program, then the regions ``x`` (padded input), ``w``, ``bias`` (folded),
    ``quant`` and ``y`` (NHWC, no border, poisoned), as in :func:`sw.driver.layout_regions`.
    """
    from .driver import (POISON, PreparedJob, QuantResult, check_config, fold_zero_point,
                         layout_regions, place_region, quant_region)
    config = check_config(config)
    geometry, quant_mode, in_zero_point, out_zero_point, act_min, act_max = _check_conv2d(
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
        act_max=act_max, schedule=schedule, lowering=lowering, weights=w,
        quant_mode=quant_mode)

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
                           cycles=result.cycles, instructions=result.instructions)
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
        ``"taps"`` (default) or ``"kernel_rows"``, see :data:`LOWERINGS`; the result is the
        same, the cycles differ.

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
    from .driver import check_config_and_sim, run_jobs
    config = check_config_and_sim(config, sim)
    jobs = [prepare_conv2d(**problem, config=config, schedule=schedule, lowering=lowering)
            for problem in problems]
    return run_jobs(jobs, config, sim)
