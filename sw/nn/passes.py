"""Graph passes on a float :class:`~sw.nn.graph.Network`, before quantization.

* :func:`fold_batchnorm`: a BatchNorm right after a Conv2D or Dense (with no activation in
  between) becomes part of that layer's weights and bias. With ``s = gamma / sqrt(var + eps)``
  per output channel, ``BN(conv(x, w) + b) = conv(x, w * s) + (b - mean) * s + beta``:
  the same function, computed in float64.
* :func:`fuse_activations`: a ReLU right after a Conv2D or Dense becomes that layer's
  activation. After quantization it costs nothing: the requantization clamp starts at the
  output zero point (``act_min = zero_point``), which is where real 0 lies.
* :func:`flatten_as_view`: a channel-major ("CHW") Flatten before a Dense is replaced by an
  "HWC" Flatten, the NHWC memory order, and the Dense weight rows are permuted to match. The
  Flatten then moves no data: the Dense reads the previous layer's NHWC output as a
  ``batch x (h*w*c)`` matrix where it lies in DRAM.

:func:`prepare` runs all three and records, for every layer of the result, which layers of
the original it stands for.
"""

import copy
from dataclasses import dataclass, replace

import numpy as np

from .graph import BatchNorm, Conv2D, Dense, Flatten, Network, ReLU


__all__ = ["fold_batchnorm", "fuse_activations", "flatten_as_view", "hwc_order_of_chw",
           "prepare", "Prepared"]


def _rebuild(network, layers):
    return Network(input_shape=network.input_shape, layers=layers)


def fold_batchnorm(network, sources=None):
    """Fold every BatchNorm that directly follows a Conv2D or Dense without activation.

    Returns a new network (the input is not modified); folded layers hold float64 weights.
    ``sources`` (``{name: tuple of original names}``) is updated when given.
    """
    layers = []
    notes = []
    for layer in network.layers:
        previous = layers[-1] if layers else None
        if (isinstance(layer, BatchNorm) and isinstance(previous, (Conv2D, Dense))
                and previous.activation is None):
            scale, shift = layer.scale_shift()
            weight = previous.weight.astype(np.float64) * scale   # scales the output axis
            bias = shift if previous.bias is None else \
                previous.bias.astype(np.float64) * scale + shift
            layers[-1] = replace(previous, weight=weight, bias=bias)
            if sources is not None:
                sources[previous.name] = sources.get(previous.name, (previous.name,)) + \
                    sources.pop(layer.name, (layer.name,))
            notes.append(f"{layer.name} folded into {previous.name}: weights scaled by "
                         f"gamma/sqrt(var+eps) per output channel, bias shifted")
        else:
            layers.append(copy.copy(layer))
    return _rebuild(network, layers), notes


def fuse_activations(network, sources=None):
    """Make every ReLU that directly follows a Conv2D or Dense that layer's activation."""
    layers = []
    notes = []
    for layer in network.layers:
        previous = layers[-1] if layers else None
        if (isinstance(layer, ReLU) and isinstance(previous, (Conv2D, Dense))
                and previous.activation is None):
            layers[-1] = replace(previous, activation="relu")
            if sources is not None:
                sources[previous.name] = sources.get(previous.name, (previous.name,)) + \
                    sources.pop(layer.name, (layer.name,))
            notes.append(f"{layer.name} fused into {previous.name}: the requantization clamp "
                         f"starts at the output zero point")
        else:
            layers.append(copy.copy(layer))
    return _rebuild(network, layers), notes


def hwc_order_of_chw(height, width, channels):
    """``perm`` with ``x_hwc == x_chw[perm]``: the channel-major feature index of each NHWC
    feature index."""
    return np.arange(channels * height * width).reshape(channels, height, width) \
        .transpose(1, 2, 0).reshape(-1)


def flatten_as_view(network, sources=None):
    """Turn each "CHW" Flatten that feeds a Dense into a free "HWC" view."""
    shapes = {layer.name: input_shape for layer, input_shape, _ in network.shapes()}
    layers = []
    notes = []
    pending = None      # (flatten layer, its input shape) waiting for the Dense after it
    for layer in network.layers:
        if isinstance(layer, Flatten) and layer.order == "CHW":
            pending = (layer, shapes[layer.name])
            layers.append(replace(layer, order="HWC"))
            continue
        if pending is not None:
            flatten, (height, width, channels) = pending
            if not isinstance(layer, Dense):
                # Something else consumes the features: keep the channel-major order.
                layers[-1] = copy.copy(flatten)
            else:
                perm = hwc_order_of_chw(height, width, channels)
                layer = replace(layer, weight=layer.weight[perm])
                notes.append(f"{flatten.name} is a view: {layer.name}'s weight rows permuted "
                             f"from channel-major to NHWC order ({height}x{width}x{channels})")
            pending = None
        layers.append(copy.copy(layer))
    return _rebuild(network, layers), notes


@dataclass(frozen=True)
class Prepared:
    """A network after the graph passes.

    Attributes
    ----------
    network : Network
    sources : dict
        ``{layer name: tuple of the original layer names it computes}``.
    notes : tuple of str
        One line per rewrite, for the report.
    """
    network: Network
    sources: dict
    notes: tuple


def prepare(network):
    """Fold BatchNorm, fuse ReLU and make flattens free views, in that order."""
    sources = {layer.name: (layer.name,) for layer in network.layers}
    folded, notes_fold = fold_batchnorm(network, sources)
    fused, notes_fuse = fuse_activations(folded, sources)
    viewed, notes_view = flatten_as_view(fused, sources)
    return Prepared(network=viewed, sources=sources,
                    notes=tuple(notes_fold + notes_fuse + notes_view))
