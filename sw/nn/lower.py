"""A quantized network as the graph core's :class:`sw.ir.graph.Graph`.

The network's operators form a chain; each becomes an :class:`~sw.ir.graph.Op` reading the
previous one's output (the first reads the graph's input ``"x"``, float NHWC). Convolutions
and dense layers carry themselves as their lowering (they are already the NPU's
:class:`~sw.nn.quantize.QConv2D` and :class:`~sw.nn.quantize.QDense`); a flatten is a free
``"HWC"`` view (:func:`sw.nn.passes.flatten_as_view` put the dense rows in NHWC order); the
others run on the host, by the INT8 reference (:func:`sw.nn.reference.run_op`), for the
reason given here.
"""

from ..ir.graph import Graph, Op
from .quantize import NPU_KINDS
from .reference import run_op


__all__ = ["INPUT", "HOST_REASONS", "network_graph", "run_host"]

#: The graph's input tensor.
INPUT = "x"

#: Why each operator kind without a lowering runs on the host.
HOST_REASONS = {
    "quantize": "float to INT8 conversion of the host's input: the array has no float "
                "datapath; the host does it while writing the input into DRAM",
    "relu": "an elementwise max(q, zero point) left unfused: the array has no elementwise "
            "unit, so it is a separate pass over the tensor on the host",
    "flatten": "a reshape with no arithmetic: the dense weight rows are in NHWC order, so "
               "it is a free view of the same DRAM bytes and nothing runs",
    "maxpool": "a max over windows: no multiply-accumulate, so no GEMM the array can stream",
    "softmax": "exponentials and a division in float: the array only multiplies and adds "
               "INT8 into INT32",
    "argmax": "a data-dependent compare-and-select reduction, not a matmul",
}


def network_graph(qnet, batch=1):
    """The graph of ``qnet`` (a :class:`~sw.nn.quantize.QuantizedNetwork`); MACs counted
    for ``batch`` samples."""
    ops, previous = [], INPUT
    for op in qnet.ops:
        gemm = op.kind in NPU_KINDS
        ops.append(Op(op.name, op.kind, (previous,), (op.name,),
                      lowered=op if gemm else None,
                      reason=HOST_REASONS.get(op.kind, "no lowering to the array exists for "
                                                       "this operator"),
                      view="HWC" if op.kind == "flatten" else None,
                      macs=op.macs(batch) if gemm else 0, sources=tuple(op.sources),
                      payload=op))
        previous = op.name
    return Graph(ops=ops, inputs=[INPUT], outputs=[previous], layout="NHWC")


def run_host(step, values):
    """The ``host`` of :func:`sw.ir.runner.run_graph` for a network: each operator of the
    step by the INT8 reference."""
    for node in step.nodes:
        values[node.outputs[0]] = run_op(node.payload, values[node.inputs[0]])
