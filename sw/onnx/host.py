"""The host's part of an ONNX model, run by onnxruntime itself.

The runtime works as an onnxruntime execution provider does: the NPU claims the nodes it
runs (:func:`sw.ir.placement.place`), and every other node runs on onnxruntime's CPU
execution provider, in *partitions*: the host nodes between two NPU programs, in the graph's
order (a :class:`~sw.ir.grouping.HostStep`), cut out as a model of their own whose inputs are the tensors
they read from outside (8-bit tensors with their scales and zero points as constants, or
float ones) and whose outputs are the tensors read after them. Each partition is one
``InferenceSession``, built once and run on the whole batch, so any operator onnxruntime
runs is supported with onnxruntime's exact semantics, and nothing of it is re-implemented
here.

The partitions are made from the graph onnxruntime optimized at ``ORT_ENABLE_EXTENDED``
(:mod:`sw.onnx.graph`) and run with onnxruntime's default session options, as the whole
model does when onnxruntime runs it alone: the same nodes, the same kernels.
"""

import numpy as np

from ..errors import NPUValueError, first_line


__all__ = ["OnnxHost", "probe", "partition_model"]




def _value_info(name, dtype, shape):
    """A tensor's type for a partition's boundary: its dtype and shape with the first
    dimension left open, so that any batch size runs. (The shape matters: onnxruntime's
    layout transformers, NCHWc among them, rewrite a Conv only when its input's channels are
    known, and its float result then differs in the last bits.)"""
    from onnx import helper
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    dims = [None] + list(shape[1:]) if len(shape) else []
    return helper.make_tensor_value_info(name, elem, dims)


def partition_model(graph, nodes, inputs, outputs, types):
    """A ModelProto of ``nodes`` with the graph's constants they use as initializers;
    ``types`` maps a boundary tensor to ``(dtype, shape)`` of a run."""
    from onnx import helper, numpy_helper
    used = {name for node in nodes for name in node.inputs}
    initializers = [numpy_helper.from_array(np.asarray(graph.constants[name]), name)
                    for name in sorted(used) if name in graph.constants]
    body = helper.make_graph(
        [node.proto for node in nodes], "host_partition",
        [_value_info(name, *types[name]) for name in inputs],
        [_value_info(name, *types[name]) for name in outputs], initializers)
    model = helper.make_model(body, opset_imports=[helper.make_opsetid(domain, version)
                                                   for domain, version in graph.opsets.items()])
    model.ir_version = graph.ir_version
    return model


def _session(model, what, *, optimize=True):
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return onnxruntime.InferenceSession(model.SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
    except Exception as error:
        raise NPUValueError(f"onnxruntime cannot run {what}: {first_line(error)}") from None


def probe(graph, x):
    """``{tensor: (dtype, shape)}`` of every tensor the graph computes, from one onnxruntime
    run of ``x`` with every node's output made an output of the model (optimizations off:
    the graph is already the one onnxruntime runs)."""
    from onnx import helper
    name = graph.inputs[0][0]
    produced = [out for node in graph.nodes for out in node.outputs if out]
    model = partition_model(graph, graph.nodes, [name], [], {name: (x.dtype, x.shape)})
    for out in produced:
        model.graph.output.append(helper.ValueInfoProto(name=out))
    session = _session(model, f"{graph.path or 'the model'}", optimize=False)
    try:
        values = session.run(produced, {name: x})
    except Exception as error:
        raise NPUValueError(f"onnxruntime failed on {graph.path or 'the model'}: "
                            f"{first_line(error)}") from None
    result = {name: (x.dtype, x.shape)}
    for out, value in zip(produced, values):
        value = np.asarray(value)
        result[out] = (value.dtype, value.shape)
    return result


class OnnxHost:
    """The host of an ONNX model's run (the ``host`` of :func:`sw.ir.runner.run_graph`):
    each :class:`~sw.ir.grouping.HostStep` as one onnxruntime session, made at its first
    run and kept in the step.

    ``types`` maps each tensor to ``(dtype, shape)`` of a run (:func:`probe`).
    """

    def __init__(self, graph, types):
        self.graph = graph
        self.types = types

    def session(self, step):
        """The step's onnxruntime session (made once)."""
        if step.runner is None:
            nodes = [op.payload for op in step.nodes]
            model = partition_model(self.graph, nodes, step.inputs, step.outputs, self.types)
            step.runner = _session(model, f"the host nodes {nodes[0].name!r} to "
                                          f"{nodes[-1].name!r}")
        return step.runner

    def prepare(self, step):
        """Make the step's session before the runner times the step."""
        self.session(step)

    def __call__(self, step, values):
        session = self.session(step)
        feed = {name: values[name] for name in step.inputs}
        try:
            results = session.run(step.outputs, feed)
        except Exception as error:
            raise NPUValueError(f"onnxruntime failed on the host nodes {step.nodes[0].name!r} "
                                f"to {step.nodes[-1].name!r}: {first_line(error)}") from None
        values.update(zip(step.outputs, results))
