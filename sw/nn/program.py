"""Lowering a quantized network onto the NPU: activation buffers, DRAM images, programs.

The NPU operators of a network form a chain (convolutions and dense layers, with only
free flatten views between them). Each is compiled to a :class:`~sw.compiler.Program`:

* a convolution by :func:`sw.compiler.compile_conv2d` (lowering ``"taps"``: one weight matrix
  per kernel tap, or ``"kernel_rows"``: one per kernel row; :data:`sw.compiler.LOWERINGS`). It
  reads a pre-padded NHWC buffer whose border holds its input zero point
  (real 0), and writes its requantized INT8 output (``STORE_Q``) into the interior of its
  consumer's buffer: padded when the consumer is a padded convolution, plain NHWC otherwise;
* a dense layer by :func:`sw.compiler.compile_qgemm`, reading that plain NHWC buffer as a
  ``batch x (h*w*c)`` matrix: the flatten is a view, since
  :func:`sw.nn.passes.flatten_as_view` put the weight rows in NHWC order.

Two ways to run the chain:

* :func:`build_fused_program`: every NPU operator in ONE program, the layers' bodies
  concatenated before one ``END``; intermediate activations never leave DRAM, and their
  buffers share memory as :func:`sw.nn.memory.plan_buffers` allows;
* :func:`build_layer_program`: one operator per program, with its own input and output
  buffers; the host copies each output into the next layer's input (a round trip).

DRAM image (every region 64-byte aligned)::

    0x0000   64 zero bytes (a program pointer of 0 hits an illegal opcode)
    0x0040   program, 16 bytes per instruction
             per NPU operator: weights (INT8, HWIO or K x N), bias (INT32, the input zero
             point folded in), requantization parameters (N multipliers, N shifts, INT32)
             activation arena (buffers as planned)

Both lay the image out first (:class:`ImageLayout`: the operators' plans, every region's
address, the image's size), then compile and fill it; :func:`layout_fused_program` is that
first step alone, for ``npu onnx --plan``: the plans are counted, not emitted
(:mod:`sw.compiler.quantized`), so a network of tens of millions of instructions is laid out
in a second or two. An image larger than the 4 GiB the DMA's addresses reach is refused
before anything is compiled (:func:`check_addressable`).
"""

from dataclasses import dataclass

import numpy as np

from hw.isa import INSTR_BYTES, Opcode, QuantMode
from .. import codec
from ..compiler import (LOWERINGS, Conv2dGeometry, check_lowering, compile_conv2d,
                        compile_qgemm, plan_conv2d, plan_qgemm)
from ..driver import DRAM_GRANULE, POISON, PROGRAM_ADDR, REGION_ALIGN
from ..errors import NPUValueError
from .memory import TensorLife, plan_buffers


__all__ = ["ActivationBuffer", "LOWERINGS", "activation_buffers", "fused_lifetimes",
           "NetworkImage", "ImageLayout", "layout_fused_program", "check_addressable",
           "build_fused_program", "build_layer_program", "program_traffic"]


