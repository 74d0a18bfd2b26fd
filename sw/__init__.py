"""Software for the NPU: compiler, instruction-level model, backends, driver and CLI.

* :mod:`sw.codec`    fast instruction encoding, derived from :mod:`hw.isa`'s layouts
* :mod:`sw.compiler` tiles ``C = A @ B`` into a program (:func:`~sw.compiler.compile_gemm`)
* :mod:`sw.model`    instruction-level simulator (:class:`~sw.model.ModelNPU`)
* :mod:`sw.backend`  :class:`~sw.backend.RunResult` and :func:`~sw.backend.run_program`
* :mod:`sw.driver`   :func:`~sw.driver.gemm`, the host-side entry point
* :mod:`sw.cli`      the ``npu`` command
* :mod:`sw.errors`   :class:`~sw.errors.NPUError` and its subclasses

Nothing is imported here, so ``import sw.backend`` stays light for ``sim.runner``.
"""
