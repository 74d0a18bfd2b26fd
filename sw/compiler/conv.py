"""Convolutions lowered onto the quantized core: quantized 2-D convolution (NHWC, INT8)
without im2col on the host.

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

A depthwise convolution (:func:`compile_depthwise_conv2d`) is the convolution whose HWIO
weights are block-diagonal (input channel ``c`` meets output channel ``c`` only); the
compiler knows the weights, so it skips their all-zero tiles (:meth:`RowGather.know_weights`).
The host side (``conv2d``, ``padded_input``, the numpy reference) is :mod:`sw.conv`.
"""

from dataclasses import dataclass

import numpy as np

from hw.config import MAX_K
from hw.isa import QuantMode
from .checks import as_int, check_padding, check_positive
from .quantized import RowGather, compile_gathered, merge_runs, plan_quantized
from ..errors import NPUTypeError, NPUValueError


__all__ = ["Conv2dGeometry", "LOWERINGS", "check_lowering", "ConvGather", "plan_conv2d",
           "compile_conv2d", "depthwise_weights", "plan_depthwise_conv2d",
           "compile_depthwise_conv2d"]


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
            object.__setattr__(self, name, check_positive(name, getattr(self, name)))
        object.__setattr__(self, "padding", check_padding("padding", self.padding))
        object.__setattr__(self, "out_padding",
                           check_padding("out_padding", self.out_padding))
        for name, channels in (("in_pixel_stride", self.in_channels),
                               ("out_pixel_stride", self.out_channels)):
            value = getattr(self, name)
            value = channels if value is None else as_int(name, value)
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


class ConvGather(RowGather):
    """The :class:`RowGather` of a convolution: output pixel ``p = (b * OH + oh) * OW + ow``,
    and its taps: kernel taps, or kernel rows (``lowering``, see :data:`LOWERINGS`)."""

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

    def block_key(self, start, stop):
        # The runs of a block follow from where it starts in its image and how long it is:
        # another image's block at the same place differs only in its addresses.
        return start % (self.geometry.out_height * self.geometry.out_width), stop - start

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
    gather = ConvGather(_check_geometry(geometry), lowering)
    return gather if weights is None else gather.know_weights(weights)


def plan_conv2d(config, geometry, *, schedule="auto", lowering="taps", weights=None):
    """The :class:`~sw.compiler.plan.Plan` of a convolution: ``m`` output pixels,
    ``n = out_channels``, and ``KH * KW`` taps of ``k_tap = in_channels`` (``lowering="taps"``)
    or ``KH`` kernel rows of ``k_tap = KW * in_channels`` (``"kernel_rows"``). With
    ``weights`` (HWIO int8), all-zero weight tiles are skipped (a depthwise convolution's
    block-diagonal weights)."""
    return plan_quantized(config, _gather(geometry, lowering, weights), schedule=schedule)


def compile_conv2d(config, geometry, *, x_addr, w_addr, bias_addr, quant_addr, y_addr,
                   out_zero_point, act_min, act_max, schedule="auto", lowering="taps",
                   weights=None, quant_mode=QuantMode.FIXED, plan=None):
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
    plan : sw.compiler.plan.Plan, optional
        The plan :func:`plan_conv2d` made for this convolution, with the same lowering and
        weights (it is made here when not given).

    Returns
    -------
    sw.compiler.plan.Program
        ``addresses`` has the keys ``x_addr, w_addr, bias_addr, quant_addr, y_addr``. To chain
        layers into one program, concatenate the ``body`` of each and append one ``END``.
    """
    return compile_gathered(
        config, _gather(geometry, lowering, weights),
        dict(x_addr=x_addr, w_addr=w_addr, bias_addr=bias_addr, quant_addr=quant_addr,
             y_addr=y_addr), out_zero_point=out_zero_point, act_min=act_min, act_max=act_max,
        schedule=schedule, quant_mode=quant_mode, plan=plan)


def depthwise_weights(weights):
    """The block-diagonal HWIO weights (``KH x KW x C x C``) of a depthwise convolution whose
    weights are ``weights`` (int8, ``KH x KW x C``, one ``KH x KW`` filter per channel):
    input channel ``c`` meets output channel ``c`` only."""
    if not isinstance(weights, np.ndarray) or weights.dtype != np.int8 or weights.ndim != 3:
        raise NPUTypeError(f"depthwise weights must be an int8 numpy array of shape "
                           f"(kernel_height, kernel_width, channels), not "
                           f"{getattr(weights, 'dtype', type(weights).__name__)} of shape "
                           f"{getattr(weights, 'shape', None)}")
    channels = weights.shape[2]
    return weights[:, :, :, np.newaxis] * np.eye(channels, dtype=np.int8)


def _depthwise(geometry, weights):
    """The block-diagonal HWIO weights of ``weights``, checked against ``geometry``."""
    geometry = _check_geometry(geometry)
    hwio = depthwise_weights(weights)
    expected = (geometry.kernel_height, geometry.kernel_width, geometry.in_channels)
    if geometry.in_channels != geometry.out_channels or weights.shape != expected:
        raise NPUValueError(f"a depthwise convolution needs in_channels == out_channels and "
                            f"weights of shape (kernel_height, kernel_width, channels) = "
                            f"{expected}, but the geometry has {geometry.in_channels} -> "
                            f"{geometry.out_channels} channels and the weights the shape "
                            f"{weights.shape}")
    return hwio


def plan_depthwise_conv2d(config, geometry, weights, *, schedule="auto", lowering="taps"):
    """The plan of a depthwise convolution: :func:`plan_conv2d` of its block-diagonal HWIO
    weights (:func:`depthwise_weights`), whose all-zero tiles are skipped.

    Parameters
    ----------
    config : hw.config.NPUConfig
    geometry : Conv2dGeometry
        ``in_channels == out_channels``.
    weights : numpy.ndarray
        int8, ``kernel_height x kernel_width x channels``.
    schedule, lowering : str
        As for :func:`plan_conv2d`.
    """
    return plan_conv2d(config, geometry, schedule=schedule, lowering=lowering,
                       weights=_depthwise(geometry, weights))


def compile_depthwise_conv2d(config, geometry, weights, *, x_addr, w_addr, bias_addr,
                             quant_addr, y_addr, out_zero_point, act_min, act_max,
                             schedule="auto", lowering="taps", quant_mode=QuantMode.FIXED,
                             plan=None):
    """Compile a depthwise convolution: :func:`compile_conv2d` of its block-diagonal HWIO
    weights (:func:`depthwise_weights`), whose all-zero tiles are skipped.

    ``weights`` is int8, ``kernel_height x kernel_width x channels``; the region at
    ``w_addr`` holds ``depthwise_weights(weights)`` (``geometry.weight_bytes`` bytes). The
    other arguments and the result are those of :func:`compile_conv2d`; ``plan`` is the one
    :func:`plan_depthwise_conv2d` made.
    """
    return compile_conv2d(config, geometry, x_addr=x_addr, w_addr=w_addr, bias_addr=bias_addr,
                          quant_addr=quant_addr, y_addr=y_addr, out_zero_point=out_zero_point,
                          act_min=act_min, act_max=act_max, schedule=schedule,
                          lowering=lowering, weights=_depthwise(geometry, weights),
                          quant_mode=quant_mode, plan=plan)