def _align(value, alignment):
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class ActivationBuffer:
    """An INT8 NHWC activation tensor in DRAM, possibly inside a zero-point border.

    Attributes
    ----------
    name : str
        ``"input"`` or the producing operator's name.
    batch, height, width, channels : int
        The tensor itself (the interior).
    padding : int
        Border width in pixels on every side.
    zero_point : int
        Value of the border bytes: the consumer's input zero point.
    """
    name: str
    batch: int
    height: int
    width: int
    channels: int
    padding: int = 0
    zero_point: int = 0

    @property
    def padded_height(self):
        return self.height + 2 * self.padding

    @property
    def padded_width(self):
        return self.width + 2 * self.padding

    @property
    def bytes(self):
        return self.batch * self.padded_height * self.padded_width * self.channels

    @property
    def interior_bytes(self):
        return self.batch * self.height * self.width * self.channels

    @property
    def border_bytes(self):
        return self.bytes - self.interior_bytes

    @property
    def host_initialized(self):
        """True when the buffer holds host-written bytes before a program writes it: a
        border (the network input is host-written in any case)."""
        return self.padding > 0

    def image(self, interior=None):
        """The buffer's bytes (uint8): the border at the zero point, and ``interior`` (int8,
        ``batch x height x width x channels``) inside, or the zero point there too."""
        full = np.full((self.batch, self.padded_height, self.padded_width, self.channels),
                       self.zero_point, dtype=np.int8)
        if interior is not None:
            interior = np.asarray(interior)
            expected = (self.batch, self.height, self.width, self.channels)
            if interior.dtype != np.int8 or interior.shape != expected:
                raise NPUValueError(f"buffer {self.name} takes int8 of shape {expected}, not "
                                    f"{interior.dtype} of shape {interior.shape}")
            p = self.padding
            full[:, p:p + self.height, p:p + self.width] = interior
        return full.view(np.uint8).reshape(-1)

    def border_mask(self):
        """Boolean mask (one per byte) of the border."""
        mask = np.ones((self.batch, self.padded_height, self.padded_width, self.channels),
                       dtype=bool)
        p = self.padding
        mask[:, p:p + self.height, p:p + self.width] = False
        return mask.reshape(-1)

    def read(self, data):
        """The interior (int8, NHWC) of the buffer's bytes ``data``."""
        full = np.asarray(data).view(np.int8).reshape(
            self.batch, self.padded_height, self.padded_width, self.channels)
        p = self.padding
        return full[:, p:p + self.height, p:p + self.width].copy()


def _input_buffer(op, batch, name):
    """The buffer ``op`` reads: padded NHWC for a convolution, a plain matrix for a dense."""
    if op.kind == "conv2d":
        height, width, channels = op.input_shape
        return ActivationBuffer(name, batch, height, width, channels, padding=op.padding,
                                zero_point=op.input.zero_point)
    return ActivationBuffer(name, batch, 1, 1, op.k)


def activation_buffers(ops, batch):
    """``{name: ActivationBuffer}`` for the chain ``ops``: ``"input"`` and each operator's
    output, laid out for its consumer (a dense layer's input is the previous layer's NHWC
    output viewed as a matrix)."""
    buffers = {"input": _input_buffer(ops[0], batch, "input")}
    for op, consumer in zip(ops, list(ops[1:]) + [None]):
        height, width, channels = (op.output_shape if op.kind == "conv2d"
                                   else (1, 1, op.n))
        if consumer is not None and consumer.kind == "conv2d":
            buffers[op.name] = ActivationBuffer(op.name, batch, height, width, channels,
                                                padding=consumer.padding,
                                                zero_point=consumer.input.zero_point)
        else:
            if consumer is not None and height * width * channels != consumer.k:
                raise NPUValueError(f"{consumer.name} takes {consumer.k} features, but "
                                    f"{op.name} makes {height}x{width}x{channels}")
            buffers[op.name] = ActivationBuffer(op.name, batch, height, width, channels)
    return buffers


def _conv_geometry(op, source, target):
    if source.padding != op.padding:
        raise NPUValueError(f"{op.name} pads by {op.padding}, but its input buffer "
                            f"{source.name} has a border of {source.padding}")
    return Conv2dGeometry(batch=source.batch, height=source.height, width=source.width,
                          in_channels=source.channels, out_channels=op.n,
                          kernel_height=op.kernel[0], kernel_width=op.kernel[1],
                          stride=op.stride, padding=op.padding, out_padding=target.padding)


def _plan_op(config, op, source, target, lowering):
    """The :class:`~sw.compiler.Plan` of one operator (no addresses needed)."""
    if op.kind == "conv2d":
        return plan_conv2d(config, _conv_geometry(op, source, target), lowering=lowering,
                           weights=op.weight)
    _check_dense_buffers(op, source, target)
    return plan_qgemm(config, source.batch, op.k, op.n)


def _check_dense_buffers(op, source, target):
    if source.padding or target.padding:
        raise NPUValueError(f"{op.name}: a dense layer needs plain (unpadded) buffers")


