"""Running a quantized network on the NPU (or its model), in batches, three ways.

``mode`` (the stages of the demo's table, after the seeds' section 5):

* ``"layers_unfused"`` (a): one program per NPU operator, the host copies every output
  back and into the next operator's input buffer, and a ReLU runs as a separate CPU pass
  (the GEMM clamps to -128 .. 127 only);
* ``"layers"`` (b): the same round trips, with Conv + ReLU fused into the requantization
  clamp;
* ``"fused"`` (c): the whole NPU chain as ONE program: the layers hand their activations
  over in DRAM, with no host round trip.

The CPU operators before the chain (input quantization) and after it (softmax, argmax) run
on the host in every mode. Host transfers are counted per batch as a runtime in steady state
would make them: constants (weights, biases, requantization parameters) and the zero-point
borders of buffers that keep them are written once, at set-up, and are not counted.
"""

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from .. import backend
from ..errors import NPURunError, NPUValueError
from .placement import place
from .program import build_fused_program, build_layer_program, npu_chain
from .reference import run_op


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


def _image_key(config, sim, image):
    digest = hashlib.sha256(image.dram.tobytes())
    digest.update(f"{config.key()}/{sim}/{image.program_addr}/{image.program_len}".encode())
    return digest.hexdigest()


def _run(config, sim, images, cache):
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
    for image, result in zip(images, results):
        if not result.done:
            raise NPURunError(result.error_code, result.error_pc,
                              f"the NPU program stopped with error {result.error_code.name} "
                              f"at instruction {result.error_pc} of {image.program_len} "
                              f"({sim}, {config.name})")
    return results, len(pending)


def _add_traffic(total, plans):
    """Add each operator's DMA bytes (from its plan, counted from its emitted words)."""
    for name, plan in plans.items():
        entry = total.setdefault(name, {"read": 0, "written": 0, "program": 0})
        entry["read"] += plan.dram_bytes_read
        entry["written"] += plan.dram_bytes_written
        entry["program"] += plan.program_bytes - 16    # the END each layer's body drops


def _sum_cycles(results):
    cycles = [result.cycles for result in results]
    return None if any(value is None for value in cycles) else sum(cycles)


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
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise NPUValueError(f"batch must be a positive integer, not {batch!r}")
    chain = npu_chain(qnet, place(qnet, config))
    x = np.asarray(x)
    if len(x) == 0:
        raise NPUValueError("x must hold at least one sample")
    starts = range(0, len(x), batch)

    # The CPU prologue (input quantization) on the host.
    inputs = []
    for start in starts:
        value = x[start:start + batch]
        for op in chain.before:
            value = run_op(op, value)
        inputs.append(value)

    stage = dict(mode=mode, lowering=lowering, sim=sim, batches=len(inputs),
                 macs=sum(op.macs(len(x)) for op in chain.ops))
    traffic = {}
    if mode == "fused":
        images = [build_fused_program(config, chain.ops, value, lowering=lowering)
                  for value in inputs]
        results, simulated = _run(config, sim, images, cache)
        started = time.perf_counter()
        logits = [image.read(result.dram) for image, result in zip(images, results)]
        host_seconds = time.perf_counter() - started
        first = images[0]
        input_shared = any("input" in names for names in first.buffer_plan.reused.values())
        written = read = 0
        for image in images:
            buffer = image.buffers["input"]
            # The input buffer's border survives between batches unless another tensor
            # reuses its bytes; then the host writes the whole padded buffer every time.
            written += buffer.bytes if input_shared else buffer.interior_bytes
            read += image.buffers[image.output].interior_bytes
            _add_traffic(traffic, image.plans)
        stage.update(cycles=_sum_cycles(results), layer_cycles={}, programs=len(images),
                     simulated=simulated,
                     instructions=sum(result.instructions for result in results),
                     host_transfers=2 * len(images), host_bytes_written=written,
                     host_bytes_read=read, host_seconds=host_seconds, layer_outputs={},
                     plans=first.plans, buffer_plan=first.buffer_plan)
    else:
        current = inputs
        layer_outputs, layer_cycles, plans = {}, {}, {}
        programs = simulated = instructions = transfers = written = read = passes = 0
        host_seconds = 0.0
        all_results = []
        for op in chain.ops:
            unfused_relu = mode == "layers_unfused" and op.relu
            images = [build_layer_program(config, op, value, lowering=lowering,
                                          act_min=-128 if unfused_relu else None)
                      for value in current]
            results, ran = _run(config, sim, images, cache)
            simulated += ran
            all_results.extend(results)
            started = time.perf_counter()
            outputs = []
            for image, result in zip(images, results):
                value = image.read(result.dram)
                if unfused_relu:
                    value = np.maximum(value, np.int8(op.output.zero_point))  # the CPU pass
                    passes += 1
                outputs.append(value)
            host_seconds += time.perf_counter() - started
            for image in images:
                # Each program: the host writes the input's interior (its border stays) and
                # reads the output back.
                written += image.buffers["input"].interior_bytes
                read += image.buffers[op.name].interior_bytes
                transfers += 2
                _add_traffic(traffic, image.plans)
            layer_cycles[op.name] = _sum_cycles(results)
            layer_outputs[op.name] = np.concatenate(outputs).reshape(
                (len(x),) + tuple(op.output_shape))
            plans[op.name] = images[0].plans[op.name]
            programs += len(images)
            instructions += sum(result.instructions for result in results)
            current = outputs
        logits = current
        stage.update(cycles=_sum_cycles(all_results), layer_cycles=layer_cycles,
                     programs=programs, simulated=simulated, instructions=instructions,
                     host_transfers=transfers,
                     host_bytes_written=written, host_bytes_read=read, cpu_passes=passes,
                     host_seconds=host_seconds, layer_outputs=layer_outputs, plans=plans)

    last = chain.ops[-1]
    logits = np.concatenate(logits).reshape((len(x),) + tuple(last.output_shape))
    # The CPU epilogue (softmax, argmax) on the host.
    outputs, value = {}, logits
    for op in chain.after:
        value = run_op(op, value)
        outputs[op.name] = value
    return StageResult(logits=logits, outputs=outputs, traffic=traffic, **stage)
