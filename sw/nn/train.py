"""Training in float with numpy only: the digits data set and the seeds' small CNN.

The network (seeds, section 5: Conv -> ReLU -> Conv -> BatchNorm -> ReLU -> GEMM)::

    input 8x8x1 -> conv1 3x3, 1->8, pad 1 (+bias) -> relu1
                -> conv2 3x3, 8->16, stride 2, pad 1 (no bias: bn2 follows) -> bn2 -> relu2
                -> flatten (channel-major, as PyTorch numbers the features) -> dense 256->10
                -> softmax -> argmax

Forward and backward passes are written out here with im2col; the optimizer is Adam. Every
random choice comes from one ``numpy.random.Generator`` seeded by the caller, and numpy's
float32 arithmetic is deterministic on one machine, so a seed gives the same network.
"""

import time
from dataclasses import dataclass

import numpy as np

from ..errors import NPUValueError
from .graph import (Argmax, BatchNorm, Conv2D, Dense, Flatten, Network, ReLU, Softmax,
                    im2col)


__all__ = ["DigitsData", "TrainLog", "load_digits_split", "digits_network", "train",
           "train_digits", "accuracy", "DIGITS_SPLIT_SEED", "DIGITS_TEST_SIZE"]


#: ``random_state`` of the fixed train/test split.
DIGITS_SPLIT_SEED = 0
#: Fraction of the 1797 images held out for testing (450 images).
DIGITS_TEST_SIZE = 0.25


@dataclass(frozen=True)
class DigitsData:
    """scikit-learn's 8x8 digits, NHWC float32 in [0, 1] (pixel value / 16)."""
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits_split(test_size=DIGITS_TEST_SIZE, random_state=DIGITS_SPLIT_SEED):
    """The digits data set (shipped with scikit-learn, no download), split with a fixed,
    stratified ``train_test_split``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., np.newaxis]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target.astype(np.int64), test_size=test_size,
        random_state=random_state, stratify=digits.target)
    return DigitsData(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def digits_network(rng, channels=(8, 16)):
    """The seeds' network for 8x8x1 inputs, He-initialized from ``rng``."""
    c1, c2 = channels

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    features = 4 * 4 * c2
    return Network(input_shape=(8, 8, 1), layers=[
        Conv2D("conv1", he((3, 3, 1, c1), 9), np.zeros(c1, np.float32), stride=1, padding=1),
        ReLU("relu1"),
        Conv2D("conv2", he((3, 3, c1, c2), 9 * c1), None, stride=2, padding=1),
        BatchNorm("bn2", np.ones(c2, np.float32), np.zeros(c2, np.float32),
                  np.zeros(c2, np.float32), np.ones(c2, np.float32)),
        ReLU("relu2"),
        Flatten("flatten", order="CHW"),
        Dense("dense", (rng.standard_normal((features, 10)) / np.sqrt(features))
              .astype(np.float32), np.zeros(10, np.float32)),
        Softmax("softmax"),
        Argmax("argmax"),
    ])


# Training-mode forward and backward of each layer type. ``cache`` keeps what backward needs.

def _conv_forward(layer, x):
    kernel_h, kernel_w = layer.kernel
    columns = im2col(x, kernel_h, kernel_w, layer.stride, layer.padding)
    y = columns @ layer.weight.reshape(-1, layer.out_channels)
    if layer.bias is not None:
        y = y + layer.bias
    return y, (x.shape, columns)


def _conv_backward(layer, grad, cache, need_input_grad):
    x_shape, columns = cache
    kernel_h, kernel_w = layer.kernel
    grads = {"weight": (columns.reshape(-1, columns.shape[-1]).T
                        @ grad.reshape(-1, layer.out_channels)).reshape(layer.weight.shape)}
    if layer.bias is not None:
        grads["bias"] = grad.sum(axis=(0, 1, 2))
    if not need_input_grad:
        return None, grads
    batch, height, width, channels = x_shape
    out_h, out_w = grad.shape[1:3]
    grad_columns = (grad @ layer.weight.reshape(-1, layer.out_channels).T).reshape(
        batch, out_h, out_w, kernel_h, kernel_w, channels)
    pad, stride = layer.padding, layer.stride
    grad_padded = np.zeros((batch, height + 2 * pad, width + 2 * pad, channels), grad.dtype)
    for i in range(kernel_h):            # col2im: each tap adds back into its strided window
        for j in range(kernel_w):
            grad_padded[:, i:i + stride * out_h:stride, j:j + stride * out_w:stride] += \
                grad_columns[:, :, :, i, j]
    return grad_padded[:, pad:pad + height, pad:pad + width], grads


def _batchnorm_forward(layer, x, momentum=0.1):
    mean = x.mean(axis=(0, 1, 2))
    var = x.var(axis=(0, 1, 2))
    inv_std = 1.0 / np.sqrt(var + layer.eps)
    normalized = (x - mean) * inv_std
    count = x.size // x.shape[-1]
    layer.mean[...] = (1 - momentum) * layer.mean + momentum * mean
    layer.var[...] = (1 - momentum) * layer.var + momentum * var * count / max(count - 1, 1)
    return layer.gamma * normalized + layer.beta, (normalized, inv_std)


