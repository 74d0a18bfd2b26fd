"""The cocotb test that runs one driver job: load DRAM, run the program, save DRAM.

:func:`sim.runner.run_program` writes the job to the folder named by ``NPU_JOB`` and reads
``result.json`` and ``dram_out.npy`` back from it.
"""

import json
import os
from pathlib import Path

import cocotb
import numpy as np

from .bench import TB


@cocotb.test()
async def run_job(dut):
    job = Path(os.environ["NPU_JOB"])
    spec = json.loads((job / "job.json").read_text())
    dram = np.load(job / "dram_in.npy")

    tb = TB(dut, dram_size=len(dram))
    tb.dram.write(0, dram.tobytes())
    await tb.reset()
    timeout = spec["timeout_cycles"] or 50 * len(dram) + 10_000_000
    outcome = await tb.run_program(spec["prog_addr"], spec["prog_len"], timeout)

    np.save(job / "dram_out.npy", np.frombuffer(tb.dram.read(0, len(dram)), dtype=np.uint8))
    (job / "result.json").write_text(json.dumps({
        "done": outcome.done,
        "error_code": outcome.error_code.value,
        "error_pc": outcome.error_pc,
        "cycles": outcome.cycles,
        "instructions": outcome.instructions,
    }))
