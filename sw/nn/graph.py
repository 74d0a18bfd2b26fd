"""A network description: layers with float weights, laid out NHWC, and their float forward pass.

A :class:`Network` is a chain of layers applied to a batch of images of shape
``(batch, height, width, channels)``. Layers:

* :class:`Conv2D`: weights ``(kernel_h, kernel_w, in_channels, out_channels)`` (HWIO), an
  optional bias, stride, zero padding and an optional fused activation (``"relu"``);
* :class:`ReLU`, :class:`BatchNorm` (inference form: running mean and variance);
* :class:`Flatten`: ``order="HWC"`` keeps the NHWC memory order (a free view), ``"CHW"``
  flattens channel-major as PyTorch does;
* :class:`Dense`: weights ``(in_features, out_features)``, bias, optional activation;
* CPU-only operators: :class:`MaxPool2D`, :class:`Softmax`, :class:`Argmax`.

The convolution is computed by im2col (:func:`im2col`): every output pixel's receptive field
becomes one row of ``kernel_h * kernel_w * in_channels`` values in (kh, kw, c) order, so the
layer is a GEMM with the HWIO weights viewed as a ``(kh*kw*cin) x cout`` matrix. That is the
same matrix the NPU multiplies.
"""

from dataclasses import dataclass, field

import numpy as np

from ..errors import NPUTypeError, NPUValueError


__all__ = ["Layer", "Conv2D", "ReLU", "BatchNorm", "Flatten", "Dense", "MaxPool2D",
           "Softmax", "Argmax", "Network", "im2col", "conv_output_size", "ACTIVATIONS",
           "FLATTEN_ORDERS"]


#: Activations a Conv2D or Dense layer can carry fused.
ACTIVATIONS = (None, "relu")


def conv_output_size(size, kernel, stride, padding):
    """Output extent of a convolution along one axis."""
    return (size + 2 * padding - kernel) // stride + 1


def im2col(x, kernel_h, kernel_w, stride, padding, pad_value=0):
    """Receptive fields of an NHWC batch as rows, in (kh, kw, c) order.

    Parameters
    ----------
    x : numpy.ndarray
        ``(batch, height, width, channels)``, any dtype.
    kernel_h, kernel_w, stride, padding : int
    pad_value : scalar
        Value of the border (0 for floats; the input zero point for quantized tensors).

    Returns
    -------
    numpy.ndarray
        ``(batch, out_h, out_w, kernel_h * kernel_w * channels)``, dtype of ``x``.
    """
    batch, height, width, channels = x.shape
    if padding:
        x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)),
                   constant_values=pad_value)
    out_h = conv_output_size(height, kernel_h, stride, padding)
    out_w = conv_output_size(width, kernel_w, stride, padding)
    windows = np.lib.stride_tricks.sliding_window_view(x, (kernel_h, kernel_w), axis=(1, 2))
    # windows: (batch, H', W', channels, kernel_h, kernel_w) -> stride, then (kh, kw, c) order.
    windows = windows[:, ::stride, ::stride][:, :out_h, :out_w]
    return np.ascontiguousarray(windows.transpose(0, 1, 2, 4, 5, 3)).reshape(
        batch, out_h, out_w, kernel_h * kernel_w * channels)


def _check_name(name):
    if not isinstance(name, str) or not name:
        raise NPUValueError(f"a layer name must be a non-empty string, not {name!r}")


def _check_float_array(owner, name, value, ndim):
    if not isinstance(value, np.ndarray):
        raise NPUTypeError(f"{owner}.{name} must be a numpy array, not {type(value).__name__}")
    if value.dtype.kind != "f":
        raise NPUTypeError(f"{owner}.{name} must hold floats, not {value.dtype}")
    if value.ndim != ndim:
        raise NPUValueError(f"{owner}.{name} must have {ndim} dimensions, not shape "
                            f"{value.shape}")


def _check_activation(owner, activation):
    if activation not in ACTIVATIONS:
        raise NPUValueError(f"{owner}.activation must be one of {ACTIVATIONS}, "
                            f"not {activation!r}")


def _apply_activation(x, activation):
    return np.maximum(x, 0) if activation == "relu" else x


class Layer:
    """Base class: a named operator with a float forward pass on a batch."""

    name: str

    def output_shape(self, input_shape):
        """Shape of one sample's output, given one sample's input shape (no batch axis)."""
        return input_shape

    def forward(self, x):
        raise NotImplementedError


