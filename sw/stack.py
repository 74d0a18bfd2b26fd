"""The seeds' optimization stack on real networks: one graph, executed step by step.

The seeds' lesson ends on a table (section 5, "Everything At Once"): a small CNN, first FP32
on the CPU, then INT8, operator fusion, memory planning, an optimized GEMM, NPU offload and
the CPU/NPU crossings removed, 100 ms down to 7 ms, each step changing only how the same
graph is executed. :func:`run_stack` runs those steps on one model here:

====  ================================  ===========================================================
step  seeds' stage                      how it runs here
====  ================================  ===========================================================
1     0 baseline: FP32                  the float model on onnxruntime, ``ORT_DISABLE_ALL``, arena
                                        and memory pattern off
2     1 INT8 quantization               the QDQ model, the same options: DequantizeLinear -> float
                                        op -> QuantizeLinear
3     2 operator fusion                 ``ORT_ENABLE_EXTENDED``: QDQ groups fused into QLinearConv,
                                        QGemm, QLinearAdd, ... (integer kernels)
4     3 memory planning                 + onnxruntime's CPU memory arena and memory pattern
5     4 optimized GEMM                  ``ORT_ENABLE_ALL``: the layout its kernels prefer (MLAS's
                                        blocked, vectorized GEMM serves every step from step 1)
6     5 NPU offload                     ``run_model(fuse=False)``: one NPU program per layer, every
                                        activation back to the host and in again
7     6 CPU/NPU crossings removed       ``run_model(fuse=True)``: NPU layers that feed each other
                                        chained into one program
====  ================================  ===========================================================

Host steps are measured here: single-threaded onnxruntime sessions (``intra_op_num_threads``
and ``inter_op_num_threads`` 1, so that figures are reproducible on a shared machine), the
median of ``repeat`` runs after ``warmup`` runs, every session run in turn in each round so
that a change in the machine's load falls on all of them alike. NPU steps are modelled:
each program's exact cycles (the cycle model, :mod:`sw.timing`, equal to the RTL's; or the
RTL's own count on ``sim="verilator"``) at the clock the config reaches on ECP5
(:data:`sw.profile.ECP5_FMAX_MHZ`), plus the activations each program's host moves in and
out over a link of :func:`link_bytes_per_second`, plus the host partitions between the
programs and the host's layout conversions around them, both measured here as the host
steps are.
"""

import contextlib
import gc
import json
import os
import platform
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hw.config import NPUConfig
from .errors import NPUValueError, first_line
from .profile import ECP5_FMAX_MHZ, FMAX_SOURCE, measured_clock_mhz
from .onnx.zoo import quiet


__all__ = ["SEEDS_STACK", "SEEDS_SOURCE", "STEPS", "NOISE",
           "DEFAULT_REPEAT", "DEFAULT_WARMUP", "BUILTIN_MODELS", "StepDefinition", "StackModel",
           "Timing", "StackResult", "builtin_names",
           "link_bytes_per_second", "builtin_model", "file_model", "run_stack", "machine",
           "report", "model_markdown", "markdown", "add_parser", "run"]



#: The seeds' table: (stage, optimization, where the lesson covered it, latency in ms).
SEEDS_STACK = (
    (0, "Baseline: FP32, CPU, dynamic allocation, DRAM intermediates, no fusion, generic "
        "kernels", "—", 100),
    (1, "INT8 quantization", "Lesson 3 — affine/symmetric quantization", 70),
    (2, "Operator fusion (`Conv + ReLU` → one kernel)", "Lesson 2 — graph-level optimization",
     60),
    (3, "Memory planning (activation buffer reuse)", "Lesson 5, Part 1 — memory planning", 55),
    (4, "Optimized, vectorized GEMM", "Lesson 4 — kernel engineering", 35),
    (5, "NPU offload", "Lesson 10, Parts 1 and 3 — this lesson", 10),
    (6, "Eliminated CPU/NPU transfers", "Lesson 5, Part 2 — runtime scheduling", 7),
)
SEEDS_SOURCE = ("the seeds' lesson, section 5 'Everything At Once: The Full Optimization "
                "Pipeline, Stacked' (a small CNN: Conv -> ReLU -> Conv -> BatchNorm -> ReLU "
                "-> GEMM)")


@dataclass(frozen=True)
class StepDefinition:
    """One step of the stack: its number, its key in the reports, the seeds' stage it
    stands for, its title and what it runs."""
    number: int
    key: str
    seeds_stage: int
    title: str
    definition: str


#: The steps, in order (each changes one thing from the one before).
STEPS = (
    StepDefinition(1, "fp32", 0, "FP32 on the host",
                   "the float model on onnxruntime with ORT_DISABLE_ALL (no graph "
                   "optimization, no fusion) and the CPU memory arena and memory pattern off "
                   "(a malloc and a free per tensor)"),
    StepDefinition(2, "int8", 1, "INT8 on the host",
                   "the QDQ model (onnxruntime's quantize_static) with the same options: "
                   "every DequantizeLinear -> float operator -> QuantizeLinear runs as "
                   "written"),
    StepDefinition(3, "fusion", 2, "with fusion",
                   "ORT_ENABLE_EXTENDED: onnxruntime fuses each QDQ group into one integer "
                   "kernel (QLinearConv, QGemm, QLinearAdd, ...)"),
    StepDefinition(4, "memory", 3, "with memory planning",
                   "onnxruntime's CPU memory arena and memory pattern on (one pre-planned "
                   "block for the intermediate tensors)"),
    StepDefinition(5, "layout", 4, "with the kernels' layout",
                   "ORT_ENABLE_ALL: onnxruntime's layout transformers (NHWC for its integer "
                   "convolutions, NCHWc for float ones); onnxruntime's defaults but one thread"),
    StepDefinition(6, "npu", 5, "offloaded to the NPU",
                   "run_model(fuse=False): one NPU program per NPU layer, each layer's input "
                   "sent from the host and its output read back; the host partitions on "
                   "onnxruntime with step 5's options"),
    StepDefinition(7, "npu_fused", 6, "CPU/NPU crossings removed",
                   "run_model(fuse=True): NPU layers that feed each other and nothing else "
                   "chained into one program; only a chain's input and output cross"),
)

#: A step's change against the one before counts as a change only beyond this fraction.
NOISE = 0.05
DEFAULT_REPEAT = 100
DEFAULT_WARMUP = 10

#: Models ``npu stack`` builds itself besides the zoo's networks (:func:`builtin_names`).
BUILTIN_MODELS = ("digits",)

#: Host steps' session options: (graph optimization level, memory planning).
_HOST_OPTIONS = {"fp32": ("ORT_DISABLE_ALL", False), "int8": ("ORT_DISABLE_ALL", False),
                 "fusion": ("ORT_ENABLE_EXTENDED", False),
                 "memory": ("ORT_ENABLE_EXTENDED", True), "layout": ("ORT_ENABLE_ALL", True),
                 "fp32_defaults": ("ORT_ENABLE_ALL", True)}
#: The options of the host partitions in the NPU steps (the best host step's).
_PARTITION_OPTIONS = "layout"


def _zoo():
    from .onnx import zoo
    return zoo


def builtin_names():
    """Every name :func:`builtin_model` takes."""
    return BUILTIN_MODELS + tuple(_zoo().ZOO)


def link_bytes_per_second(config, clock_mhz):
    """The host link's assumed bandwidth: the NPU's AXI data bus (``config.bus_width`` bits)
    moving one beat per NPU clock, as a host on the same interconnect would."""
    return config.bus_width // 8 * clock_mhz * 1e6


def board_link_bytes_per_second():
    """The host link of the ULX3S SoC (docs/board.md): a UART at :data:`sw.board.BAUDRATE`,
    10 bits a byte."""
    from .board import BAUDRATE
    return BAUDRATE / 10


# -- the models --------------------------------------------------------------------------------

@dataclass
class StackModel:
    """One network for :func:`run_stack`: the float model, its quantized form and an
    input."""
    label: str
    description: str
    float_path: str
    quantized_path: str
    x: np.ndarray
    input_source: str
    quantization: str


#: The zoo's networks as their authors name them.
_ZOO_NAMES = {"squeezenet": "SqueezeNet 1.1", "shufflenet": "ShuffleNet", "resnet50": "ResNet-50",
              "inception_v1": "Inception v1 (GoogLeNet)",
              "inception_v2": "Inception v2 (BN-Inception)", "densenet121": "DenseNet-121",
              "vgg19": "VGG-19", "alexnet": "AlexNet", "zfnet512": "ZFNet-512"}

_QUANTIZATION = ("onnxruntime's quantize_static: QDQ, per-channel int8 weights, "
                 "reduce_range, {activation} activations, MinMax calibration on {calibration}")


