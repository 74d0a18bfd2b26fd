"""Running an imported ONNX graph: NPU groups as programs on a backend, the rest on
onnxruntime.

:func:`run_model` turns the graph into the graph core's (:func:`sw.onnx.lower.to_graph`) and
runs it with :func:`sw.ir.runner.run_graph`: each NPU group as ONE program built by
:mod:`sw.nn.program` (weights, biases, requantization scales and the activation arena in one
DRAM image, the group's layers back to back, no host round trip between them), on the
instruction-level model, the RTL under Verilator or Icarus, the simulated SoC or the board;
the host nodes between two groups as one onnxruntime session (:mod:`sw.onnx.host`).
``sim="cpu"`` runs every node on the host: onnxruntime alone, the reference.
"""

import numpy as np

from ..errors import NPUTypeError, NPUValueError
from ..ir.runner import run_graph
from .host import OnnxHost, probe
from .lower import to_graph


__all__ = ["RUN_SIMULATORS", "check_input", "infer_shapes", "run_model"]

#: Where :func:`run_model` can run the NPU groups ("cpu": nowhere, all on the host).
RUN_SIMULATORS = ("model", "verilator", "icarus", "soc", "board", "cpu")


def check_input(graph, x):
    """``x`` against the graph's first input: dtype and every fixed dimension; a one-line
    error otherwise."""
    name, dtype, shape = graph.inputs[0]
    if not isinstance(x, np.ndarray):
        raise NPUTypeError(f"the input must be a numpy array, not {type(x).__name__}")
    if dtype is not None and x.dtype != dtype:
        raise NPUTypeError(f"input {name!r} takes {dtype}, not {x.dtype}")
    if x.ndim != len(shape) or any(isinstance(d, int) and d > 0 and d != s
                                   for d, s in zip(shape, x.shape)):
        shown = "x".join(str(d) if isinstance(d, int) and d > 0 else str(d or "?")
                         for d in shape)
        raise NPUValueError(f"input {name!r} has shape {shown}, not "
                            f"{'x'.join(map(str, x.shape))}")
    if x.shape and x.shape[0] == 0:
        raise NPUValueError(f"input {name!r} holds no sample")


def infer_shapes(graph, x):
    """``{tensor: shape}`` of every tensor, from an onnxruntime run of the first sample (any
    batch size follows: a computed tensor's first dimension is the batch's)."""
    return _shapes(graph, probe(graph, x[:1]), len(x))


def _shapes(graph, types, batch):
    shapes = {name: tuple(np.shape(value)) for name, value in graph.constants.items()}
    shapes.update({name: (batch,) + tuple(shape)[1:] if shape else tuple(shape)
                   for name, (_, shape) in types.items()})
    return shapes


def run_model(graph, x, *, config, sim="model", batch=64, progress=False, fuse=True):
    """Run ``graph`` on the input batch ``x``.

    Parameters
    ----------
    graph : sw.onnx.graph.Graph
    x : numpy.ndarray
        The model's first input, in its dtype; the batch dimension may be any size.
    config : hw.config.NPUConfig
    sim : str
        One of :data:`RUN_SIMULATORS`.
    batch : int
        Samples per NPU program.
    progress : bool
        A progress bar on the terminal while it runs.
    fuse : bool
        Chain the NPU nodes into one program per group (else one program per node, the host
        copying every output back and in again).

    Returns
    -------
    sw.ir.runner.GraphRun
    """
    if sim not in RUN_SIMULATORS:
        raise NPUValueError(f"sim must be one of {RUN_SIMULATORS}, not {sim!r}")
    if len(graph.inputs) != 1:
        raise NPUValueError(f"the model takes {len(graph.inputs)} inputs; the runtime feeds "
                            f"one")
    check_input(graph, x)
    types = probe(graph, x[:1])
    core = to_graph(graph, _shapes(graph, types, len(x)))
    return run_graph(core, x, config=config, sim=sim, batch=batch,
                     host=OnnxHost(graph, types), progress=progress, fuse=fuse)
