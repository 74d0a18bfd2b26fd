"""Software for the NPU: compiler, instruction-level model, backends, driver and CLI.

* :mod:`sw.codec`    fast instruction encoding, derived from :mod:`hw.isa`'s layouts
* :mod:`sw.compiler` tiles ``C = A @ B`` into a program (:func:`~sw.compiler.compile_gemm`),
  and quantized layers (:func:`~sw.compiler.compile_qgemm`, :func:`~sw.compiler.compile_quantized`,
  :func:`~sw.compiler.compile_conv2d`, :func:`~sw.compiler.compile_depthwise_conv2d`)
* :mod:`sw.conv`     quantized 2-D convolution without im2col (:func:`~sw.conv.conv2d`)
* :mod:`sw.operands` checks of the host's numpy operands
* :mod:`sw.reference` the exact results, computed with numpy (:func:`~sw.reference.reference_gemm`)
* :mod:`sw.quant`    the requantization arithmetic (:func:`~sw.quant.requantize`)
* :mod:`sw.model`    instruction-level simulator (:class:`~sw.model.ModelNPU`)
* :mod:`sw.backend`  :func:`~sw.backend.run_program` on any backend, returning a
  :class:`~sim.result.RunResult`
* :mod:`sw.driver`   :func:`~sw.driver.gemm` and :func:`~sw.driver.qgemm`, the host-side
  entry points
* :mod:`sw.cli`      the ``npu`` command
* :mod:`sw.errors`   :class:`~sw.errors.NPUError` and its subclasses

Nothing is imported here, so importing one module of ``sw`` stays light.
"""