@dataclass(eq=False)
class Conv2D(Layer):
    """2-D convolution on NHWC: ``y = act(conv(x, weight) + bias)``.

    Parameters
    ----------
    name : str
    weight : numpy.ndarray
        Floats, ``(kernel_h, kernel_w, in_channels, out_channels)``.
    bias : numpy.ndarray or None
        Floats, ``(out_channels,)``.
    stride, padding : int
        Zero padding of ``padding`` pixels on every side.
    activation : None or "relu"
    """
    name: str
    weight: np.ndarray
    bias: "np.ndarray | None" = None
    stride: int = 1
    padding: int = 0
    activation: "str | None" = None

    def __post_init__(self):
        _check_name(self.name)
        _check_float_array(self.name, "weight", self.weight, 4)
        if self.bias is not None:
            _check_float_array(self.name, "bias", self.bias, 1)
            if self.bias.shape[0] != self.out_channels:
                raise NPUValueError(f"{self.name}.bias must have {self.out_channels} values "
                                    f"(out_channels), not {self.bias.shape[0]}")
        if not isinstance(self.stride, int) or self.stride < 1:
            raise NPUValueError(f"{self.name}.stride must be a positive integer, "
                                f"not {self.stride!r}")
        if not isinstance(self.padding, int) or self.padding < 0:
            raise NPUValueError(f"{self.name}.padding must be a non-negative integer, "
                                f"not {self.padding!r}")
        _check_activation(self.name, self.activation)

    @property
    def kernel(self):
        return self.weight.shape[:2]

    @property
    def in_channels(self):
        return self.weight.shape[2]

    @property
    def out_channels(self):
        return self.weight.shape[3]

    def output_shape(self, input_shape):
        height, width, channels = input_shape
        if channels != self.in_channels:
            raise NPUValueError(f"{self.name} takes {self.in_channels} input channels, "
                                f"not {channels}")
        kernel_h, kernel_w = self.kernel
        out_h = conv_output_size(height, kernel_h, self.stride, self.padding)
        out_w = conv_output_size(width, kernel_w, self.stride, self.padding)
        if out_h < 1 or out_w < 1:
            raise NPUValueError(f"{self.name}: a {height}x{width} input is smaller than the "
                                f"{kernel_h}x{kernel_w} kernel with padding {self.padding}")
        return (out_h, out_w, self.out_channels)

    def forward(self, x):
        kernel_h, kernel_w = self.kernel
        columns = im2col(x, kernel_h, kernel_w, self.stride, self.padding)
        y = columns @ self.weight.reshape(-1, self.out_channels).astype(x.dtype)
        if self.bias is not None:
            y = y + self.bias.astype(x.dtype)
        return _apply_activation(y, self.activation)


@dataclass(eq=False)
class ReLU(Layer):
    name: str

    def __post_init__(self):
        _check_name(self.name)

    def forward(self, x):
        return np.maximum(x, 0)


@dataclass(eq=False)
class BatchNorm(Layer):
    """Inference-time batch normalization over the channel (last) axis:
    ``y = gamma * (x - mean) / sqrt(var + eps) + beta``."""
    name: str
    gamma: np.ndarray
    beta: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    eps: float = 1e-5

    def __post_init__(self):
        _check_name(self.name)
        for attribute in ("gamma", "beta", "mean", "var"):
            _check_float_array(self.name, attribute, getattr(self, attribute), 1)
            if getattr(self, attribute).shape != self.gamma.shape:
                raise NPUValueError(f"{self.name}.{attribute} must have shape "
                                    f"{self.gamma.shape}, not {getattr(self, attribute).shape}")
        if np.any(self.var < 0):
            raise NPUValueError(f"{self.name}.var must not be negative")
        if not self.eps > 0:
            raise NPUValueError(f"{self.name}.eps must be positive, not {self.eps!r}")

    @property
    def channels(self):
        return self.gamma.shape[0]

    def output_shape(self, input_shape):
        if input_shape[-1] != self.channels:
            raise NPUValueError(f"{self.name} normalizes {self.channels} channels, "
                                f"not {input_shape[-1]}")
        return input_shape

    def scale_shift(self):
        """``(scale, shift)`` with ``y = x * scale + shift``, in float64."""
        scale = self.gamma.astype(np.float64) / np.sqrt(self.var.astype(np.float64) + self.eps)
        return scale, self.beta.astype(np.float64) - self.mean.astype(np.float64) * scale

    def forward(self, x):
        scale, shift = self.scale_shift()
        return (x * scale.astype(x.dtype) + shift.astype(x.dtype)).astype(x.dtype)


#: Flatten orders: "HWC" reads the NHWC memory as it lies, "CHW" is PyTorch's order.
FLATTEN_ORDERS = ("HWC", "CHW")


@dataclass(eq=False)
class Flatten(Layer):
    """``(batch, h, w, c) -> (batch, h*w*c)``; ``order`` says how the features are numbered."""
    name: str
    order: str = "HWC"

    def __post_init__(self):
        _check_name(self.name)
        if self.order not in FLATTEN_ORDERS:
            raise NPUValueError(f"{self.name}.order must be one of {FLATTEN_ORDERS}, "
                                f"not {self.order!r}")

    @property
    def is_view(self):
        """True when flattening moves no data: the features are in NHWC memory order."""
        return self.order == "HWC"

    def output_shape(self, input_shape):
        return (int(np.prod(input_shape)),)

    def forward(self, x):
        if self.order == "CHW":
            x = x.transpose(0, 3, 1, 2)
        return x.reshape(x.shape[0], -1)


