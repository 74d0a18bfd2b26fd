"""Running a graph: each NPU group as programs on a backend, each host step by the front
end's host.

:func:`run_graph` walks the steps of :func:`sw.ir.grouping.schedule`. An NPU group runs as
one program per ``batch`` samples (built by ``build``, by default
:func:`sw.nn.program.build_fused_program`: the group's layers back to back in one DRAM
image), all of a group's programs in one backend run; a host step is handed to ``host``,
the front end's own: the INT8 reference for the project's networks, onnxruntime for ONNX
models.
"""

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from hw.config import NPUConfig
from .. import backend
from ..errors import NPURunError, NPUTypeError, NPUValueError
from .grouping import HostStep, schedule
from .placement import place


__all__ = ["GroupRun", "GraphRun", "run_graph", "group_input", "group_output", "to_int8",
           "from_int8", "predict_image"]


def to_int8(q):
    """An 8-bit tensor as the NPU's int8 (uint8 is shifted by -128)."""
    q = np.asarray(q)
    if q.dtype == np.uint8:
        return (q.astype(np.int16) - 128).astype(np.int8)
    return q.astype(np.int8)


def from_int8(q, dtype):
    """The inverse of :func:`to_int8` for ``dtype``."""
    if np.dtype(dtype) == np.uint8:
        return (np.asarray(q).astype(np.int16) + 128).astype(np.uint8)
    return np.asarray(q).astype(np.int8)


@dataclass
class GroupRun:
    """One NPU group's programs in a run: the images built and the backend's results."""
    group: object
    images: list
    results: list
    simulated: int            # programs the backend ran (the others came from the cache)
    read_seconds: float = 0.0
    timings: list = None      # per image, sw.timing.Timing with a mark per operator (model)


@dataclass
class GraphRun:
    """What :func:`run_graph` returns."""
    outputs: dict                        # {graph output: array}, in the graph's order
    values: dict                         # every tensor the run computed
    placements: list
    steps: list                          # NpuGroup and HostStep, in order
    group_runs: list = field(default_factory=list)
    npu_macs: int = 0
    cpu_macs: int = 0
    cycle_counts: list = field(default_factory=list)    # per NPU program
    cycles_predicted: bool = False       # cycles and counters from sw.timing (sim="model")
    counters: dict = field(default_factory=dict)        # the performance counters, summed
    programs: int = 0
    simulated: int = 0
    instructions: int = 0
    host_seconds: dict = field(default_factory=dict)    # {step index: seconds}
    seconds: float = 0.0

    @property
    def groups(self):
        return [step for step in self.steps if not isinstance(step, HostStep)]

    @property
    def partitions(self):
        """The host steps."""
        return [step for step in self.steps if isinstance(step, HostStep)]

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


def group_input(graph, group, value):
    """The group's input as the int8 NHWC (or matrix) batch its first program reads."""
    value = to_int8(value)
    if group.ops[0].kind == "conv2d":
        if graph.layout == "NCHW":
            value = value.transpose(0, 2, 3, 1)
        return np.ascontiguousarray(value)
    return value.reshape(len(value), -1)


def group_output(graph, group, value, batch):
    last = group.ops[-1]
    if last.kind == "conv2d":
        value = value.reshape((batch,) + tuple(last.output_shape))
        if graph.layout == "NCHW":
            value = value.transpose(0, 3, 1, 2)
    else:
        value = value.reshape(batch, -1)
    return from_int8(np.ascontiguousarray(value), group.dtype)


def _image_key(config, sim, image):
    digest = hashlib.sha256(image.dram.tobytes())
    digest.update(f"{config.key()}/{sim}/{image.program_addr}/{image.program_len}".encode())
    return digest.hexdigest()


def _run_images(config, sim, images, cache):
    """Run the images in one backend run; an image equal to one in ``cache`` (a dict, or
    None) reuses its result: the same program on the same DRAM gives the same result."""
    keys = [_image_key(config, sim, image) if cache is not None else None for image in images]
    pending = [index for index, key in enumerate(keys) if cache is None or key not in cache]
    fresh = backend.run_programs(config, sim, [images[index].run_args() for index in pending]) \
        if pending else []
    results = [None] * len(images)
    for index, result in zip(pending, fresh):
        results[index] = result
        if cache is not None:
            cache[keys[index]] = result
    for index, key in enumerate(keys):
        if results[index] is None:
            results[index] = cache[key]
    return results, len(pending)


#: Timings by program: a run's batches of equal size share their program word for word
#: (the cycle model needs only the words), so each is predicted once.
_TIMINGS = {}
_TIMINGS_KEPT = 256


def predict_image(config, image):
    """The cycle model's :class:`~sw.timing.Timing` of a program image, with a mark at each
    operator's first instruction."""
    from .. import codec
    from ..timing import predict
    starts = tuple(sorted(first for first, _ in (image.spans or {}).values()))
    key = (config.key(), image.program_addr, starts,
           hashlib.sha256(codec.pack_words(image.words)).hexdigest())
    if key not in _TIMINGS:
        if len(_TIMINGS) >= _TIMINGS_KEPT:
            _TIMINGS.pop(next(iter(_TIMINGS)))
        _TIMINGS[key] = predict(config, image.words, image.program_addr, marks=starts)
    return _TIMINGS[key]


