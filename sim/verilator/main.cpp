// The simulation's main loop under Verilator: cocotb's own (cocotb 2.1,
// share/lib/verilator/verilator.cpp), with one change: the clock is toggled here,
// in C++, and not by a cocotb Clock. A cocotb clock, even its C++ (GPI) one, costs a timed VPI callback
// every half period, and that was most of the run time of a simulation whose Python sleeps
// (sim/runner.py says how much). The clock's half period in simulation time steps comes
// from the environment, NPU_CLOCK_HALF_STEPS; without it the loop is cocotb's. Everything
// else (the value-change callbacks behind RisingEdge(clk), timers, ReadOnly) is unchanged,
// so the cocotb bench cannot tell the difference except by speed. A second change: while
// the bench sleeps (the top level's bench_sleep, see sim/bench_top.py), the clock runs in a
// loop of its own with no call into cocotb until the bench's wake-up signal or its timer.
//
// Copyright cocotb contributors
// Licensed under the Revised BSD License, see LICENSE for details.
// SPDX-License-Identifier: BSD-3-Clause

#include <libgen.h>  // basename
#include <stdio.h>   // stderr, fprintf

#include <stdlib.h>  // getenv, strtoull

#include <algorithm>  // std::min
#include <memory>     // std::unique_ptr
#include <string>     // std::string

#include "Vtop.h"
#include "verilated.h"
#include "verilated_vpi.h"

#ifndef VM_TRACE_FST
// emulate new verilator behavior for legacy versions
#define VM_TRACE_FST 0
#endif

#if VM_TRACE
#if VM_TRACE_FST
#include <verilated_fst_c.h>
using verilated_trace_t = VerilatedFstC;
#elif VM_TRACE_SAIF
#include <verilated_saif_c.h>
using verilated_trace_t = VerilatedSaifC;
#else
// VM_TRACE_VCD
#include <verilated_vcd_c.h>
using verilated_trace_t = VerilatedVcdC;
#endif
static verilated_trace_t *tfp;
#endif

static vluint64_t main_time = 0;  // Current simulation time
#if VM_COVERAGE
static bool coverage_per_instance = false;
#endif

double sc_time_stamp() {  // Called by $time in Verilog
    return main_time;     // converts to double, to match
                          // what SystemC does
}

extern "C" {
void vlog_startup_routines_bootstrap(void);
}

static inline bool settle_value_callbacks() {
    bool cbs_called, again;

    // Call Value Change callbacks
    // These can modify signal values so we loop
    // until there are no more changes
    cbs_called = again = VerilatedVpi::callValueCbs();
    while (again) {
        again = VerilatedVpi::callValueCbs();
    }

    return cbs_called;
}

void wrap_up() {
    VerilatedVpi::callCbs(cbEndOfSimulation);

#if VM_TRACE
    if (tfp) {
        // We don't delete the trace object to avoid deadlock in verilator sims.
        tfp->close();
    }
#endif

    // VM_COVERAGE is a define which is set if Verilator is
    // instructed to collect coverage (when compiling the simulation)
#if VM_COVERAGE
    if (coverage_per_instance) {
        Verilated::threadContextp()->coveragep()->forcePerInstance(true);
    }
    VerilatedCov::write();  // Uses +verilator+coverage+file+<filename>,
                            // defaults to coverage.dat
#endif
}