@contextlib.contextmanager
def builtin_model(name, *, activation="uint8", size=None):
    """The :class:`StackModel` of the digits CNN (``"digits"``: trained by
    :func:`sw.nn.train.train_digits`, seed 0, calibrated on 200 training images, the first
    test image as input) or of a zoo network (:mod:`sw.onnx.zoo` at ``size``, its own by
    default; a seeded sample as input), held in a temporary folder while in use."""
    zoo = _zoo()
    if name == "digits":
        import onnx
        from .nn.train import train_digits
        from .onnx.models import digits_cnn, quantize
        network, data, _ = train_digits(seed=0)
        float_model, _ = digits_cnn(network=network)
        x_train = data.x_train.transpose(0, 3, 1, 2).astype(np.float32)
        x = np.ascontiguousarray(data.x_test[:1].transpose(0, 3, 1, 2).astype(np.float32))
        with tempfile.TemporaryDirectory(prefix="npu-stack-") as folder:
            float_path = os.path.join(folder, "digits_float.onnx")
            onnx.save(float_model, float_path)
            quantized_path = os.path.join(folder, f"digits_qdq_{activation}.onnx")
            with quiet():
                quantize(float_model, quantized_path, x_train[:200], fmt="qdq",
                         activation_type=activation)
            yield StackModel(
                "digits", "the project's digits CNN (Conv 3x3 -> ReLU -> Conv 3x3 -> "
                "BatchNorm -> ReLU -> Flatten -> Dense; BatchNorm folded), 8x8 input, "
                "trained by sw.nn.train (seed 0)", float_path, quantized_path, x,
                "the first of the 450 test images of scikit-learn's digits "
                "(sw.nn.train.load_digits_split)",
                _QUANTIZATION.format(activation=activation,
                                     calibration="200 training images"))
        return
    if name not in zoo.ZOO:
        raise NPUValueError(f"no built-in model {name!r}; built-in: "
                            f"{', '.join(builtin_names())}")
    float_model = zoo.zoo_model(name, fmt="float", size=size)
    quantized = zoo.zoo_model(name, fmt="qdq", activation=activation, size=size)
    x = zoo.sample_inputs(quantized.input_shape, 1)
    resolution = "x".join(map(str, quantized.input_shape[1:]))
    yield StackModel(
        name, f"{_ZOO_NAMES.get(name, name)} from the onnx package's light model zoo "
        f"(sw.onnx.zoo: seeded "
        f"He-scaled weights, BatchNormalization statistics from data), input "
        f"{'x'.join(map(str, quantized.input_shape))} ({resolution} instead of 224x224), "
        f"{float_model.info.get('macs', 0):,} MACs in the float model",
        str(float_model.path), str(quantized.path), x,
        "sw.onnx.zoo.sample_inputs(shape, 1): seeded N(0, 1), seed 0",
        _QUANTIZATION.format(activation=activation,
                             calibration=f"{zoo.CALIBRATION_SAMPLES} seeded samples"))


@contextlib.contextmanager
def file_model(float_path, x, *, quantized_path=None, calibration=None, activation="uint8",
               input_source="--input"):
    """The :class:`StackModel` of the user's float model and either its quantized form or
    calibration samples to quantize it with (QDQ, ``activation`` activations)."""
    from .onnx.models import quantize
    if (quantized_path is None) == (calibration is None):
        raise NPUValueError("give the quantized model (--quantized Q.onnx) or calibration "
                            "samples to quantize the float model with (--calibrate DATA.npy)")
    with tempfile.TemporaryDirectory(prefix="npu-stack-") as folder:
        how = f"the user's {quantized_path}"
        if quantized_path is None:
            quantized_path = os.path.join(folder, "quantized.onnx")
            try:
                with quiet():
                    quantize(os.fspath(float_path), quantized_path, calibration, fmt="qdq",
                             activation_type=activation)
            except NPUValueError as error:
                raise NPUValueError(f"--calibrate: {error}") from None
            except Exception as error:          # onnxruntime's and onnx's own exceptions
                raise NPUValueError(f"{float_path}: onnxruntime's quantize_static failed: "
                                    f"{first_line(error)}") from None
            how = _QUANTIZATION.format(activation=activation,
                                       calibration=f"{len(calibration)} given samples")
        yield StackModel(Path(float_path).stem, f"{float_path}", os.fspath(float_path),
                         os.fspath(quantized_path), x, input_source, how)






# -- measuring ---------------------------------------------------------------------------------

@dataclass
class Timing:
    """Seconds of repeated runs of one thing."""
    samples: np.ndarray

    @property
    def median(self):
        return float(np.median(self.samples))

    @property
    def quartiles(self):
        return [float(np.percentile(self.samples, 25)), float(np.percentile(self.samples, 75))]

    @property
    def minimum(self):
        return float(np.min(self.samples))

    def to_json(self):
        return {"median": self.median, "quartiles": self.quartiles, "min": self.minimum,
                "runs": int(len(self.samples))}


def _measure(runners, *, repeat, warmup):
    """``{key: Timing}`` of each callable of ``runners``: ``warmup`` runs each, then
    ``repeat`` rounds in which each runs once, the order rotated every round (a change in
    the machine's load meets every runner alike); Python's garbage collector off meanwhile."""
    keys = list(runners)
    samples = {key: [] for key in keys}
    collecting = gc.isenabled()
    gc.disable()
    try:
        for key in keys:
            for _ in range(warmup):
                runners[key]()
        for round_index in range(repeat):
            shift = round_index % len(keys) if keys else 0
            for key in keys[shift:] + keys[:shift]:
                started = time.perf_counter()
                runners[key]()
                samples[key].append(time.perf_counter() - started)
    finally:
        if collecting:
            gc.enable()
    return {key: Timing(np.asarray(values)) for key, values in samples.items()}


def _session_options(level, memory, threads):
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, level)
    options.enable_mem_pattern = memory
    options.enable_cpu_mem_arena = memory
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return options


def _session(model, level, memory, threads, what):
    """An onnxruntime session of ``model`` (a path or serialized bytes)."""
    import onnxruntime
    try:
        return onnxruntime.InferenceSession(model, _session_options(level, memory, threads),
                                            providers=["CPUExecutionProvider"])
    except Exception as error:          # onnxruntime's own exception types
        raise NPUValueError(f"onnxruntime cannot load {what}: {first_line(error)}") from None


# -- the stack ---------------------------------------------------------------------------------

@dataclass
class StackResult:
    """What :func:`run_stack` found for one model: :meth:`to_json` is the report."""
    model: StackModel
    config: NPUConfig
    clock_mhz: float
    clock_source: str
    link_bytes_per_second: float
    link_source: str
    steps: list                             # one dict per step, in order (see to_json)
    reference: dict                         # FP32 with onnxruntime's defaults, one thread
    facts: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict, repr=False)    # {step key: {name: array}}
    runs: dict = field(default_factory=dict, repr=False)       # {step key: GraphRun}

    def step(self, key):
        return next(step for step in self.steps if step["key"] == key)

    def to_json(self):
        return {"model": self.model.label, "description": self.model.description,
                "float_model": self.model.float_path,
                "quantized_model": self.model.quantized_path,
                "quantization": self.model.quantization,
                "input": {"shape": list(self.model.x.shape), "dtype": str(self.model.x.dtype),
                          "source": self.model.input_source},
                "config": self.config.name, "bus_width": self.config.bus_width,
                "clock_mhz": self.clock_mhz, "clock_source": self.clock_source,
                "link_bytes_per_second": self.link_bytes_per_second,
                "link_source": self.link_source, "timing": self.timing,
                "facts": self.facts, "steps": self.steps, "reference": self.reference}


def _compare(outputs, reference):
    """``(equal, max_abs_diff)`` of ``outputs`` against ``reference`` (both ``{name:
    array}``) on the reference's names; ``(False, None)`` when there are none."""
    if not reference:
        return False, None
    equal, largest = True, 0.0
    for name, expected in reference.items():
        value, expected = np.asarray(outputs[name]), np.asarray(expected)
        equal &= value.dtype == expected.dtype and value.shape == expected.shape \
            and bool(np.array_equal(value, expected))
        if value.shape != expected.shape:
            largest = float("inf")
        elif value.size:
            largest = max(largest, float(np.max(np.abs(value.astype(np.float64)
                                                       - expected.astype(np.float64)))))
    return bool(equal), largest


def _verdict(ratio):
    """The verdict of a step whose latency is the previous one's divided by ``ratio``."""
    if ratio > 1 + NOISE:
        return "faster"
    if ratio < 1 - NOISE:
        return "slower"
    return "no measurable change"