def _compile_op(config, op, source, target, addresses, act_min, act_max, lowering, plan):
    """Compile one operator with its plan (:func:`_plan_op`); ``addresses`` has ``x, w,
    bias, quant, y``."""
    common = dict(bias_addr=addresses["bias"], quant_addr=addresses["quant"],
                  y_addr=addresses["y"], out_zero_point=op.output.zero_point,
                  act_min=act_min, act_max=act_max, plan=plan,
                  quant_mode=QuantMode.FIXED if op.scale is None else QuantMode.FLOAT)
    if op.kind == "conv2d":
        return compile_conv2d(config, _conv_geometry(op, source, target),
                              x_addr=addresses["x"], w_addr=addresses["w"],
                              lowering=lowering, weights=op.weight, **common)
    _check_dense_buffers(op, source, target)
    return compile_qgemm(config, source.batch, op.k, op.n, a_addr=addresses["x"],
                         b_addr=addresses["w"], **common)


def fused_lifetimes(ops, buffers):
    """Lifetimes of the chain's buffers in one program: step 0 is the host writing the
    input (and every border), step ``i`` the ``i``-th operator, the last step the host
    reading the output."""
    names = ["input"] + [op.name for op in ops]
    lives = []
    for index, name in enumerate(names):
        # A border is host-written before the program: the buffer lives from step 0, and
        # (except the input, which the host rewrites whole for every batch) it is pinned so
        # that the border written once at set-up stays valid for every batch.
        bordered = buffers[name].host_initialized
        first = 0 if index == 0 or bordered else index
        lives.append(TensorLife(name, buffers[name].bytes, first, index + 1,
                                pinned=bordered and index > 0))
    return lives


def _constant_regions(op):
    """``[(region name, bytes as uint8)]`` of an operator's weights, bias and requantization
    parameters."""
    if op.scale is not None:
        # The float32 mode: the scales' bit patterns in row 0, row 1 (shifts) all zero.
        quant = np.concatenate([np.asarray(op.scale, "<f4").view("<i4"),
                                np.zeros(op.n, "<i4")])
    else:
        quant = np.concatenate([op.multiplier.astype("<i4"), op.shift.astype("<i4")])
    return [(f"{op.name}.weight", np.ascontiguousarray(op.gemm_weight).view(np.uint8)
             .reshape(-1)),
            (f"{op.name}.bias", op.acc_bias.astype("<i4").view(np.uint8)),
            (f"{op.name}.quant", quant.view(np.uint8))]


def _constant_sizes(op):
    """``[(region name, bytes)]`` of :func:`_constant_regions`, without making the data."""
    return [(f"{op.name}.weight", op.k * op.n), (f"{op.name}.bias", 4 * op.n),
            (f"{op.name}.quant", 8 * op.n)]


@dataclass
class NetworkImage:
    """A program in its DRAM image, ready for :func:`sw.backend.run_programs`.

    Attributes
    ----------
    dram : numpy.ndarray
        uint8, the initial DRAM contents.
    program_addr : int
    words : list of int
        The program, ``END`` last.
    regions : dict
        ``{name: (addr, bytes)}`` of the constants and of every activation buffer.
    buffers : dict
        ``{name: ActivationBuffer}``.
    plans : dict
        ``{operator name: sw.compiler.Plan}``.
    output : str
        Name of the buffer that holds the result.
    buffer_plan : sw.nn.memory.BufferPlan or None
        The activation arena's plan (fused programs).
    spans : dict
        ``{operator name: (first, stop)}``: the instructions each operator's body occupies
        in ``words`` (the final ``END`` is nobody's).
    """
    dram: np.ndarray
    program_addr: int
    words: list
    regions: dict
    buffers: dict
    plans: dict
    output: str
    buffer_plan: object = None
    spans: dict = None

    @property
    def program_len(self):
        return len(self.words)

    def run_args(self):
        """``(dram, prog_addr, prog_len)`` for :func:`sw.backend.run_programs`."""
        return self.dram, self.program_addr, len(self.words)

    def read(self, dram, name=None):
        """The interior of buffer ``name`` (default: the output) from a DRAM after the run."""
        name = self.output if name is None else name
        addr, size = self.regions[name]
        return self.buffers[name].read(dram[addr:addr + size])


