"""The cocotb test that runs driver jobs: for each program, load DRAM, run, save DRAM.

:func:`sim.runner.run_programs` writes the job to the folder named by ``NPU_JOB`` and reads
``result.json`` and ``dram_out_<i>.npy`` back from it.
"""

import json
import os
from pathlib import Path

import cocotb
import numpy as np

from .bench import TB, ProgramHang


@cocotb.test()
async def run_job(dut):
    job = Path(os.environ["NPU_JOB"])
    spec = json.loads((job / "job.json").read_text())
    images = [np.load(job / f"dram_in_{index}.npy") for index in range(len(spec["programs"]))]
    dram_size = max(len(image) for image in images)

    tb = TB(dut, dram_size=dram_size)
    await tb.reset()
    results = []
    for index, (program, image) in enumerate(zip(spec["programs"], images)):
        tb.dram.write(0, image.tobytes() + bytes(dram_size - len(image)))
        timeout = program["timeout_cycles"] or 50 * len(image) + 10_000_000
        try:
            outcome = await tb.run_program(program["prog_addr"], program["prog_len"], timeout)
        except ProgramHang as hang:
            raise ProgramHang(f"program {index} of {len(images)} (at {program['prog_addr']:#x}, "
                              f"length {program['prog_len']}): {hang}") from None
        np.save(job / f"dram_out_{index}.npy",
                np.frombuffer(tb.dram.read(0, len(image)), dtype=np.uint8))
        results.append({
            "done": outcome.done,
            "error_code": outcome.error_code.value,
            "error_pc": outcome.error_pc,
            "cycles": outcome.cycles,
            "instructions": outcome.instructions,
            "perf": outcome.perf,
        })
    (job / "result.json").write_text(json.dumps(results))
