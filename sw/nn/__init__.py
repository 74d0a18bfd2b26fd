"""A small network, end to end: description, training, compilation and execution on the NPU.

* :mod:`sw.nn.graph`     layers with float weights (Conv2D, ReLU, BatchNorm, Flatten, Dense,
  MaxPool2D, Softmax, Argmax), NHWC, and :class:`~sw.nn.graph.Network`
* :mod:`sw.nn.train`     the digits data set and numpy training (im2col, Adam)
* :mod:`sw.nn.passes`    BatchNorm folding, ReLU fusion, flatten as a free view
* :mod:`sw.nn.quantize`  post-training INT8 quantization with calibration
* :mod:`sw.nn.reference` the exact INT8 reference executor
* :mod:`sw.nn.lower`     the quantized network as the graph core's graph (:mod:`sw.ir`)
* :mod:`sw.nn.memory`    DRAM buffer planning with reuse (greedy interval colouring)
* :mod:`sw.nn.program`   DRAM images and programs: one per layer, or the whole chain in one
* :mod:`sw.nn.runtime`   running batches on a backend, with the host's transfers counted
* :mod:`sw.nn.demo`      :func:`~sw.nn.demo.run_demo`, the report of ``npu demo digits``

Nothing is imported here, so that ``import sw.nn.graph`` stays light.
"""
