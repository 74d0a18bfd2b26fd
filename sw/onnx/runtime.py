"""Running an imported ONNX graph: NPU groups as programs on a backend, the rest on the host.

:func:`run_model` walks the graph in order. The first node of an NPU group
(:func:`sw.onnx.lower.npu_groups`) runs the whole group as ONE program built by
:mod:`sw.nn.program` (weights, biases, requantization scales and the activation arena in one
DRAM image, the group's layers back to back, no host round trip between them), on the
instruction-level model, the RTL under Verilator or Icarus, the simulated SoC or the board.
The host nodes between two groups run as one onnxruntime session (:mod:`sw.onnx.host`).
``sim="cpu"`` runs every node on the host: onnxruntime alone, the reference.
"""

import time
from dataclasses import dataclass, field

import numpy as np

from hw.config import NPUConfig
from ..errors import NPURunError, NPUTypeError, NPUValueError
from .host import HostPartition, host_partitions, probe
from .lower import from_int8, npu_groups, place_graph, to_int8


__all__ = ["RUN_SIMULATORS", "ModelRun", "check_input", "infer_shapes", "run_model"]

#: Where :func:`run_model` can run the NPU groups ("cpu": nowhere, all on the host).
RUN_SIMULATORS = ("model", "verilator", "icarus", "soc", "board", "cpu")


@dataclass
class ModelRun:
    """What :func:`run_model` returns."""
    outputs: dict                        # {output name: array}, in the graph's order
    placements: list                     # NodePlacement per node
    groups: list                         # NpuGroup, in order
    partitions: list = field(default_factory=list)      # HostPartition, in order
    npu_macs: int = 0
    cpu_macs: int = 0
    cycle_counts: list = field(default_factory=list)    # per NPU program
    cycles_predicted: bool = False       # cycles and counters from sw.timing (sim="model")
    counters: dict = field(default_factory=dict)        # the performance counters, summed
    programs: int = 0
    instructions: int = 0
    seconds: float = 0.0

    @property
    def npu_share(self):
        """The fraction of the model's multiply-accumulates the NPU ran (0 without any)."""
        total = self.npu_macs + self.cpu_macs
        return self.npu_macs / total if total else 0.0

    @property
    def cycles(self):
        """NPU cycles of all programs (None when a backend gave none)."""
        if any(count is None for count in self.cycle_counts):
            return None
        return sum(self.cycle_counts)


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
    batch = len(x)
    shapes = {name: tuple(np.shape(value)) for name, value in graph.constants.items()}
    for name, (_, shape) in probe(graph, x[:1]).items():
        shapes[name] = (batch,) + tuple(shape)[1:] if shape else tuple(shape)
    return shapes


def _group_input(group, value):
    """The group's input as the int8 NHWC (or matrix) batch its first program reads."""
    first = group.ops[0]
    value = to_int8(value)
    if first.kind == "conv2d":
        return np.ascontiguousarray(value.transpose(0, 2, 3, 1))
    return value.reshape(len(value), -1)


def _group_output(group, value, batch):
    last = group.ops[-1]
    if last.kind == "conv2d":
        height, width, channels = last.output_shape
        value = value.reshape(batch, height, width, channels).transpose(0, 3, 1, 2)
    else:
        value = value.reshape(batch, -1)
    return from_int8(np.ascontiguousarray(value), group.output_dtype)


def _predicted(config, image):
    """The cycle model's counters of a program (the instruction-level model counts no
    cycles), or None for a program with instructions it does not cover (LOAD_ACC,
    LOAD_QUANT, STORE_Q: quantized layers)."""
    from ..timing import predict
    try:
        return predict(config, image.words, image.program_addr).perf
    except NPUValueError:
        return None


def _run_group(group, value, config, sim, batch, run):
    from .. import backend
    from ..nn.program import build_fused_program
    samples = len(value)
    x = _group_input(group, value)
    images = [build_fused_program(config, group.ops, x[start:start + batch])
              for start in range(0, samples, batch)]
    results = backend.run_programs(config, sim, [image.run_args() for image in images])
    pieces = []
    for image, result in zip(images, results):
        if not result.done:
            raise NPURunError(result.error_code, result.error_pc,
                              f"the NPU program of {group.nodes[0].name} stopped with error "
                              f"{result.error_code.name} at instruction {result.error_pc} "
                              f"({sim}, {config.name})")
        pieces.append(image.read(result.dram))
        run.programs += 1
        run.instructions += result.instructions
        perf = result.perf
        if sim == "model":
            perf = _predicted(config, image)
            run.cycles_predicted = perf is not None
        run.cycle_counts.append(perf["cycles"] if perf else result.cycles)
        for counter, count in (perf or {}).items():
            run.counters[counter] = run.counters.get(counter, 0) + count
    return _group_output(group, np.concatenate(pieces), samples)


def _steps(graph, groups, inside):
    """The run's order: NPU groups (at their first node) and the host partitions between
    them."""
    steps, host = [], []
    for node in graph.nodes:
        if node.name in groups:
            if host:
                steps.append(HostPartition(host))
                host = []
            steps.append(groups[node.name])
        elif node.name not in inside:
            host.append(node)
    if host:
        steps.append(HostPartition(host))
    return host_partitions(graph, steps)


def run_model(graph, x, *, config, sim="model", batch=64):
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

    Returns
    -------
    ModelRun
    """
    if not isinstance(config, NPUConfig):
        raise NPUTypeError(f"config must be an NPUConfig, not {config!r}")
    if sim not in RUN_SIMULATORS:
        raise NPUValueError(f"sim must be one of {RUN_SIMULATORS}, not {sim!r}")
    if len(graph.inputs) != 1:
        raise NPUValueError(f"the model takes {len(graph.inputs)} inputs; the runtime feeds "
                            f"one")
    check_input(graph, x)
    started = time.perf_counter()
    types = probe(graph, x[:1])
    shapes = {name: tuple(np.shape(value)) for name, value in graph.constants.items()}
    shapes.update({name: (len(x),) + tuple(shape)[1:] if shape else tuple(shape)
                   for name, (_, shape) in types.items()})
    placements = place_graph(graph, shapes)
    if sim == "cpu":
        placements = [p.__class__(p.node, p.op_type, "cpu", "sim='cpu': onnxruntime runs "
                                  "everything", p.macs) for p in placements]
    groups, inside = npu_groups(graph, placements, shapes)
    steps = _steps(graph, groups, inside)
    ranks = {name: (dtype, len(shape)) for name, (dtype, shape) in types.items()}
    run = ModelRun(outputs={}, placements=placements, groups=list(groups.values()),
                   partitions=[s for s in steps if isinstance(s, HostPartition)])
    for p in placements:
        if p.device == "npu":
            run.npu_macs += p.macs
        else:
            run.cpu_macs += p.macs
    values = {graph.inputs[0][0]: x}
    for step in steps:
        if isinstance(step, HostPartition):
            if step.outputs:
                step.build(graph, ranks)
                step.run(values)
        else:
            values[step.output] = _run_group(step, values[step.input], config, sim, batch, run)
    run.outputs = {name: values[name] if name in values else np.asarray(graph.constants[name])
                   for name, _, _ in graph.outputs}
    run.seconds = time.perf_counter() - started
    return run