int main(int argc, char **argv) {
#if VM_TRACE_FST
    const char *traceFile = "dump.fst";
#elif VM_TRACE_SAIF
    const char *traceFile = "dump.saif";
#else
    const char *traceFile = "dump.vcd";
#endif
    bool traceOn = false;
    bool traceFlush = false;
    bool coveragePerInstance = false;

    for (int i = 1; i < argc; i++) {
        std::string arg = std::string(argv[i]);
        if (arg == "--coverage-per-instance") {
#if VM_COVERAGE
            coveragePerInstance = true;
#else
            fprintf(stderr,
                    "Error: --coverage-per-instance requires the design to be "
                    "built with coverage support\n");
            return -1;
#endif
        } else if (arg == "--trace") {
#if VM_TRACE
            traceOn = true;
#else
            fprintf(stderr,
                    "Error: --trace requires the design to be built with trace "
                    "support\n");
            return -1;
#endif
        } else if (arg == "--trace-flush") {
            traceFlush = true;
        } else if (arg == "--trace-file") {
            if (++i < argc) {
                traceFile = argv[i];
            } else {
                fprintf(stderr, "Error: --trace-file requires a parameter\n");
                return -1;
            }
        } else if (arg == "--help") {
            fprintf(
                stderr,
                "usage: %s [--coverage-per-instance] [--trace] [--trace-flush] "
                "[--trace-file TRACEFILE]\n"
                "\n"
                "cocotb + Verilator sim\n"
                "\n"
                "options:\n"
                "  --coverage-per-instance  Force per-instance coverage "
                "(requires coverage build)\n"
                "  --trace                  Enable tracing (VCD, SAIF or FST)\n"
                "  --trace-flush            Flush trace at each time step "
                "(slow)\n"
                "  --trace-file             Specify the trace file name (%s by "
                "default)\n",
                basename(argv[0]), traceFile);
            return 0;
        }
    }

    Verilated::commandArgs(argc, argv);
#if VM_COVERAGE
    coverage_per_instance = coveragePerInstance;
#endif
#ifdef VERILATOR_SIM_DEBUG
    Verilated::debug(99);
#endif
    std::unique_ptr<Vtop> top(new Vtop(""));
    Verilated::fatalOnVpiError(false);  // otherwise it will fail on systemtf

#ifdef VERILATOR_SIM_DEBUG
    Verilated::internalsDump();
#endif

#if VM_TRACE
    Verilated::traceEverOn(true);
    if (traceOn) {
        tfp = new verilated_trace_t;
        top->trace(tfp, 99);
        tfp->open(traceFile);
    }
#endif

    vlog_startup_routines_bootstrap();
    Verilated::addExitCb([](void *) { wrap_up(); }, nullptr);
    VerilatedVpi::callCbs(cbStartOfSimulation);
    settle_value_callbacks();

    // The clock: high from time 0, toggled every half period.
    const char *half_env = getenv("NPU_CLOCK_HALF_STEPS");
    const vluint64_t clock_half = half_env ? strtoull(half_env, nullptr, 10) : 0;
    vluint64_t next_clock_edge = clock_half;
    if (clock_half) {
        top->clk = 1;
    }

    while (!Verilated::gotFinish()) {
        do {
            // We must evaluate whole design until we process all 'events' for
            // this time step
            do {
                top->eval_step();
                VerilatedVpi::clearEvalNeeded();
                VerilatedVpi::doInertialPuts();
                settle_value_callbacks();
            } while (VerilatedVpi::evalNeeded());

            // Run ReadWrite callback as we are done processing this eval step
            VerilatedVpi::callCbs(cbReadWriteSynch);
            VerilatedVpi::doInertialPuts();
            settle_value_callbacks();
        } while (VerilatedVpi::evalNeeded());

        top->eval_end_step();

        // Call ReadOnly callbacks
        VerilatedVpi::callCbs(cbReadOnlySynch);

#if VM_TRACE
        if (tfp) {
            tfp->dump(main_time);
            if (traceFlush) {
                tfp->flush();
            }
        }
#endif
        // cocotb controls the clock inputs using cbAfterDelay so
        // skip ahead to the next registered callback
        const vluint64_t NO_TOP_EVENTS_PENDING = static_cast<vluint64_t>(~0ULL);
        vluint64_t next_time_cocotb = VerilatedVpi::cbNextDeadline();
        vluint64_t next_time_timing =
            top->eventsPending() ? top->nextTimeSlot() : NO_TOP_EVENTS_PENDING;
        vluint64_t next_time = std::min(next_time_cocotb, next_time_timing);
        if (clock_half) {
            next_time = std::min(next_time, next_clock_edge);
        }

        // If there are no more cbAfterDelay callbacks,
        // the next deadline is max value, so end the simulation now
        if (next_time == NO_TOP_EVENTS_PENDING) {
            break;
        } else {
            main_time = next_time;
        }

        // Call registered NextSimTime
        // It should be called in simulation cycle before everything else
        // but not on first cycle
        VerilatedVpi::callCbs(cbNextSimTime);
        settle_value_callbacks();

        // The clock edge of this time step; the eval at the top of the loop takes it, and
        // the value-change callbacks (RisingEdge) see it there.
        if (clock_half && main_time == next_clock_edge) {
            top->clk = !top->clk;
            next_clock_edge += clock_half;
        }

        // Call registered timed callbacks (e.g. clock timer)
        // These are called at the beginning of the time step
        // before the iterative regions (IEEE 1800-2012 4.4.1)
        VerilatedVpi::callTimedCbs();
        settle_value_callbacks();

        // The bench sleeps (bench_sleep, set from Python while it waits for bench_wake):
        // run the clock here without calling into cocotb, time step after time step,
        // until bench_wake rises, the next cocotb timer falls due or the design finishes.
        // The time step where that happens is evaluated again by the loop above (nothing
        // has changed, so that costs nothing), which runs its callbacks at its exact time.
        // A bench that sleeps promises that nothing else in Python waits for a signal.
#if VM_TRACE
        const bool fast = clock_half && !tfp;
#else
        const bool fast = clock_half;
#endif
        if (fast && top->bench_sleep && !top->bench_wake) {
            const vluint64_t deadline = VerilatedVpi::cbNextDeadline();
            while (true) {
                top->eval_step();
                if (top->bench_wake || Verilated::gotFinish() || next_clock_edge >= deadline) {
                    break;
                }
                top->eval_end_step();
                main_time = next_clock_edge;
                top->clk = !top->clk;
                next_clock_edge += clock_half;
            }
        }
    }

    top->final();

    wrap_up();

#if VM_TRACE
    if (tfp) {
        delete tfp;
        tfp = nullptr;
    }
#endif

    // Fail the sim if any assertion/error fired during the run.
    if (Verilated::threadContextp()->errorCount() > 0) {
        return 1;
    }

    return 0;
}