@dataclass(eq=False)
class Dense(Layer):
    """Fully connected: ``y = act(x @ weight + bias)`` on ``(batch, in_features)``."""
    name: str
    weight: np.ndarray
    bias: "np.ndarray | None" = None
    activation: "str | None" = None

    def __post_init__(self):
        _check_name(self.name)
        _check_float_array(self.name, "weight", self.weight, 2)
        if self.bias is not None:
            _check_float_array(self.name, "bias", self.bias, 1)
            if self.bias.shape[0] != self.out_features:
                raise NPUValueError(f"{self.name}.bias must have {self.out_features} values "
                                    f"(out_features), not {self.bias.shape[0]}")
        _check_activation(self.name, self.activation)

    @property
    def in_features(self):
        return self.weight.shape[0]

    @property
    def out_features(self):
        return self.weight.shape[1]

    def output_shape(self, input_shape):
        if input_shape != (self.in_features,):
            raise NPUValueError(f"{self.name} takes ({self.in_features},) features per "
                                f"sample, not {input_shape}: flatten first")
        return (self.out_features,)

    def forward(self, x):
        y = x @ self.weight.astype(x.dtype)
        if self.bias is not None:
            y = y + self.bias.astype(x.dtype)
        return _apply_activation(y, self.activation)


@dataclass(eq=False)
class MaxPool2D(Layer):
    """Max pooling over ``size x size`` windows with stride ``size`` (no padding)."""
    name: str
    size: int = 2

    def __post_init__(self):
        _check_name(self.name)
        if not isinstance(self.size, int) or self.size < 1:
            raise NPUValueError(f"{self.name}.size must be a positive integer, "
                                f"not {self.size!r}")

    def output_shape(self, input_shape):
        height, width, channels = input_shape
        return (height // self.size, width // self.size, channels)

    def forward(self, x):
        batch, height, width, channels = x.shape
        s = self.size
        x = x[:, :height // s * s, :width // s * s]
        return x.reshape(batch, height // s, s, width // s, s, channels).max(axis=(2, 4))


@dataclass(eq=False)
class Softmax(Layer):
    """Softmax over the last axis, in float."""
    name: str

    def __post_init__(self):
        _check_name(self.name)

    def forward(self, x):
        shifted = x - x.max(axis=-1, keepdims=True)
        e = np.exp(shifted)
        return e / e.sum(axis=-1, keepdims=True)


@dataclass(eq=False)
class Argmax(Layer):
    """Index of the largest value on the last axis (the first one on a tie)."""
    name: str

    def __post_init__(self):
        _check_name(self.name)

    def output_shape(self, input_shape):
        return ()

    def forward(self, x):
        return np.argmax(x, axis=-1)


@dataclass(eq=False)
class Network:
    """A chain of layers on NHWC batches.

    Parameters
    ----------
    input_shape : tuple of int
        One sample: ``(height, width, channels)``.
    layers : list of Layer
        Applied in order; names must be unique.
    """
    input_shape: tuple
    layers: list = field(default_factory=list)

    def __post_init__(self):
        self.input_shape = tuple(int(extent) for extent in self.input_shape)
        if len(self.input_shape) != 3 or min(self.input_shape) < 1:
            raise NPUValueError(f"input_shape must be (height, width, channels), not "
                                f"{self.input_shape}")
        names = [layer.name for layer in self.layers]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise NPUValueError(f"layer names must be unique; repeated: {duplicates}")
        self.shapes()   # checks that the layers chain

    def __getitem__(self, name):
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"no layer named {name!r}; layers: "
                       f"{[layer.name for layer in self.layers]}")

    def shapes(self):
        """``[(layer, input_shape, output_shape)]`` for every layer, per sample."""
        result = []
        shape = self.input_shape
        for layer in self.layers:
            output = layer.output_shape(shape)
            result.append((layer, shape, output))
            shape = output
        return result

    def forward(self, x, *, stop=None):
        """Run the batch ``x`` through the layers, up to and including ``stop`` (a name)."""
        if stop is not None:
            self[stop]   # raises KeyError on an unknown name
        for layer in self.layers:
            x = layer.forward(x)
            if layer.name == stop:
                break
        return x

    def trace(self, x):
        """``{layer name: output}`` of every layer on the batch ``x``."""
        outputs = {}
        for layer in self.layers:
            x = layer.forward(x)
            outputs[layer.name] = x
        return outputs

    def summary(self):
        lines = [f"input {self.input_shape}"]
        for layer, _, output in self.shapes():
            lines.append(f"{layer.name:>10}  {type(layer).__name__:<10} -> {output}")
        return "\n".join(lines)