@dataclass
class ImageLayout:
    """Where a program and its data go in DRAM, and how big the image is, before anything
    is compiled: :func:`layout_fused_program` (for ``npu onnx --plan``, which runs nothing)
    and the first step of :func:`build_fused_program`.

    Attributes
    ----------
    program_addr, instructions : int
        The program's address and length (``END`` included), from the operators' plans.
    regions : dict
        ``{name: (addr, bytes)}`` of the constants and of every activation buffer.
    buffers : dict
        ``{name: ActivationBuffer}``.
    plans : dict
        ``{operator name: sw.compiler.Plan}``.
    dram_bytes : int
        Bytes of the DRAM image: everything up to the end of the activation arena.
    arena, arena_bytes : int
        The activation arena's address and size.
    buffer_plan : sw.nn.memory.BufferPlan or None
    """
    program_addr: int
    instructions: int
    regions: dict
    buffers: dict
    plans: dict
    dram_bytes: int
    arena: int
    arena_bytes: int
    buffer_plan: object = None

    @property
    def program_bytes(self):
        return INSTR_BYTES * self.instructions


def _layout(config, ops, buffers, arena_offsets, arena_bytes, lowering, buffer_plan=None):
    """Plan every operator and lay out program, constants and arena (nothing compiled)."""
    check_lowering(lowering)
    sources = ["input"] + [op.name for op in ops[:-1]]
    plans = {op.name: _plan_op(config, op, buffers[source], buffers[op.name], lowering)
             for op, source in zip(ops, sources)}
    instructions = 1 + sum(plan.instructions - 1 for plan in plans.values())
    position = _align(PROGRAM_ADDR + INSTR_BYTES * instructions, REGION_ALIGN)
    regions = {}
    for op in ops:
        for name, size in _constant_sizes(op):
            regions[name] = (position, size)
            position = _align(position + size, REGION_ALIGN)
    arena = position
    for name, offset in arena_offsets.items():
        regions[name] = (arena + offset, buffers[name].bytes)
    return ImageLayout(program_addr=PROGRAM_ADDR, instructions=instructions, regions=regions,
                       buffers=buffers, plans=plans,
                       dram_bytes=_align(arena + arena_bytes, DRAM_GRANULE), arena=arena,
                       arena_bytes=arena_bytes, buffer_plan=buffer_plan)


def check_addressable(config, dram_bytes, what="the program and its data"):
    """Refuse an image of ``dram_bytes`` that the DMA's addresses do not reach (4 GiB)."""
    if dram_bytes > config.dram_bytes:
        raise NPUValueError(f"{what} need {dram_bytes:,} bytes of DRAM, more than the "
                            f"{config.dram_bytes >> 30} GiB a {config.addr_width}-bit "
                            f"address reaches")


def _image(config, ops, layout, input_q, act_overrides, lowering):
    """Compile the operators at the addresses of ``layout`` and fill the DRAM image."""
    check_addressable(config, layout.dram_bytes)
    buffers, regions = layout.buffers, layout.regions
    sources = ["input"] + [op.name for op in ops[:-1]]
    # Layers chain by concatenating the bodies of their programs, then one END.
    words, spans = [], {}
    for op, source in zip(ops, sources):
        act_min, act_max = act_overrides.get(op.name, (op.act_min, op.act_max))
        addresses = {"x": regions[source][0], "w": regions[f"{op.name}.weight"][0],
                     "bias": regions[f"{op.name}.bias"][0],
                     "quant": regions[f"{op.name}.quant"][0], "y": regions[op.name][0]}
        program = _compile_op(config, op, buffers[source], buffers[op.name], addresses,
                              act_min, act_max, lowering, layout.plans[op.name])
        spans[op.name] = (len(words), len(words) + len(program.body))
        words.extend(program.body)
    words.append(codec.encode(Opcode.END))
    if len(words) != layout.instructions:
        raise RuntimeError(f"program length {len(words)} differs from the planned "
                           f"{layout.instructions}")

    dram = np.zeros(layout.dram_bytes, dtype=np.uint8)
    dram[PROGRAM_ADDR:PROGRAM_ADDR + INSTR_BYTES * len(words)] = \
        np.frombuffer(codec.pack_words(words), dtype=np.uint8)
    for op in ops:
        for name, data in _constant_regions(op):
            addr, size = regions[name]
            dram[addr:addr + size] = data
    arena, arena_bytes = layout.arena, layout.arena_bytes
    dram[arena:arena + arena_bytes] = POISON    # a missed store cannot read as data
    # Host-written buffers last: they live from step 0, so nothing planned into the same
    # bytes is live before them.
    for name, buffer in buffers.items():
        addr, nbytes = regions[name]
        if name == "input":
            dram[addr:addr + nbytes] = buffer.image(input_q)
        elif buffer.host_initialized:
            dram[addr:addr + nbytes][buffer.border_mask()] = np.uint8(buffer.zero_point & 0xFF)
    return NetworkImage(dram=dram, program_addr=PROGRAM_ADDR, words=words, regions=regions,
                        buffers=buffers, plans=layout.plans, output=ops[-1].name,
                        buffer_plan=layout.buffer_plan, spans=spans)


