"""Running a quantized network on the NPU (or its model), in batches, three ways.

``mode`` (the stages of the demo's table, after the seeds' section 5):

* ``"layers_unfused"`` (a): one program per NPU operator, the host copies every output
  back and into the next operator's input buffer, and a ReLU runs as a separate CPU pass
  (the GEMM clamps to -128 .. 127 only);
* ``"layers"`` (b): the same round trips, with Conv + ReLU fused into the requantization
  clamp;
* ``"fused"`` (c): the whole NPU chain as ONE program: the layers hand their activations
  over in DRAM, with no host round trip.

The network goes through the graph core (:mod:`sw.ir`): its graph
(:func:`sw.nn.lower.network_graph`) placed, grouped and run by
:func:`sw.ir.runner.run_graph`, the host operators by the INT8 reference. The CPU operators
before the chain (input quantization) and after it (softmax, argmax) run on the host in every
mode; so does one between two NPU operators, which splits the chain into two programs. Host transfers are counted per batch as a runtime in steady state
would make them: constants (weights, biases, requantization parameters) and the zero-point
borders of buffers that keep them are written once, at set-up, and are not counted.
"""

from dataclasses import dataclass, field

import numpy as np

from ..errors import NPUValueError
from ..ir.grouping import HostStep
from ..ir.placement import place
from ..ir.runner import run_graph
from .lower import network_graph, run_host
from .program import build_fused_program, build_layer_program
from .quantize import NPU_KINDS, unfuse_relu


__all__ = ["MODES", "StageResult", "run_network"]


#: Accepted ``mode`` values of :func:`run_network`.
MODES = ("layers_unfused", "layers", "fused")


@dataclass
class StageResult:
    """What running the test data through the NPU in one mode produced and cost.

    Attributes
    ----------
    mode, lowering, sim : str
    batches : int
    logits : numpy.ndarray
        int8, the last NPU operator's output for every sample.
    outputs : dict
        ``{operator name: output}`` of the CPU operators after the chain (e.g. argmax).
    layer_outputs : dict
        ``{operator name: int8 output}`` of every NPU operator (layer modes only).
    cycles : int or None
        Sum over all programs (``None`` on the model).
    layer_cycles : dict
        ``{operator name: cycles}`` summed over batches (layer modes only).
    programs : int
        Programs launched.
    simulated : int
        Programs the backend actually ran; the others had a DRAM image byte for byte equal
        to one already run (``cache``), whose result was reused.
    instructions : int
        Instructions executed, over all programs.
    macs : int
        Useful multiply-accumulates of the NPU operators.
    host_transfers : int
        Copies between host memory and NPU DRAM, over all batches.
    host_bytes_written, host_bytes_read : int
    cpu_passes : int
        Separate CPU passes over an activation tensor (the unfused ReLUs).
    host_seconds : float
        Wall-clock time of the host's data handling between programs (reading outputs,
        ReLU, writing inputs), not counting compilation or simulation.
    traffic : dict
        ``{operator name: {"read", "written", "program"}}``: bytes the operator's DMA
        instructions move and bytes of its instructions, over all batches.
    plans : dict
        ``{operator name: sw.compiler.Plan}`` of the first batch.
    buffer_plan : sw.nn.memory.BufferPlan or None
        The activation arena of the first batch's fused program.
    """
    mode: str
    lowering: str
    sim: str
    batches: int
    logits: np.ndarray
    outputs: dict
    layer_outputs: dict
    cycles: "int | None"
    layer_cycles: dict
    programs: int
    simulated: int
    instructions: int
    macs: int
    host_transfers: int = 0
    host_bytes_written: int = 0
    host_bytes_read: int = 0
    cpu_passes: int = 0
    host_seconds: float = 0.0
    traffic: dict = field(default_factory=dict)
    plans: dict = field(default_factory=dict)
    buffer_plan: object = None

    def utilization(self, config):
        """``macs / (cycles * R * C)``, or ``None`` without a cycle count."""
        if self.cycles is None:
            return None
        return self.macs / (self.cycles * config.rows * config.cols)


def _add_traffic(total, plans):
    """Add each operator's DMA bytes (from its plan, counted from its emitted words)."""
    for name, plan in plans.items():
        entry = total.setdefault(name, {"read": 0, "written": 0, "program": 0})
        entry["read"] += plan.dram_bytes_read
        entry["written"] += plan.dram_bytes_written
        entry["program"] += plan.program_bytes - 16    # the END each layer's body drops