def _run_group(graph, group, value, config, sim, batch, build, cache, predict, run):
    samples = len(value)
    x = group_input(graph, group, value)
    images = [build(config, group.ops, x[start:start + batch])
              for start in range(0, samples, batch)]
    results, simulated = _run_images(config, sim, images, cache)
    started = time.perf_counter()
    pieces = []
    for image, result in zip(images, results):
        if not result.done:
            raise NPURunError(result.error_code, result.error_pc,
                              f"the NPU program of {group.nodes[0].name} stopped with error "
                              f"{result.error_code.name} at instruction {result.error_pc} "
                              f"of {image.program_len} ({sim}, {config.name})")
        pieces.append(image.read(result.dram))
    read_seconds = time.perf_counter() - started
    timings = [predict_image(config, image) for image in images] \
        if sim == "model" and predict else None
    for index, (image, result) in enumerate(zip(images, results)):
        run.programs += 1
        run.instructions += result.instructions
        perf = result.perf
        if timings is not None:
            perf = timings[index].perf
            run.cycles_predicted = True
        run.cycle_counts.append(perf["cycles"] if perf else result.cycles)
        for counter, count in (perf or {}).items():
            run.counters[counter] = run.counters.get(counter, 0) + count
    run.simulated += simulated
    run.group_runs.append(GroupRun(group, images, results, simulated, read_seconds, timings))
    return group_output(graph, group, np.concatenate(pieces), samples)


def _progress(steps, sim, show):
    """The steps, with a progress bar on the terminal when ``show`` (tqdm's, on stderr, off
    when stderr is not a terminal)."""
    import sys
    from tqdm import tqdm
    groups = sum(not isinstance(step, HostStep) for step in steps)
    return tqdm(steps, desc=f"{groups} NPU programs on {sim}", unit="step", leave=False,
                file=sys.stderr, disable=not show or not sys.stderr.isatty())


def run_graph(graph, x, *, config, sim="model", batch=64, host, fuse=True, build=None,
              cache=None, predict=True, placements=None, progress=False):
    """Run ``graph`` on the batch ``x`` (its first input).

    Parameters
    ----------
    graph : sw.ir.graph.Graph
    x : numpy.ndarray
    config : hw.config.NPUConfig
    sim : str
        A backend of :data:`sw.backend.SIMULATORS`, or ``"cpu"``: every operator on the host.
    batch : int
        Samples per NPU program.
    host : callable
        ``host(step, values)`` runs a :class:`~sw.ir.grouping.HostStep`, adding its outputs
        to ``values`` (``{tensor: array}``); ``host.prepare(step)``, if it has one, makes
        what the step needs before its time is measured (``GraphRun.host_seconds``).
    fuse : bool
        Chain NPU operators into one program (else one program per operator).
    build : callable, optional
        ``build(config, ops, x)`` makes one program's image (default
        :func:`sw.nn.program.build_fused_program`).
    cache : dict, optional
        Backend results by DRAM image, shared between runs.
    predict : bool
        On ``sim="model"``, take cycles and counters from the cycle model.
    placements : list, optional
        Of :func:`sw.ir.placement.place` (made here if not given).
    progress : bool
        A progress bar per step on the terminal (never when stderr is not one).

    Returns
    -------
    GraphRun
    """
    from ..nn.program import build_fused_program
    if not isinstance(config, NPUConfig):
        raise NPUTypeError(f"config must be an NPUConfig, not {config!r}")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise NPUValueError(f"batch must be a positive integer, not {batch!r}")
    started = time.perf_counter()
    if placements is None:
        placements = place(graph)
    if sim == "cpu":
        placements = [p.__class__(p.node, p.op_type, "cpu", "sim='cpu': the host runs "
                                  "everything", p.macs, p.sources) for p in placements]
    steps = schedule(graph, placements, fuse=fuse)
    run = GraphRun(outputs={}, values={graph.inputs[0]: x}, placements=placements,
                   steps=steps)
    for p in placements:
        if p.device == "npu":
            run.npu_macs += p.macs
        else:
            run.cpu_macs += p.macs
    build = build or build_fused_program
    values = run.values
    for index, step in enumerate(_progress(steps, sim, progress)):
        if isinstance(step, HostStep):
            if step.outputs:
                if hasattr(host, "prepare"):        # set-up is not the step's time
                    host.prepare(step)
                began = time.perf_counter()
                host(step, values)
                run.host_seconds[index] = time.perf_counter() - began
        else:
            values[step.output] = _run_group(graph, step, values[step.input], config, sim,
                                             batch, build, cache, predict, run)
    run.outputs = {name: values[name] for name in graph.outputs}
    run.seconds = time.perf_counter() - started
    return run