def _check_settings(repeat, warmup, threads, sim):
    for name, value, least in (("repeat", repeat, 1), ("warmup", warmup, 0),
                               ("threads", threads, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise NPUValueError(f"{name} must be an integer of at least {least}, not "
                                f"{value!r}")
    if sim not in ("model", "verilator", "icarus"):
        raise NPUValueError(f"sim must be model, verilator or icarus, not {sim!r}")


def _clock(config, clock_mhz):
    """``(MHz, where it comes from)``."""
    if clock_mhz is None:
        clock_mhz = measured_clock_mhz(config)
        if clock_mhz is None:
            raise NPUValueError(f"no measured Fmax for config {config.name} with these "
                                f"memories and bus (measured: {', '.join(ECP5_FMAX_MHZ)} with "
                                f"their defaults); give --clock-mhz")
        return clock_mhz, FMAX_SOURCE
    if not clock_mhz > 0:
        raise NPUValueError(f"the clock (--clock-mhz) must be positive, not {clock_mhz:g} "
                            f"MHz")
    return clock_mhz, "given (--clock-mhz)"


def _link(config, clock_mhz, link_bytes):
    """``(bytes per second, where it comes from)``."""
    if link_bytes is None:
        return link_bytes_per_second(config, clock_mhz), (
            f"assumed: the NPU's {config.bus_width}-bit AXI data bus, one beat per NPU clock "
            f"({config.bus_width // 8} bytes x {clock_mhz:g} MHz)")
    if not link_bytes > 0:
        raise NPUValueError(f"the link's bandwidth must be positive, not {link_bytes!r}")
    return link_bytes, "given (--link-mb-s)"


def _identity_model(name, x):
    """A model of one Identity node on an input like ``x``: onnxruntime's fixed cost of a
    run."""
    from onnx import helper
    dtype = helper.np_dtype_to_tensor_dtype(x.dtype)
    dims = [None] + list(x.shape[1:])
    graph = helper.make_graph([helper.make_node("Identity", [name], ["y"])], "identity",
                              [helper.make_tensor_value_info(name, dtype, dims)],
                              [helper.make_tensor_value_info("y", dtype, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def _host_steps(model, input_name, threads):
    """``(outputs, runners)`` of the host steps (and the FP32 reference, and onnxruntime's
    fixed cost of a run): each session's outputs, and a callable running it once."""
    x = model.x
    float_keys = ("fp32", "fp32_defaults")
    outputs, runners = {}, {}
    for key, (level, memory) in _HOST_OPTIONS.items():
        path = model.float_path if key in float_keys else model.quantized_path
        session = _session(os.fspath(path), level, memory, threads, path)
        feed = {session.get_inputs()[0].name: x}
        names = [o.name for o in session.get_outputs()]
        try:
            outputs[key] = dict(zip(names, session.run(None, feed)))
        except Exception as error:      # onnxruntime's own exception types
            raise NPUValueError(f"onnxruntime failed on {path}: {first_line(error)}") \
                from None
        runners[key] = lambda session=session, feed=feed: session.run(None, feed)
    level, memory = _HOST_OPTIONS[_PARTITION_OPTIONS]
    identity = _session(_identity_model(input_name, x), level, memory, threads,
                        "an Identity model")
    runners["run_overhead"] = lambda: identity.run(None, {input_name: x})
    return outputs, runners


def _host_partition_runner(graph, run, types, threads):
    """``(callable, partitions)``: the callable runs every host partition of ``run`` once,
    in order, on the run's own values, each in a session with step 5's options (the
    partitions :mod:`sw.onnx.host` cuts, with its own model builder)."""
    from .onnx.host import partition_model
    level, memory = _HOST_OPTIONS[_PARTITION_OPTIONS]
    calls = []
    for step in run.partitions:
        if not step.outputs:
            continue
        nodes = [op.payload for op in step.nodes]
        model = partition_model(graph, nodes, step.inputs, step.outputs, types)
        session = _session(model.SerializeToString(), level, memory, threads,
                           f"the host nodes {nodes[0].name!r} to {nodes[-1].name!r}")
        feed = {name: run.values[name] for name in step.inputs}
        calls.append((session, list(step.outputs), feed))

    def run_partitions():
        for session, names, feed in calls:
            session.run(names, feed)
    return run_partitions, len(calls)


def _crossings(core, run):
    """``(programs, convert)``: per NPU program of ``run`` the bytes its host sends and reads
    back; and a callable doing the host's conversions around every program once (NCHW to
    NHWC and uint8 to int8 on the way in, back on the way out: :mod:`sw.ir.runner`)."""
    from .ir.runner import group_input, group_output
    programs = []
    for group_run in run.group_runs:
        group = group_run.group
        value = run.values[group.input]
        raw = np.concatenate([image.read(result.dram)
                              for image, result in zip(group_run.images, group_run.results)])
        programs.append({"group": group, "value": value, "raw": raw,
                         "bytes_in": int(group_input(core, group, value).nbytes),
                         "bytes_out": int(raw.nbytes)})

    def convert():
        for program in programs:
            group_input(core, program["group"], program["value"])
            group_output(core, program["group"], program["raw"], len(program["value"]))
    return [{"bytes_in": p["bytes_in"], "bytes_out": p["bytes_out"]} for p in programs], \
        convert


def _chain_ends(core, run):
    """Where the output of each program of a fused run goes: ``Counter`` of phrases."""
    device = {p.node: p.device for p in run.placements}
    kinds = {op.name: op.op_type for op in core.ops}
    ends = Counter()
    for group in run.groups:
        readers = core.consumers(group.output)
        if group.output in core.outputs:
            ends["a graph output"] += 1
        elif len(readers) > 1:
            ends["read by several operators (a branch)"] += 1
        elif readers and device.get(readers[0].name) != "npu":
            ends[f"read by {kinds[readers[0].name]} on the host"] += 1
        else:
            ends["read by an NPU layer that reads another tensor first"] += 1
    return ends


def _npu_steps(graph, x, config, sim, threads, progress):
    """``(core, runs, crossings, runners, shared)`` of the NPU steps: the graph core's
    graph, each run (once on the backend: its cycles do not vary), the bytes of its
    crossings, callables for its host parts (a part the other run has too is timed once:
    ``shared`` maps each run's part to its runner's key)."""
    from .onnx.host import probe
    from .onnx.lower import to_graph
    from .onnx.runtime import infer_shapes, run_model
    types = probe(graph, x[:1])
    core = to_graph(graph, infer_shapes(graph, x))
    runs, crossings, runners, shared, seen = {}, {}, {}, {}, {}
    for key, fuse in (("npu", False), ("npu_fused", True)):
        run = run_model(graph, x, config=config, sim=sim, batch=len(x), fuse=fuse,
                        progress=progress)
        if run.cycles is None:
            raise NPUValueError(f"the {sim} backend gave no cycle count for the NPU programs")
        runs[key] = run
        crossings[key], convert = _crossings(core, run)
        parts = {"partitions": tuple(tuple(step.names) for step in run.partitions
                                     if step.outputs),
                 "convert": tuple(tuple(group.names) for group in run.groups)}
        for part, identity in parts.items():
            owner = seen.setdefault((part, identity), key)
            shared[(part, key)] = (part, owner)
            if owner != key:
                continue
            if part == "convert":
                runners[(part, key)] = convert
            else:
                runners[(part, key)], _ = _host_partition_runner(graph, run, types, threads)
    return core, runs, crossings, runners, shared


def _npu_entry(run, programs, partitions, conversions, clock_mhz, link_bytes, config, sim):
    """An NPU step's figures."""
    cycles = run.cycles
    npu_seconds = cycles / (clock_mhz * 1e6)
    transfer_bytes = sum(p["bytes_in"] + p["bytes_out"] for p in programs)
    transfer_seconds = transfer_bytes / link_bytes
    host_seconds = partitions.median + conversions.median
    source = "the cycle model, sw/timing.py" if run.cycles_predicted else f"the RTL on {sim}"
    return {
        "source": "modelled", "seconds": npu_seconds + transfer_seconds + host_seconds,
        "how": (f"NPU: {cycles:,} cycles ({source}) at {clock_mhz:g} MHz; link: "
                f"{transfer_bytes:,} bytes at {link_bytes / 1e6:g} MB/s; host partitions and "
                f"conversions measured here"),
        "npu": {"programs": run.programs, "cycles": cycles,
                "cycle_counts": list(run.cycle_counts),
                "cycles_from": "cycle model" if run.cycles_predicted else sim,
                "clock_mhz": clock_mhz, "npu_seconds": npu_seconds,
                "transfer_bytes": transfer_bytes,
                "transfers": [[p["bytes_in"], p["bytes_out"]] for p in programs],
                "transfer_seconds": transfer_seconds,
                "host_partitions": sum(bool(step.outputs) for step in run.partitions),
                "host_partition_seconds": partitions.median,
                "host_partition_timing": partitions.to_json(),
                "conversion_seconds": conversions.median,
                "conversion_timing": conversions.to_json(),
                "seconds_without_transfers": npu_seconds + host_seconds,
                "seconds_over_board_link": npu_seconds + host_seconds
                + transfer_bytes / board_link_bytes_per_second(),
                "npu_macs": run.npu_macs, "host_macs": run.cpu_macs,
                "macs_per_second": run.npu_macs / npu_seconds if npu_seconds else 0.0,
                "utilization": run.npu_macs / (cycles * config.rows * config.cols)
                if cycles else 0.0,
                "counters": dict(run.counters),
                "groups": [[node.name for node in group.nodes] for group in run.groups]}}


def _outputs_entry(outputs, int8_reference, fp32_reference):
    """How a step's outputs compare with the INT8 reference and with the FP32 baseline."""
    equal, diff_int8 = _compare(outputs, {k: v for k, v in int8_reference.items()
                                          if k in outputs})
    _, diff_fp32 = _compare({k: np.asarray(v, np.float64) for k, v in outputs.items()},
                            {k: np.asarray(v, np.float64) for k, v in fp32_reference.items()
                             if k in outputs})
    return {"equal_to_int8_reference": equal, "max_abs_diff_int8_reference": diff_int8,
            "max_abs_diff_fp32": diff_fp32}


def _op_name(node):
    """An operator's name in the counts: its type, and the layout a layout transformer gave
    it."""
    layouts = {attr.name: attr.i for attr in node.attribute if attr.name == "channels_last"}
    if layouts.get("channels_last") == 1 and not node.op_type.startswith("Nhwc"):
        return f"{node.op_type} (NHWC)"
    if node.domain == "com.microsoft.nchwc":
        return f"{node.op_type} (NCHWc)"
    return node.op_type


def _optimized_ops(path, level):
    """``Counter`` of the operators of the graph onnxruntime runs for the model at ``path``
    at ``level`` (its optimized model, written to a temporary file)."""
    import onnx
    import onnxruntime
    with tempfile.TemporaryDirectory(prefix="npu-stack-") as folder:
        options = _session_options(level, True, 1)
        options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        onnxruntime.InferenceSession(os.fspath(path), options,
                                     providers=["CPUExecutionProvider"])
        model = onnx.load(options.optimized_model_filepath, load_external_data=False)
    return Counter(_op_name(node) for node in model.graph.node)


def _facts(model, core, runs):
    run = runs["npu"]
    levels = ("ORT_DISABLE_ALL", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
    return {"macs": run.npu_macs + run.cpu_macs, "npu_macs": run.npu_macs,
            "host_macs": run.cpu_macs,
            "nodes_on_npu": sum(p.device == "npu" for p in run.placements),
            "nodes": len(run.placements),
            "float_ops": dict(sorted(_optimized_ops(model.float_path,
                                                    "ORT_DISABLE_ALL").items())),
            "quantized_ops": {level: dict(sorted(_optimized_ops(model.quantized_path,
                                                                level).items()))
                              for level in levels},
            "chain_ends": dict(_chain_ends(core, runs["npu_fused"]))}


def run_stack(model, *, config, clock_mhz=None, link_bytes=None, repeat=DEFAULT_REPEAT,
              warmup=DEFAULT_WARMUP, threads=1, sim="model", progress=False):
    """Run ``model`` (a :class:`StackModel`) through every step of :data:`STEPS`.

    Parameters
    ----------
    config : hw.config.NPUConfig
    clock_mhz : float, optional
        The NPU's clock; by default its measured Fmax (:func:`measured_clock_mhz`).
    link_bytes : float, optional
        The host link's bytes per second; by default :func:`link_bytes_per_second`.
    repeat, warmup : int
        Timed runs (the median is the figure) and untimed runs before them.
    threads : int
        onnxruntime's ``intra_op_num_threads`` for every host session.
    sim : str
        Where the NPU programs run: ``"model"`` (cycles from the cycle model), or
        ``"verilator"`` or ``"icarus"`` (cycles counted by the RTL).
    progress : bool
        A progress bar while the NPU programs run (on the terminal only).

    Returns
    -------
    StackResult
    """
    from .onnx.graph import import_model
    from .onnx.runtime import check_input
    _check_settings(repeat, warmup, threads, sim)
    clock_mhz, clock_source = _clock(config, clock_mhz)
    link_bytes, link_source = _link(config, clock_mhz, link_bytes)
    graph = import_model(model.quantized_path)
    check_input(graph, model.x)
    outputs, runners = _host_steps(model, graph.inputs[0][0], threads)
    core, runs, crossings, npu_runners, shared = _npu_steps(graph, model.x, config, sim,
                                                            threads, progress)
    runners.update(npu_runners)
    load_before = os.getloadavg()
    timings = _measure(runners, repeat=repeat, warmup=warmup)
    load_after = os.getloadavg()
    for key, run in runs.items():
        outputs[key] = run.outputs

    how = (f"measured here: onnxruntime, {threads} thread{'s' * (threads > 1)}, median of "
           f"{repeat} runs after {warmup}")
    steps = []
    for definition in STEPS:
        key = definition.key
        entry = {"step": definition.number, "key": key, "title": definition.title,
                 "seeds_stage": definition.seeds_stage, "definition": definition.definition}
        if key in _HOST_OPTIONS:
            level, memory = _HOST_OPTIONS[key]
            entry.update(source="measured", seconds=timings[key].median,
                         timing=timings[key].to_json(), how=how,
                         session={"model": "float" if key == "fp32" else "QDQ",
                                  "graph_optimization_level": level,
                                  "enable_mem_pattern": memory,
                                  "enable_cpu_mem_arena": memory,
                                  "intra_op_num_threads": threads,
                                  "inter_op_num_threads": 1})
        else:
            entry.update(_npu_entry(runs[key], crossings[key],
                                    timings[shared[("partitions", key)]],
                                    timings[shared[("convert", key)]], clock_mhz, link_bytes,
                                    config, sim))
        entry["outputs"] = _outputs_entry(outputs[key], outputs["layout"], outputs["fp32"])
        steps.append(entry)
    baseline = steps[0]["seconds"]
    for index, entry in enumerate(steps):
        entry["speedup"] = baseline / entry["seconds"]
        entry["speedup_over_previous"] = steps[max(index - 1, 0)]["seconds"] / entry["seconds"]
        entry["verdict"] = _verdict(entry["speedup_over_previous"]) if index else "baseline"
    reference = {"title": "FP32 with onnxruntime's defaults (one thread)",
                 "definition": "the float model, ORT_ENABLE_ALL, memory arena and pattern on: "
                               "what a user of onnxruntime gets without quantizing",
                 "source": "measured", "seconds": timings["fp32_defaults"].median,
                 "timing": timings["fp32_defaults"].to_json(), "how": how,
                 "speedup": baseline / timings["fp32_defaults"].median,
                 "outputs": _outputs_entry(outputs["fp32_defaults"], outputs["layout"],
                                           outputs["fp32"])}
    facts = _facts(model, core, runs)
    facts["run_overhead"] = timings["run_overhead"].to_json()
    result = StackResult(model=model, config=config, clock_mhz=clock_mhz,
                         clock_source=clock_source, link_bytes_per_second=link_bytes,
                         link_source=link_source, steps=steps, reference=reference,
                         facts=facts, outputs=outputs, runs=runs,
                         timing={"repeat": repeat, "warmup": warmup, "threads": threads,
                                 "load_average_before": [round(v, 2) for v in load_before],
                                 "load_average_after": [round(v, 2) for v in load_after]})
    for entry in steps:
        entry["why"] = _why(entry, result)
    return result


# -- why each step does what it does -------------------------------------------------------------

def _counts(counter):
    items = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{count} {name}" for name, count in items) or "none"


def _ms(seconds):
    return f"{_fmt_ms(seconds)} ms"


def _plural(count, word):
    return f"{count:,} {word}{'s' * (count != 1)}"


#: The integer kernels onnxruntime fuses QDQ groups into.
_INTEGER_KERNELS = ("QLinearConv", "QGemm", "QLinearMatMul", "QLinearAdd", "QLinearConcat",
                    "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSoftmax",
                    "QLinearMul", "QLinearLeakyRelu", "QLinearSigmoid", "MatMulInteger",
                    "ConvInteger")


def _ops(result, level):
    return Counter(result.facts["quantized_ops"][level])


def _why_fp32(entry, result):
    overhead = result.facts["run_overhead"]["median"]
    return (f"The baseline. onnxruntime has no generic kernel to start from: MLAS's blocked, "
            f"vectorized GEMM (the seeds' stage 4) serves this step and every other host step. "
            f"onnxruntime's fixed cost of a run (a model of one Identity node on the same "
            f"input, timed alike) is {_ms(overhead)}, {overhead / entry['seconds']:.0%} of "
            f"this step.")


def _why_int8(entry, result):
    ops = _ops(result, "ORT_DISABLE_ALL")
    float_ops = sum(ops[name] for name in ("Conv", "Gemm", "MatMul"))
    text = (f"Without fusion onnxruntime runs the QDQ model as written: "
            f"{ops['DequantizeLinear']} DequantizeLinear and {ops['QuantizeLinear']} "
            f"QuantizeLinear nodes around {float_ops} float Conv/Gemm/MatMul nodes, the weights "
            f"dequantized on every run, so the arithmetic is still float32 (onnxruntime "
            f"computes in integers only in the kernels step 3 fuses)")
    if entry["verdict"] == "faster":
        return text + "."
    return text + "; the quantization only adds work."


def _why_fusion(entry, result):
    none, extended = _ops(result, "ORT_DISABLE_ALL"), _ops(result, "ORT_ENABLE_EXTENDED")
    fused = Counter({name: count for name, count in extended.items()
                     if name in _INTEGER_KERNELS})
    relus = result.facts["float_ops"].get("Relu", 0)
    return (f"onnxruntime fused the QDQ groups into integer kernels ({_counts(fused)}): "
            f"int8 operands, int32 accumulators; {sum(extended.values())} nodes left of "
            f"{sum(none.values())}. The seeds' Conv + ReLU fusion happened before, in the "
            f"quantizer: of the float model's {relus} Relu nodes {none.get('Relu', 0)} are left "
            f"in the QDQ model, the others folded into their convolution's output range. In "
            f"onnxruntime INT8 arithmetic and fusion are one step.")


def _why_memory(entry, result):
    tensors = sum(_ops(result, "ORT_ENABLE_EXTENDED").values())
    saving = {"faster": "the saving is measurable here",
              "slower": "here the run is slower, against the seeds' expectation",
              "no measurable change": "here the saving is within the runs' spread"}
    return (f"The arena and the memory pattern replace a malloc and a free per intermediate "
            f"tensor (about {tensors} per run, one per node) by one pre-planned block; "
            f"{saving[entry['verdict']]}. onnxruntime's allocation planner decides which "
            f"buffers are reused at every setting: this step changes only how they are "
            f"allocated.")


def _why_layout(entry, result):
    extended, every = _ops(result, "ORT_ENABLE_EXTENDED"), _ops(result, "ORT_ENABLE_ALL")
    added, removed = every - extended, extended - every
    rewrite = (f"ORT_ENABLE_ALL's layout transformers rewrote the graph (now: "
               f"{_counts(added)}; before: {_counts(removed)}), so that its kernels read "
               f"channels contiguously" if added or removed else
               "ORT_ENABLE_ALL left this graph as it was")
    return (f"{rewrite}. The seeds' 'optimized, vectorized GEMM' has no step of its own here: "
            f"MLAS's blocked GEMM kernels are in every host step from step 1.")


def _shares(entry):
    npu, total = entry["npu"], entry["seconds"]
    return (f"of its {_ms(total)}: NPU programs {npu['npu_seconds'] / total:.0%}, link "
            f"{npu['transfer_seconds'] / total:.0%}, host partitions "
            f"{npu['host_partition_seconds'] / total:.0%}, host conversions "
            f"{npu['conversion_seconds'] / total:.0%}")


def _why_npu(entry, result):
    npu, config, facts = entry["npu"], result.config, result.facts
    peak = config.rows * config.cols * result.clock_mhz * 1e6
    host_rate = facts["macs"] / result.step("layout")["seconds"]
    counters = npu["counters"]
    cycles = max(npu["cycles"], 1)
    slots = counters.get("array_rows", 0) * config.rows * config.cols
    busy = (f" The array streamed a row in {counters.get('array_rows', 0) / cycles:.0%} of "
            f"the cycles, and the graph's MACs fill {npu['npu_macs'] / slots:.0%} of the MAC "
            f"slots of the rows it streamed (the rest: tiles partly filled); the issue stage "
            f"waited on the load unit {counters.get('stall_load', 0) / cycles:.0%} of the "
            f"cycles, on "
            f"the array {counters.get('stall_array', 0) / cycles:.0%}, on the store unit "
            f"{counters.get('stall_store', 0) / cycles:.0%}." if slots else "")
    return (f"The {config.name} array at {result.clock_mhz:g} MHz peaks at {peak / 1e9:.2f} "
            f"GMAC/s; on this model it sustains {npu['macs_per_second'] / 1e9:.2f} GMAC/s "
            f"({npu['utilization']:.1%} of its peak, over "
            f"{_plural(npu['programs'], 'program')}), while one host core ran the whole INT8 "
            f"model at {host_rate / 1e9:.2f} GMAC/s in step 5.{busy} The NPU runs "
            f"{facts['npu_macs'] / facts['macs']:.1%} of the MACs; {_shares(entry)}.")


def _why_npu_fused(entry, result):
    npu = entry["npu"]
    unfused = result.step("npu")
    before = unfused["npu"]
    if npu["programs"] == before["programs"]:
        return (f"Nothing to chain: no NPU layer's output is read by exactly one NPU layer "
                f"and nothing else (the programs' outputs: "
                f"{_counts(Counter(result.facts['chain_ends']))}), so fuse=True builds the "
                f"same {_plural(npu['programs'], 'program')} and the same "
                f"{npu['transfer_bytes']:,} bytes cross the link; {_shares(entry)}.")
    delta = npu["cycles"] - before["cycles"]
    text = (f"fuse=True chained the NPU layers into {_plural(npu['programs'], 'program')} "
            f"(from {before['programs']}), {_ms(unfused['seconds'] - entry['seconds'])} "
            f"less: the link carries {npu['transfer_bytes']:,} bytes instead of "
            f"{before['transfer_bytes']:,} ({_ms(npu['transfer_seconds'])} instead of "
            f"{_ms(before['transfer_seconds'])}), the host's conversions take "
            f"{_ms(npu['conversion_seconds'])} instead of {_ms(before['conversion_seconds'])}, "
            f"its partitions ({npu['host_partitions']} instead of "
            f"{before['host_partitions']}) {_ms(npu['host_partition_seconds'])} instead of "
            f"{_ms(before['host_partition_seconds'])}, and the NPU's cycles change by "
            f"{delta:+,} ({_ms(npu['npu_seconds'] - before['npu_seconds'])}).")
    stores = npu["counters"].get("stall_store", 0) - before["counters"].get("stall_store", 0)
    if delta > 0 and stores > 0:
        instructions = npu["counters"].get("instructions", 0) \
            - before["counters"].get("instructions", 0)
        text += (f" A chained program waits inside its cycles for a layer's stores before "
                 f"the next layer reads them ({stores:+,} cycles stalled on the store unit, "
                 f"{instructions:+,} instructions), where separate programs wait between "
                 f"programs, outside their cycles.")
    return text + f" What is left, {_shares(entry)}."


_WHY = {"fp32": _why_fp32, "int8": _why_int8, "fusion": _why_fusion, "memory": _why_memory,
        "layout": _why_layout, "npu": _why_npu, "npu_fused": _why_npu_fused}


def _why(entry, result):
    """One paragraph: why the step changed the latency as it did."""
    if entry["verdict"] == "baseline":
        change = ""
    elif entry["verdict"] == "no measurable change":
        change = (f"No measurable change from step {entry['step'] - 1} "
                  f"({entry['speedup_over_previous']:.2f}x). ")
    else:
        change = (f"{entry['verdict'].capitalize()} than step {entry['step'] - 1} "
                  f"({entry['speedup_over_previous']:.2f}x). ")
    return change + _WHY[entry["key"]](entry, result)


# -- reports -----------------------------------------------------------------------------------

def machine():
    """The host's description for the report."""
    import onnxruntime
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            names = [line.split(":", 1)[1].strip() for line in info
                     if line.startswith("model name")]
        if names:
            cpu = f"{names[0]} ({len(names)} logical CPUs)"
    except OSError:
        pass
    return {"cpu": cpu, "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "system": platform.system()}


def report(results):
    """The JSON object of :func:`run_stack`'s results."""
    return {"seeds": [{"stage": stage, "optimization": what, "covered": where,
                       "latency_ms": latency} for stage, what, where, latency in SEEDS_STACK],
            "seeds_source": SEEDS_SOURCE, "steps": [
                {"step": s.number, "key": s.key, "seeds_stage": s.seeds_stage,
                 "title": s.title, "definition": s.definition} for s in STEPS],
            "noise": NOISE, "machine": machine(),
            "models": [result.to_json() for result in results]}


def _seeds_cell(stage):
    latency = SEEDS_STACK[stage][3]
    return f"{stage}: {latency} ms ({SEEDS_STACK[0][3] / latency:.1f}x)"


def _fmt_ms(seconds):
    """Milliseconds to three significant digits."""
    milliseconds = seconds * 1e3
    if milliseconds >= 100:
        return f"{milliseconds:,.0f}"
    if milliseconds == 0:
        return "0"
    digits = max(0, 2 - int(np.floor(np.log10(abs(milliseconds)))))
    return f"{milliseconds:.{digits}f}"


def _output_cell(outputs):
    if outputs["equal_to_int8_reference"]:
        return "bit-exact"
    if outputs["max_abs_diff_int8_reference"] is None:
        return "no output of the same name"
    return f"max diff {outputs['max_abs_diff_int8_reference']:.3g}"


def _measured_cell(timing):
    low, high = timing["quartiles"]
    return f"measured (median of {timing['runs']}; quartiles {_fmt_ms(low)}-{_fmt_ms(high)})"


def model_markdown(result, level=2):
    """The Markdown section of one model's stack: its table, the NPU steps in parts and why
    each step does what it does."""
    facts = result.facts
    model = result.model
    lines = [f"{'#' * level} {model.label}", "",
             f"{model.description[0].upper()}{model.description[1:]}. Quantized with "
             f"{model.quantization}. Input: {model.input_source}, shape "
             f"{'x'.join(map(str, model.x.shape))}. {facts['nodes_on_npu']} of "
             f"{facts['nodes']} nodes of the graph onnxruntime runs at ORT_ENABLE_EXTENDED "
             f"are NPU layers, with {facts['npu_macs']:,} of its {facts['macs']:,} MACs "
             f"({facts['npu_macs'] / max(facts['macs'], 1):.1%}). NPU {result.config.name} at "
             f"{result.clock_mhz:g} MHz, link {result.link_bytes_per_second / 1e6:g} MB/s.",
             "",
             "| step | | latency (ms) | speedup vs step 1 | vs the step before | verdict | "
             "how the figure was obtained | output vs INT8 reference | seeds' stage: latency "
             "(speedup) |",
             "|---:|---|---:|---:|---:|---|---|---|---|"]
    for entry in result.steps:
        if entry["source"] == "measured":
            how = _measured_cell(entry["timing"])
        else:
            npu = entry["npu"]
            how = (f"modelled: {npu['cycles']:,} cycles = {_fmt_ms(npu['npu_seconds'])}, + "
                   f"{npu['transfer_bytes']:,} B over the link = "
                   f"{_fmt_ms(npu['transfer_seconds'])}, + host "
                   f"{_fmt_ms(npu['host_partition_seconds'] + npu['conversion_seconds'])} "
                   f"(measured)")
        lines.append(
            f"| {entry['step']} | {entry['title']} | {_fmt_ms(entry['seconds'])} | "
            f"{entry['speedup']:.2f}x | {entry['speedup_over_previous']:.2f}x | "
            f"{entry['verdict']} | {how} | {_output_cell(entry['outputs'])} | "
            f"{_seeds_cell(entry['seeds_stage'])} |")
    reference = result.reference
    lines += [f"| | {reference['title']} | {_fmt_ms(reference['seconds'])} | "
              f"{reference['speedup']:.2f}x | | reference | "
              f"{_measured_cell(reference['timing'])} | "
              f"{_output_cell(reference['outputs'])} | |", "",
              "The NPU steps in parts (ms; host parts measured, the rest from cycles and "
              "bytes):", "",
              "| step | programs | NPU cycles | NPU | bytes over the link | link | host "
              "partitions (how many) | host conversions | total | total without the link | "
              f"total over the board's UART ({board_link_bytes_per_second() / 1e3:g} KB/s) | "
              "array utilization |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for entry in result.steps:
        if entry["source"] != "modelled":
            continue
        npu = entry["npu"]
        lines.append(
            f"| {entry['step']} | {npu['programs']} | {npu['cycles']:,} | "
            f"{_fmt_ms(npu['npu_seconds'])} | {npu['transfer_bytes']:,} | "
            f"{_fmt_ms(npu['transfer_seconds'])} | {_fmt_ms(npu['host_partition_seconds'])} "
            f"({npu['host_partitions']}) | {_fmt_ms(npu['conversion_seconds'])} | "
            f"{_fmt_ms(entry['seconds'])} | {_fmt_ms(npu['seconds_without_transfers'])} | "
            f"{_fmt_ms(npu['seconds_over_board_link'])} | {npu['utilization']:.1%} |")
    lines += ["", "Why each step does what it does:", ""]
    lines += [f"{entry['step']}. **{entry['title']}**: {entry['why']}"
              for entry in result.steps]
    lines.append("")
    return "\n".join(lines)


def _seeds_markdown():
    lines = ["| Stage | Optimization | Where it was covered | Latency |",
             "|---:|---|---|---:|"]
    lines += [f"| {stage} | {what} | {where} | {latency} ms |"
              for stage, what, where, latency in SEEDS_STACK]
    return "\n".join(lines)


def _names(items):
    items = list(items)
    if len(items) <= 1:
        return "".join(items) or "none"
    return ", ".join(items[:-1]) + " and " + items[-1]


def _span(values, form):
    values = sorted(values)
    if not values:
        return "-"
    if form(values[0]) == form(values[-1]):
        return form(values[0])
    return f"{form(values[0])} to {form(values[-1])}"


def _findings(results):
    """The summary across models."""
    lines = []
    for result in results:
        step = result.step
        lines.append(
            f"* **{result.model.label}**: FP32 {_ms(step('fp32')['seconds'])} -> best host "
            f"INT8 (step 5) {_ms(step('layout')['seconds'])} "
            f"({step('layout')['speedup']:.2f}x) -> NPU layer by layer "
            f"{_ms(step('npu')['seconds'])} ({step('npu')['speedup']:.2f}x) -> crossings "
            f"removed {_ms(step('npu_fused')['seconds'])} "
            f"({step('npu_fused')['speedup']:.2f}x). Steps that did not help: "
            + _names(f"{e['step']} ({e['verdict']})" for e in result.steps[1:]
                     if e["verdict"] != "faster") + ".")
    config, clock = results[0].config, results[0].clock_mhz
    peak = config.rows * config.cols * clock * 1e6
    int8_slower = [r.model.label for r in results if r.step("int8")["verdict"] == "slower"]
    lines += [
        "",
        f"**On the host** INT8 pays only with fusion: INT8 alone (step 2) is slower than "
        f"FP32 on {_names(int8_slower)}, since onnxruntime computes in integers only in "
        f"fused kernels; fusion (step 3) gains "
        + _names(f"{r.step('fusion')['speedup_over_previous']:.2f}x on {r.model.label}"
                 for r in results)
        + ". Memory planning (step 4): "
        + _names(f"{r.step('memory')['verdict']} on {r.model.label}" for r in results)
        + "; the kernels' layout (step 5): "
        + _names(f"{r.step('layout')['verdict']} on {r.model.label}" for r in results)
        + ". The best host INT8 step against FP32 with onnxruntime's defaults: "
        + _names(f"{r.reference['seconds'] / r.step('layout')['seconds']:.2f}x on "
                 f"{r.model.label}" for r in results) + ".",
    ]
    slower = [r for r in results if r.step("npu_fused")["seconds"] > r.step("layout")["seconds"]]
    rates = [r.step("npu")["npu"]["macs_per_second"] / 1e9 for r in results]
    host_rates = [r.facts["macs"] / r.step("layout")["seconds"] / 1e9 for r in results]
    shares = {part: [r.step("npu_fused")["npu"][part] / r.step("npu_fused")["seconds"]
                     for r in results]
              for part in ("npu_seconds", "transfer_seconds")}
    host_shares = [(r.step("npu_fused")["npu"]["host_partition_seconds"]
                    + r.step("npu_fused")["npu"]["conversion_seconds"])
                   / r.step("npu_fused")["seconds"] for r in results]
    percent = "{:.0%}".format
    if slower:
        verdict = ("makes every model slower" if len(slower) == len(results) else
                   f"makes {_names(r.model.label for r in slower)} slower")
        lines += [
            "",
            f"**Offloading to this NPU {verdict}** than the host's best INT8 step: by "
            + _names(f"{r.step('npu_fused')['seconds'] / r.step('layout')['seconds']:.0f}x "
                     f"on {r.model.label}" for r in slower)
            + f" (steps 7 against 5). The {config.name} array at {clock:g} MHz peaks at "
            f"{peak / 1e9:.2f} GMAC/s and sustains {_span(rates, '{:.2f}'.format)} GMAC/s on "
            f"these models; one core of this machine's CPU runs their INT8 kernels at "
            f"{_span(host_rates, '{:.1f}'.format)} GMAC/s. The seeds' NPU step assumes an "
            f"accelerator faster than the CPU it serves; this one, an FPGA prototype at "
            f"{clock:g} MHz, is not, so steps 6 and 7 measure what offloading costs here and "
            f"where its time goes: the array's cycles are "
            f"{_span(shares['npu_seconds'], percent)} of the offloaded time (step 7), the "
            f"link {_span(shares['transfer_seconds'], percent)}, the host's partitions and "
            f"conversions {_span(host_shares, percent)}."]
    if len(slower) < len(results):
        faster = [r for r in results if r not in slower]
        lines += ["", "**Offloading to this NPU beats the host's best INT8 step** on "
                  + _names(f"{r.model.label} "
                           f"({r.step('layout')['seconds'] / r.step('npu_fused')['seconds']:.2f}x)"
                           for r in faster) + "."]
    chained = [r for r in results
               if r.step("npu_fused")["npu"]["programs"] < r.step("npu")["npu"]["programs"]]
    unchained = [r for r in results if r not in chained]
    text = "**Removing the crossings** (step 7) "
    if chained:
        text += ("chains NPU layers that feed each other alone: " + _names(
            f"{r.model.label} {r.step('npu')['npu']['programs']} -> "
            f"{r.step('npu_fused')['npu']['programs']} programs, "
            f"{r.step('npu_fused')['speedup_over_previous']:.2f}x "
            f"({r.step('npu_fused')['verdict']})" for r in chained) + ". ")
    if unchained:
        text += (f"On {_names(r.model.label for r in unchained)} there is nothing to chain: "
                 f"every NPU layer's output goes to a host operator or to several readers "
                 f"(the models' sections list where). ")
    text += ("With a link as wide as the NPU's bus the crossings are a small part of the "
             "offloaded time, which the array's cycles dominate; what chaining saves is the "
             "link's bytes, the host's conversions around each program and any host partition "
             "between them.")
    board = board_link_bytes_per_second()

    def over_board(result):
        return (result.step("npu")["npu"]["seconds_over_board_link"]
                / result.step("npu_fused")["npu"]["seconds_over_board_link"])
    if chained:
        text += (f" Over the host link the ULX3S SoC has today (a UART, {board / 1e3:g} KB/s: "
                 f"docs/board.md) the bytes would dominate, and removing the crossings would "
                 f"gain " + _names(f"{over_board(r):.2f}x on {r.model.label}" for r in chained)
                 + " (the parts tables' column for it).")
    lines += ["", text]
    return lines


def markdown(results, *, command=None):
    """docs/stack.md: the findings, the seeds' table, the steps and how each figure is
    obtained, then each model's stack."""
    info = machine()
    first = results[0]
    config, clock = first.config, first.clock_mhz
    loads = [load for result in results
             for load in (result.timing["load_average_before"][0],
                          result.timing["load_average_after"][0])]
    command = command or "npu stack"
    sources = {step["npu"]["cycles_from"] for result in results for step in result.steps
               if step["source"] == "modelled"}
    cycles_from = ("from the cycle model (`sw/timing.py`: `npu onnx --sim model`'s cycles, "
                   "equal to the RTL's on the test models, tb/test_timing_quant.py, and on "
                   "the digits CNN's programs here, tb/test_stack.py)"
                   if sources == {"cycle model"} else
                   f"counted by the RTL ({', '.join(sorted(sources))})")
    if first.clock_source.startswith("given"):
        clock_text = f"{clock:g} MHz (`--clock-mhz`)"
    else:
        clock_text = (f"the clock the config reaches on ECP5 ({FMAX_SOURCE}: "
                      + ", ".join(f"{name} {mhz} MHz" for name, mhz in ECP5_FMAX_MHZ.items())
                      + "; `--clock-mhz` sets another)")
    if first.link_source.startswith("given"):
        link = f"a link of {first.link_bytes_per_second / 1e6:g} MB/s (`--link-mb-s`)"
    else:
        link = (f"a link assumed as wide as the NPU's AXI data bus at the NPU's clock "
                f"({config.name}: {config.bus_width} bits x {clock:g} MHz = "
                f"{link_bytes_per_second(config, clock) / 1e6:g} MB/s; `--link-mb-s` sets "
                f"another)")
    lines = [
        "# The optimization stack on real networks",
        "",
        f"Written by `{command}` on {time.strftime('%Y-%m-%d')} (`sw/stack.py`; issue 52, "
        f"point 3). The seeds' lesson ends on an optimization stack measured on one small "
        f"CNN: the same graph executed in successively better ways, from FP32 on the CPU to "
        f"an NPU without CPU/NPU crossings, 100 ms down to 7 ms. This page runs the same "
        f"steps on the project's digits CNN (the seeds' network: Conv -> ReLU -> Conv -> "
        f"BatchNorm -> ReLU -> GEMM) and on public architectures, with this project's NPU as "
        f"the accelerator; it says how each figure was obtained and, where a step does not "
        f"help here, why.",
        "",
        "## Findings",
        "",
    ]
    lines += _findings(results)
    lines += [
        "",
        "## The seeds' table",
        "",
        f"From {SEEDS_SOURCE}:",
        "",
        _seeds_markdown(),
        "",
        "\"Stacked together, 100ms → 7ms is roughly a 14.3× speedup\" (the seeds). The lesson "
        "does not say on what CPU or NPU its figures were taken.",
        "",
        "## The steps here",
        "",
        "Each step changes one thing from the step before, in the seeds' order; the last "
        "column of each model's table puts the seeds' stage and figure beside it.",
        "",
        "| step | seeds' stage | what runs |",
        "|---:|---|---|",
    ]
    lines += [f"| {step.number} | {step.seeds_stage}: {SEEDS_STACK[step.seeds_stage][1]} | "
              f"{step.title}: {step.definition} |" for step in STEPS]
    lines += [
        "",
        "Where the steps differ from the seeds' and why:",
        "",
        "* **INT8 and fusion are one step in onnxruntime.** Its integer kernels (QLinearConv, "
        "QGemm, ...) exist only as fusions of a QDQ group (DequantizeLinear -> Conv -> "
        "QuantizeLinear); unfused, a QDQ model computes in float32 with extra nodes (step 2). "
        "The seeds' Conv + ReLU fusion is done by the quantizer, which folds each ReLU into "
        "its convolution's output range (onnxruntime fuses it in the float model too, into "
        "FusedConv, at ORT_ENABLE_EXTENDED).",
        "* **No generic-kernel baseline.** onnxruntime's CPU kernels are MLAS's blocked, "
        "vectorized GEMM and convolution from step 1 on; there is nothing slower to switch "
        "off. The seeds' stage 4 is taken by the last host optimization onnxruntime has, "
        "ORT_ENABLE_ALL's layouts, which makes step 5 onnxruntime's default session but for "
        "the thread count.",
        "* **The baseline has no optimizations**, as the seeds' has none (\"dynamic "
        "allocation, no fusion\"); FP32 with onnxruntime's defaults is the last row of each "
        "table, for what a user gets from the float model.",
        "* **Quantization**: QDQ with uint8 activations (int8 weights, per channel, "
        "reduce_range). With int8 activations onnxruntime's int8-to-uint8 rewrite on x86 "
        "leaves convolutions in float32 (docs/onnx.md; 24 of SqueezeNet 1.1's 26 with "
        "onnxruntime 1.32.0), where neither its integer kernels nor the NPU run them.",
        "",
        "## How each figure is obtained",
        "",
        f"* **Host steps (1 to 5) are measured here**: onnxruntime {info['onnxruntime']} on "
        f"{info['cpu']}, one thread (`intra_op_num_threads=1`, `inter_op_num_threads=1`, "
        f"sequential execution) so that the figures do not depend on how many cores the "
        f"machine lends; batch 1 latency of `InferenceSession.run` from Python, the median of "
        f"{first.timing['repeat']} runs after {first.timing['warmup']} warm-up runs, every "
        f"session run once per round in a rotating order so that a change in the machine's "
        f"load falls on all steps alike, Python's garbage collector off while timing. The "
        f"machine is shared (1-minute load average {min(loads):.1f} to {max(loads):.1f} "
        f"around these runs): each table gives the quartiles.",
        f"* **NPU steps (6 and 7) are modelled from exact figures**: each program's cycles "
        f"{cycles_from} at {clock_text}; plus the bytes each program's host transfers move "
        f"(the program's input activations in, its output out; the weights and the program "
        f"stay in the NPU's DRAM from load time) over {link}; plus the host's share, measured "
        f"as the host steps are: the onnxruntime partitions between the programs (sessions "
        f"with step 5's options) and the host's conversions around each program (NCHW to "
        f"NHWC and uint8 to int8 in, back out: `group_input` and `group_output` of "
        f"`sw/ir/runner.py`). Each table also gives the total without the link, and over "
        f"the host link the ULX3S SoC has today (a UART at 3 Mbaud, "
        f"{board_link_bytes_per_second() / 1e3:g} KB/s: docs/board.md).",
        "* **Not counted** in the NPU steps: starting a program (a few register writes and an "
        "interrupt) and the host's copy of what the link delivers. The figures are for the "
        "NPU clocked at its measured Fmax beside this machine's CPU; no board with both was "
        "measured.",
        "* **Outputs**: every step's outputs are compared with the INT8 reference, step 5's "
        "(onnxruntime at ORT_ENABLE_ALL, as `npu onnx --check` compares); the NPU steps are "
        "bit-exact with it wherever the tables say so. The FP32 rows give their largest "
        "difference from it.",
        f"* **Verdicts**: a step is \"faster\" or \"slower\" than the one before when the "
        f"latencies differ by more than {NOISE:.0%}, otherwise \"no measurable change\".",
    ]
    for result in results:
        lines += ["", model_markdown(result).rstrip("\n")]
    lines += ["", "## Reproduce", "", "```", command, "```", "",
              "`--json` prints every figure of this page, each timing's median, quartiles and "
              "minimum, each NPU program's cycles and bytes, the performance counters and the "
              "session options.", ""]
    return "\n".join(lines)


# -- npu stack ---------------------------------------------------------------------------------

def add_parser(commands):
    """Add the ``stack`` command to the ``npu`` parser's ``commands``."""
    from hw.config import BUS_WIDTHS
    from .cli import _config_name, positive_int
    command = commands.add_parser(
        "stack", help="the seeds' optimization stack on a model: FP32, INT8, fusion, memory "
                      "planning on the host (measured), then NPU offload and crossings "
                      "removed (cycles at the measured clock)")
    command.add_argument("models", nargs="+", metavar="MODEL",
                         help="a float ONNX model file, or a built-in model: digits or a zoo "
                              "network (" + ", ".join(_zoo().ZOO) + ")")
    command.add_argument("--input", metavar="X.npy",
                         help="the model's input, float32, batch first (required for a "
                              "model file; a built-in model has its own)")
    command.add_argument("--quantized", metavar="Q.onnx",
                         help="a model file's quantized form (QDQ or QOperator)")
    command.add_argument("--calibrate", metavar="DATA.npy",
                         help="quantize a model file with onnxruntime's quantize_static on "
                              "these samples (QDQ, --activation)")
    command.add_argument("--activation", choices=("uint8", "int8"), default="uint8",
                         help="activation type of the quantization (default uint8)")
    command.add_argument("--size", type=positive_int, default=None,
                         help="input resolution of a zoo network (default: the zoo's)")
    command.add_argument("--config", type=_config_name, default="8x8",
                         help="array size RxC (default 8x8)")
    command.add_argument("--spad-depth", type=positive_int, default=None,
                         help="scratchpad rows (default: NPUConfig's; another needs "
                              "--clock-mhz)")
    command.add_argument("--acc-depth", type=positive_int, default=None,
                         help="accumulator rows (default: NPUConfig's; another needs "
                              "--clock-mhz)")
    command.add_argument("--bus-width", type=int, choices=BUS_WIDTHS, default=None,
                         help="AXI4 data width in bits (default: the config's; another "
                              "needs --clock-mhz)")
    command.add_argument("--sim", choices=("model", "verilator", "icarus"), default="model",
                         help="where the NPU programs run for their cycles (default model: "
                              "the cycle model's exact count)")
    command.add_argument("--clock-mhz", type=float, default=None,
                         help="the NPU's clock (default: the config's measured Fmax on ECP5, "
                              + ", ".join(f"{k} {v}" for k, v in ECP5_FMAX_MHZ.items()) + ")")
    command.add_argument("--link-mb-s", type=float, default=None,
                         help="the host link's bandwidth in MB/s (default: the NPU's AXI "
                              "data bus at the NPU's clock)")
    command.add_argument("--repeat", type=positive_int, default=DEFAULT_REPEAT,
                         help=f"timed runs of each host part (default {DEFAULT_REPEAT})")
    command.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                         help=f"untimed runs before them (default {DEFAULT_WARMUP})")
    command.add_argument("--json", action="store_true", help="print one JSON object")
    command.add_argument("--markdown", metavar="FILE",
                         help="write the report (every model) to FILE, as docs/stack.md")
    return command


def _models(arguments):
    """Check every argument, then ``[(name, context manager of a StackModel)]``."""
    from .cli import load_npy
    names = builtin_names()
    files = [model for model in arguments.models if model not in names]
    for path in files:
        if not os.path.isfile(path):
            raise NPUValueError(f"{path}: no such model file, nor a built-in model "
                                f"({', '.join(names)})")
    if files and len(arguments.models) > 1:
        raise NPUValueError("a model file is run alone: give one MODEL with --input")
    if not files and (arguments.quantized or arguments.calibrate):
        raise NPUValueError("--quantized and --calibrate are for a model file, not a "
                            "built-in model")
    if arguments.input and len(arguments.models) > 1:
        raise NPUValueError("--input goes with one MODEL")
    if arguments.quantized and arguments.calibrate:
        raise NPUValueError("give --quantized or --calibrate, not both")
    if files and not (arguments.quantized or arguments.calibrate):
        raise NPUValueError(f"{files[0]}: a model file needs its quantized form "
                            f"(--quantized Q.onnx) or samples to quantize it with "
                            f"(--calibrate DATA.npy)")
    if arguments.size is not None and any(name not in _zoo().ZOO
                                          for name in arguments.models):
        raise NPUValueError("--size is for the zoo's networks only")
    if arguments.warmup < 0:
        raise NPUValueError(f"--warmup must be 0 or more, not {arguments.warmup}")
    if arguments.link_mb_s is not None and not arguments.link_mb_s > 0:
        raise NPUValueError(f"--link-mb-s must be positive, not {arguments.link_mb_s:g}")
    x = load_npy("--input", arguments.input) if arguments.input else None
    if x is not None and x.dtype != np.float32:
        raise NPUValueError(f"--input {arguments.input}: the float model takes float32, not "
                            f"{x.dtype}")
    if files:
        from .onnx.graph import load_model
        path = files[0]
        load_model(path)
        if x is None:
            raise NPUValueError(f"{path}: a model file needs --input X.npy")
        if arguments.quantized:
            load_model(arguments.quantized)
        calibration = load_npy("--calibrate", arguments.calibrate) \
            if arguments.calibrate else None
        return [(path, file_model(path, x, quantized_path=arguments.quantized,
                                  calibration=calibration, activation=arguments.activation,
                                  input_source=f"--input {arguments.input}"))]
    models = []
    for name in arguments.models:
        models.append((name, _builtin_with_input(name, x, arguments)))
    return models


@contextlib.contextmanager
def _builtin_with_input(name, x, arguments):
    with builtin_model(name, activation=arguments.activation, size=arguments.size) as model:
        if x is not None:
            model.x = x
            model.input_source = f"--input {arguments.input}"
        yield model


def _command_line(arguments):
    """The ``npu stack`` command that gives these results (options at their defaults left
    out, --json too)."""
    import shlex
    words = ["npu", "stack", *arguments.models]
    defaults = {"activation": "uint8", "config": "8x8", "sim": "model",
                "repeat": DEFAULT_REPEAT, "warmup": DEFAULT_WARMUP}
    for option in ("input", "quantized", "calibrate", "activation", "size", "config",
                   "spad_depth", "acc_depth", "bus_width", "sim", "clock_mhz", "link_mb_s",
                   "repeat", "warmup", "markdown"):
        value = getattr(arguments, option, None)
        if value is not None and value != defaults.get(option):
            words += ["--" + option.replace("_", "-"), f"{value:g}" if isinstance(value, float)
                      else str(value)]
    return " ".join(shlex.quote(word) for word in words)


def run(arguments, config):
    """The ``stack`` command; returns the exit status."""
    import sys
    _clock(config, arguments.clock_mhz)         # refused before any model is built
    models = _models(arguments)
    if arguments.markdown:
        target = Path(arguments.markdown)
        if not target.parent.is_dir():
            raise NPUValueError(f"--markdown {target}: no such directory {target.parent}")
        if target.is_dir():
            raise NPUValueError(f"--markdown {target}: a directory, not a file")
    results = []
    for name, context in models:
        with context as model:
            if not arguments.json:
                print(f"npu stack: {name} ...", file=sys.stderr)
            results.append(run_stack(
                model, config=config, clock_mhz=arguments.clock_mhz,
                link_bytes=arguments.link_mb_s * 1e6 if arguments.link_mb_s else None,
                repeat=arguments.repeat, warmup=arguments.warmup, sim=arguments.sim,
                progress=not arguments.json))
    if arguments.markdown:
        try:
            Path(arguments.markdown).write_text(markdown(results,
                                                         command=_command_line(arguments)))
        except OSError as error:
            raise NPUValueError(f"--markdown {arguments.markdown}: cannot write "
                                f"({error.strerror})") from None
    if arguments.json:
        print(json.dumps(report(results), indent=1))
    else:
        for result in results:
            print(model_markdown(result))
    return 0
