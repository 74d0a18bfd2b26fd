"""The graph core both front ends share: one intermediate graph, one placer, one grouper and
one runner.

The project's own networks (:mod:`sw.nn`) and ONNX models (:mod:`sw.onnx`) are each turned
into a :class:`~sw.ir.graph.Graph` of :class:`~sw.ir.graph.Op`: an operator the array can
run carries its lowering (a :class:`~sw.nn.quantize.QConv2D` or
:class:`~sw.nn.quantize.QDense`), every other one says why it runs on the host. Then:

* :mod:`sw.ir.placement` places each operator (NPU or host, with the reason);
* :mod:`sw.ir.grouping` cuts the graph into the run's steps: NPU groups (chains of NPU
  operators, through free flatten views, run as ONE program) and host steps;
* :mod:`sw.ir.runner` runs the steps: each NPU group on a backend (the instruction-level
  model, the RTL, the simulated SoC or the board), each host step by the front end's own
  host (the INT8 reference for :mod:`sw.nn`, onnxruntime for :mod:`sw.onnx`).
"""