def run_network(qnet, x, *, config, sim="model", batch=64, mode="fused", lowering="taps",
                cache=None):
    """Run the float batch ``x`` through ``qnet`` with its NPU chain on ``sim``.

    Parameters
    ----------
    qnet : sw.nn.quantize.QuantizedNetwork
    x : numpy.ndarray
        Float NHWC inputs (any number; they are cut into batches of ``batch``).
    config : hw.config.NPUConfig
    sim : str
        A backend of :data:`sw.backend.SIMULATORS`.
    batch : int
        Samples per program.
    mode : str
        One of :data:`MODES`.
    lowering : str
        Convolution lowering, one of :data:`sw.nn.program.LOWERINGS`.
    cache : dict, optional
        Results by DRAM image, shared between calls: a program whose whole initial DRAM
        (instructions, constants, inputs) equals one run before is not run again.

    Returns
    -------
    StageResult
    """
    if mode not in MODES:
        raise NPUValueError(f"mode must be one of {MODES}, not {mode!r}")
    x = np.asarray(x)
    if len(x) == 0:
        raise NPUValueError("x must hold at least one sample")
    # Unfused: every fused ReLU split back out as a host pass after its GEMM.
    network = unfuse_relu(qnet) if mode == "layers_unfused" else qnet
    graph = network_graph(network, len(x))
    placements = place(graph)
    if not any(p.device == "npu" for p in placements):
        raise NPUValueError("no operator of the network is placed on the NPU")

    def build(config, ops, value):
        if mode == "fused":
            return build_fused_program(config, ops, value, lowering=lowering)
        return build_layer_program(config, ops[0], value, lowering=lowering)

    run = run_graph(graph, x, config=config, sim=sim, batch=batch, host=run_host,
                    fuse=mode == "fused", build=build, cache=cache, predict=False,
                    placements=placements)
    return _stage(qnet, network, run, mode, lowering, sim, len(x))


def _stage(qnet, network, run, mode, lowering, sim, samples):
    """The run's figures as a :class:`StageResult`."""
    gemms = [op for op in network.ops if op.kind in NPU_KINDS]
    first_npu = next(index for index, step in enumerate(run.steps)
                     if not isinstance(step, HostStep))
    last_npu = max(index for index, step in enumerate(run.steps)
                   if not isinstance(step, HostStep))
    traffic, plans = {}, {}
    written = read = 0
    layer_cycles = {}
    for group_run in run.group_runs:
        for image, result in zip(group_run.images, group_run.results):
            shared = image.buffer_plan is not None and any(
                "input" in names for names in image.buffer_plan.reused.values())
            buffer = image.buffers["input"]
            # The input buffer's border survives between batches unless another tensor
            # reuses its bytes; then the host writes the whole padded buffer every time.
            written += buffer.bytes if shared else buffer.interior_bytes
            read += image.buffers[image.output].interior_bytes
            _add_traffic(traffic, image.plans)
        for name, plan in group_run.images[0].plans.items():
            plans.setdefault(name, plan)
        if mode != "fused":
            cycles = [result.cycles for result in group_run.results]
            layer_cycles[group_run.group.ops[0].name] = (
                None if any(value is None for value in cycles) else sum(cycles))
    batches = len(run.group_runs[0].images)
    relus = [node for step in run.steps[first_npu:last_npu + 1] if isinstance(step, HostStep)
             for node in step.nodes if node.op_type == "relu"]
    # Host time between programs: reading each output, the host steps inside the chain.
    host_seconds = sum(group_run.read_seconds for group_run in run.group_runs) + sum(
        seconds for index, seconds in run.host_seconds.items()
        if first_npu < index < last_npu)
    layer_outputs = {}
    if mode != "fused":
        names = {op.name for op in network.ops}
        for op in gemms:
            tensor = f"{op.name}.relu" if f"{op.name}.relu" in names else op.name
            layer_outputs[op.name] = run.values[tensor]
    last = run.steps[last_npu]
    after = [node.name for step in run.steps[last_npu + 1:] for node in step.nodes]
    return StageResult(
        mode=mode, lowering=lowering, sim=sim, batches=batches,
        logits=run.values[last.output], outputs={name: run.values[name] for name in after},
        layer_outputs=layer_outputs, cycles=run.cycles, layer_cycles=layer_cycles,
        programs=run.programs, simulated=run.simulated, instructions=run.instructions,
        macs=sum(op.macs(samples) for op in gemms), host_transfers=2 * run.programs,
        host_bytes_written=written, host_bytes_read=read, cpu_passes=len(relus) * batches,
        host_seconds=host_seconds, traffic=traffic, plans=plans,
        buffer_plan=run.group_runs[0].images[0].buffer_plan if mode == "fused" else None)