def _batchnorm_backward(layer, grad, cache):
    normalized, inv_std = cache
    count = grad.size // grad.shape[-1]
    grads = {"gamma": (grad * normalized).sum(axis=(0, 1, 2)), "beta": grad.sum(axis=(0, 1, 2))}
    grad_normalized = grad * layer.gamma
    grad_x = inv_std / count * (count * grad_normalized
                                - grad_normalized.sum(axis=(0, 1, 2))
                                - normalized * (grad_normalized * normalized).sum(axis=(0, 1, 2)))
    return grad_x, grads


def _training_layers(network):
    """The layers trained end to end: everything up to and including the last Dense."""
    last_dense = max(index for index, layer in enumerate(network.layers)
                     if isinstance(layer, Dense))
    return network.layers[:last_dense + 1]


def _forward_backward(layers, x, labels):
    """One training step's loss and gradients ``{(layer name, parameter): gradient}``."""
    caches = []
    for layer in layers:
        if isinstance(layer, Conv2D):
            x, cache = _conv_forward(layer, x)
        elif isinstance(layer, BatchNorm):
            x, cache = _batchnorm_forward(layer, x)
        elif isinstance(layer, ReLU):
            cache = x > 0
            x = x * cache
        elif isinstance(layer, Flatten):
            cache = x.shape
            x = layer.forward(x)
        elif isinstance(layer, Dense):
            cache = x
            x = x @ layer.weight + layer.bias
        else:
            raise NPUValueError(f"training does not support {type(layer).__name__} "
                                f"({layer.name})")
        caches.append(cache)

    # Softmax cross-entropy on the logits.
    shifted = x - x.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    batch = x.shape[0]
    loss = -log_probs[np.arange(batch), labels].mean()
    grad = np.exp(log_probs)
    grad[np.arange(batch), labels] -= 1
    grad /= batch

    grads = {}
    for index in range(len(layers) - 1, -1, -1):
        layer, cache = layers[index], caches[index]
        if isinstance(layer, Conv2D):
            grad, layer_grads = _conv_backward(layer, grad, cache, need_input_grad=index > 0)
        elif isinstance(layer, BatchNorm):
            grad, layer_grads = _batchnorm_backward(layer, grad, cache)
        elif isinstance(layer, ReLU):
            grad, layer_grads = grad * cache, {}
        elif isinstance(layer, Flatten):
            if layer.order == "CHW":
                batch_, height, width, channels = cache
                grad = grad.reshape(batch_, channels, height, width).transpose(0, 2, 3, 1)
            else:
                grad = grad.reshape(cache)
            layer_grads = {}
        else:   # Dense
            layer_grads = {"weight": cache.T @ grad, "bias": grad.sum(axis=0)}
            grad = grad @ layer.weight.T
        for parameter, value in layer_grads.items():
            grads[(layer.name, parameter)] = value
    return float(loss), grads


@dataclass(frozen=True)
class TrainLog:
    """What training did: the loss after each epoch and the wall-clock time."""
    seed: int
    epochs: int
    batch_size: int
    learning_rate: float
    losses: tuple
    seconds: float


def train(network, x, labels, *, seed, epochs=30, batch_size=32, learning_rate=3e-3):
    """Train ``network`` in place with Adam on softmax cross-entropy.

    Parameters
    ----------
    network : Network
        Updated in place (weights, biases, BatchNorm parameters and running statistics).
    x : numpy.ndarray
        float32, NHWC.
    labels : numpy.ndarray
        Integer classes.
    seed : int
        Seeds the shuffling.

    Returns
    -------
    TrainLog
    """
    if x.dtype != np.float32:
        raise NPUValueError(f"x must be float32, not {x.dtype}")
    layers = _training_layers(network)
    parameters = {}
    for layer in layers:
        for attribute in ("weight", "bias", "gamma", "beta"):
            value = getattr(layer, attribute, None)
            if value is not None:
                parameters[(layer.name, attribute)] = value
    first = {key: np.zeros_like(value) for key, value in parameters.items()}
    second = {key: np.zeros_like(value) for key, value in parameters.items()}
    beta1, beta2, epsilon = 0.9, 0.999, 1e-8

    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    losses = []
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        epoch_loss = 0.0
        for batch_start in range(0, len(x), batch_size):
            indices = order[batch_start:batch_start + batch_size]
            loss, grads = _forward_backward(layers, x[indices], labels[indices])
            epoch_loss += loss * len(indices)
            step += 1
            correction1 = 1 - beta1 ** step
            correction2 = 1 - beta2 ** step
            for key, value in parameters.items():
                grad = grads[key]
                first[key] = beta1 * first[key] + (1 - beta1) * grad
                second[key] = beta2 * second[key] + (1 - beta2) * grad * grad
                value -= (learning_rate * (first[key] / correction1)
                          / (np.sqrt(second[key] / correction2) + epsilon)).astype(value.dtype)
        losses.append(epoch_loss / len(x))
    return TrainLog(seed=seed, epochs=epochs, batch_size=batch_size,
                    learning_rate=learning_rate, losses=tuple(losses),
                    seconds=time.perf_counter() - start)


def accuracy(predictions, labels):
    """Fraction of ``predictions`` equal to ``labels``."""
    predictions = np.asarray(predictions)
    return float(np.mean(predictions == labels))


def train_digits(seed=0, **train_options):
    """Load the split, build the seeds' network from ``seed`` and train it.

    Returns
    -------
    (Network, DigitsData, TrainLog)
    """
    data = load_digits_split()
    rng = np.random.default_rng(seed)
    network = digits_network(rng)
    log = train(network, data.x_train, data.y_train, seed=seed, **train_options)
    return network, data, log