def _fused_layout(config, ops, batch, lowering):
    buffers = activation_buffers(ops, batch)
    buffer_plan = plan_buffers(fused_lifetimes(ops, buffers), alignment=REGION_ALIGN)
    offsets = {name: buffer_plan.offset(name) for name in buffers}
    return _layout(config, ops, buffers, offsets, buffer_plan.total_bytes, lowering,
                   buffer_plan)


def layout_fused_program(config, ops, batch, *, lowering="taps"):
    """The :class:`ImageLayout` of :func:`build_fused_program` for a batch of ``batch``
    samples, without compiling: the same plans, addresses and DRAM size, in a fraction of
    the time (the operators' plans are counted, not emitted)."""
    return _fused_layout(config, tuple(ops), batch, lowering)


def build_fused_program(config, ops, input_q, *, lowering="taps"):
    """One program for the whole NPU chain, on the batch ``input_q`` (int8 NHWC, or a
    matrix if the chain starts with a dense layer).

    The activation buffers are planned with reuse (:func:`sw.nn.memory.plan_buffers`);
    ``lowering`` is one of :data:`LOWERINGS`.
    """
    ops = tuple(ops)
    layout = _fused_layout(config, ops, len(input_q), lowering)
    input_q = _as_buffer_shape(layout.buffers["input"], input_q)
    return _image(config, ops, layout, input_q, {}, lowering)


def _as_buffer_shape(buffer, x):
    """``x`` as the buffer's ``batch x height x width x channels``. A plain ``batch x
    features`` buffer (a dense layer's input) takes any ``batch x ...`` array with that many
    values per sample: the NHWC flatten, which is a view; nothing else is reshaped."""
    x = np.asarray(x)
    shape = (buffer.batch, buffer.height, buffer.width, buffer.channels)
    if x.shape == shape:
        return x
    if (buffer.height == buffer.width == 1 and x.ndim >= 2 and x.shape[0] == buffer.batch
            and int(np.prod(x.shape[1:])) == buffer.channels):
        return x.reshape(shape)
    raise NPUValueError(f"the input must have shape {shape}, not {x.shape}")


def build_layer_program(config, op, input_q, *, act_min=None, lowering="taps"):
    """One program for one NPU operator, its input written by the host into its own buffer
    (``act_min`` overrides the clamp's lower end, e.g. -128 for an unfused ReLU)."""
    buffers = activation_buffers((op,), len(input_q))
    offsets, position = {}, 0
    for name in ("input", op.name):
        offsets[name] = position
        position = _align(position + buffers[name].bytes, REGION_ALIGN)
    overrides = {} if act_min is None else {op.name: (act_min, op.act_max)}
    layout = _layout(config, (op,), buffers, offsets, position, lowering)
    return _image(config, (op,), layout, _as_buffer_shape(buffers["input"], input_q),
                  overrides, lowering)


def program_traffic(words):
    """``{"read": bytes, "written": bytes, "program": bytes}`` that a program's DMA
    instructions move, counted from the words themselves."""
    read = written = 0
    for word in words:
        opcode, fields = codec.decode(word)
        if opcode in (Opcode.LOAD_SPAD, Opcode.LOAD_ACC):
            read += fields["rows"] * fields["row_bytes"]
        elif opcode is Opcode.LOAD_QUANT:
            read += 2 * fields["row_bytes"]
        elif opcode in (Opcode.STORE, Opcode.STORE_Q):
            written += fields["rows"] * fields["row_bytes"]
    return {"read": read, "written": written, "program": INSTR_BYTES * len(words)}
