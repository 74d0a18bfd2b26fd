// The simulated DRAM: an AXI4 slave memory inside the simulated hardware.
//
// Written by hand for this project: no well-kept HDL AXI RAM is packaged on PyPI, and this one
// has to do what only a simulation model does: load and dump its contents from files
// ($readmemh / $writememh) at the bench's command, log which bytes were written, answer
// chosen address ranges with SLVERR or DECERR, and stall its channels at random from a seed.
// It is Verilog-2005 so that Icarus (-g2005) and Verilator both take it, and its control
// registers start defined (Icarus would hold them at X until the first reset edge); sim/dram.py is its
// Python side and documents the ports; the protocol is AXI4 (AMBA AXI and ACE, issue H).
//
// Timing without back-pressure, the same as cocotbext-axi's slave models in this bench
// (sim/bench.py) and the cycle model (sw/timing.py):
//   * an AR accepted in cycle c has its first R beat valid in cycle c + R_LATENCY, the rest
//     one per cycle; bursts queue behind one another (AR_DEPTH outstanding) and their beats
//     follow back to back;
//   * AW and W are accepted whenever there is room; W only once its AW is in (a slave may wait
//     for AWVALID before WREADY, A3.3.1); a burst whose last W beat is accepted in cycle t has
//     its B valid in cycle t + B_LATENCY;
//   * reads and writes run at the same time, on separate ports of the memory.
// Only full-width INCR bursts are served (all the NPU issues; the protocol checker beside this
// model fails any other).
//
// The memory holds WORDS bus words (the size class the runner builds, sim/dram.py), RATIO of
// them an entry. A beat whose bytes reach past `size` (bytes: the program's image, set at run
// time) is answered SLVERR: a read beat carries zeros, a write beat writes none of its bytes
// past `size`. Up to FAULTS ranges [lo, hi) answer a read beat that touches them with their
// response and POISON bytes, and a write byte inside them is not written and its burst is
// answered with their response.

`default_nettype none

module npu_axi_dram #(
    parameter DATA_WIDTH = 64,
    parameter ADDR_WIDTH = 32,
    parameter ID_WIDTH   = 1,
    parameter WORDS      = 1 << 21,      // memory depth in bus words
    parameter RATIO      = 1,            // bus words per memory entry, a power of two (see mem)
    parameter R_LATENCY  = 2,            // AR accepted -> first R beat valid, cycles (>= 2)
    parameter B_LATENCY  = 2,            // last W beat accepted -> B valid, cycles (>= 2)
    parameter AR_DEPTH   = 8,            // reads accepted and not yet answered
    parameter AW_DEPTH   = 8,            // write bursts accepted and not yet answered
    parameter FAULTS     = 4,
    parameter POISON     = 8'hEE
) (
    input  wire                      clk,
    input  wire                      rst,

    // AXI4 slave
    input  wire [ID_WIDTH-1:0]       s_awid,
    input  wire [ADDR_WIDTH-1:0]     s_awaddr,
    input  wire [7:0]                s_awlen,
    input  wire                      s_awvalid,
    output wire                      s_awready,
    input  wire [DATA_WIDTH-1:0]     s_wdata,
    input  wire [DATA_WIDTH/8-1:0]   s_wstrb,
    input  wire                      s_wlast,
    input  wire                      s_wvalid,
    output wire                      s_wready,
    output reg  [ID_WIDTH-1:0]       s_bid = 0,
    output reg  [1:0]                s_bresp = 0,
    output reg                       s_bvalid = 0,
    input  wire                      s_bready,
    input  wire [ID_WIDTH-1:0]       s_arid,
    input  wire [ADDR_WIDTH-1:0]     s_araddr,
    input  wire [7:0]                s_arlen,
    input  wire                      s_arvalid,
    output wire                      s_arready,
    output reg  [ID_WIDTH-1:0]       s_rid = 0,
    output reg  [DATA_WIDTH-1:0]     s_rdata = 0,
    output reg  [1:0]                s_rresp = 0,
    output reg                       s_rlast = 0,
    output reg                       s_rvalid = 0,
    input  wire                      s_rready,

    // The bench's controls (sim/dram.py), all held steady while a program runs.
    input  wire [2:0]                command,     // 1: load, 2: dump, 3: clear the write log,
                                                  // 4: a write response out of nowhere
    input  wire [31:0]               words,       // words to load or dump, from address 0
    input  wire [32:0]               size,        // bytes answered; beyond: SLVERR
    input  wire [FAULTS*33-1:0]      fault_lo,    // fault range k: [lo, hi)
    input  wire [FAULTS*33-1:0]      fault_hi,
    input  wire [FAULTS*4-1:0]       fault_kind,  // {write, read, resp[1:0]}
    input  wire                      bp_enable,   // back-pressure and latency on
    input  wire [31:0]               bp_seed,
    input  wire [5*16-1:0]           bp_free_max, // per channel AR, R, AW, W, B: longest free run
    input  wire [3:0]                bp_pause_max,
    input  wire [3:0]                bp_latency_max,
    input  wire                      drop_writes  // a mutant: every 8th write beat is lost
);
    localparam BYTES = DATA_WIDTH / 8;
    localparam LG = $clog2(BYTES);
    localparam ENTRIES = WORDS / RATIO;
    localparam IDX = $clog2(ENTRIES);            // entry index bits
    localparam RL = $clog2(RATIO);               // bus word in its entry
    localparam AR_PTR = $clog2(AR_DEPTH);
    localparam AW_PTR = $clog2(AW_DEPTH);
    localparam B_DEPTH = 2 * AW_DEPTH;
    localparam B_PTR = $clog2(B_DEPTH);
    localparam OKAY = 2'd0, SLVERR = 2'd2;

    // A memory of more than 2^28 entries is refused by Verilator, so the largest memories of
    // a narrow bus (4 GiB of 64-bit words) hold RATIO bus words an entry, the lowest address
    // in the low bits: the load and dump files have one entry a line (sim/dram.py).
    reg [RATIO*DATA_WIDTH-1:0] mem [0:ENTRIES-1];
    reg [RATIO*BYTES-1:0] written [0:ENTRIES-1];    // bytes a write changed since the load
    // The bus word of the byte address `addr` in its entry (always 0 with one an entry).
    function [32:0] lane_of(input [32:0] addr);
        lane_of = (RATIO == 1) ? 33'd0 : (addr >> LG) % RATIO;
    endfunction

    // The entries that `words` bus words (a load, a dump) cover.
    function [31:0] entries(input [31:0] count);
        entries = (count + RATIO - 1) / RATIO;
    endfunction

    reg [31:0] now = 0;                          // cycles since reset: the time stamps' clock
    integer i, k;

    // ------------------------------------------------------------------ back-pressure
    // Each channel alternates a free run of 1..free_max cycles and a pause of 1..pause_max
    // (at least one free cycle between pauses, so no stall is unbounded); the draws come from
    // one xorshift32 generator per channel, seeded from bp_seed.
    function [31:0] xorshift(input [31:0] x);
        reg [31:0] y;
        begin
            y = x ^ (x << 13);
            y = y ^ (y >> 17);
            xorshift = y ^ (y << 5);
        end
    endfunction

    function [15:0] max1(input [15:0] x);
        max1 = (x == 16'd0) ? 16'd1 : x;
    endfunction

    reg [31:0] bp_state [0:4];               // AR, R, AW, W, B
    reg [31:0] read_draw, write_draw;        // the extra latency of reads, of writes
    reg [15:0] bp_count [0:4];
    reg [4:0]  bp_paused = 0;
    // Only registers reach the ready signals: logic that depends on an input of the
    // simulation's top level is evaluated at every change of an input (sim/bench_top.py).
    wire stall_ar = bp_paused[0];
    wire stall_r  = bp_paused[1];
    wire stall_aw = bp_paused[2];
    wire stall_w  = bp_paused[3];
    wire stall_b  = bp_paused[4];

    always @(posedge clk) begin
        if (rst) begin
            for (k = 0; k < 5; k = k + 1)
                bp_state[k] <= xorshift(bp_seed ^ (32'h9E3779B9 * (k + 1)) ^ 32'h1);
            for (k = 0; k < 5; k = k + 1)
                bp_count[k] <= 16'd1;
            bp_paused <= 5'b0;
        end else if (bp_enable) begin
            for (k = 0; k < 5; k = k + 1) begin
                if (bp_count[k] == 16'd1) begin
                    bp_state[k] <= xorshift(bp_state[k]);
                    bp_paused[k] <= ~bp_paused[k];
                    if (bp_paused[k])
                        bp_count[k] <= 16'd1 + bp_state[k] % max1(bp_free_max[16*k +: 16]);
                    else
                        bp_count[k] <= 16'd1 + bp_state[k] % max1({12'd0, bp_pause_max});
                end else begin
                    bp_count[k] <= bp_count[k] - 16'd1;
                end
            end
        end
    end

    // Extra latency of an accepted burst: none three times out of four, else 1..latency_max.
    function [31:0] extra_latency(input [31:0] draw);
        begin
            if (!bp_enable || draw[31:30] != 2'b00 || bp_latency_max == 0)
                extra_latency = 32'd0;
            else
                extra_latency = 32'd1 + draw[15:0] % bp_latency_max;
        end
    endfunction

    // ------------------------------------------------------------------ faults
    // The response for the bytes [addr, addr + len) of a read, 0 (OKAY) when no read fault
    // range touches them; the first matching range wins.
    function [1:0] read_fault(input [32:0] addr);
        integer f;
        reg found;
        begin
            read_fault = OKAY;
            found = 1'b0;
            for (f = 0; f < FAULTS; f = f + 1)
                if (!found && fault_kind[4*f + 2] && addr < fault_hi[33*f +: 33]
                        && fault_lo[33*f +: 33] < addr + BYTES) begin
                    read_fault = fault_kind[4*f +: 2];
                    found = 1'b1;
                end
        end
    endfunction

    function [1:0] write_fault(input [32:0] addr);
        integer f;
        reg found;
        begin
            write_fault = OKAY;
            found = 1'b0;
            for (f = 0; f < FAULTS; f = f + 1)
                if (!found && fault_kind[4*f + 3] && addr < fault_hi[33*f +: 33]
                        && fault_lo[33*f +: 33] <= addr) begin
                    write_fault = fault_kind[4*f +: 2];
                    found = 1'b1;
                end
        end
    endfunction

    // ------------------------------------------------------------------ reads
    reg [ADDR_WIDTH-1:0] ar_addr  [0:AR_DEPTH-1];
    reg [7:0]            ar_len   [0:AR_DEPTH-1];
    reg [ID_WIDTH-1:0]   ar_id    [0:AR_DEPTH-1];
    reg [31:0]           ar_due   [0:AR_DEPTH-1];
    reg [AR_PTR:0]       ar_head = 0, ar_tail = 0;
    wire ar_empty = ar_head == ar_tail;
    wire ar_full  = (ar_head ^ ar_tail) == (1 << AR_PTR);
    assign s_arready = !ar_full && !stall_ar;

    reg                  rd_active = 0;          // a burst with beats still to send
    reg [ADDR_WIDTH-1:0] rd_addr;            // its next beat's address
    reg [8:0]            rd_left;            // its beats still to send
    reg [ID_WIDTH-1:0]   rd_id;

    wire [AR_PTR-1:0] ar_head_i = ar_head[AR_PTR-1:0];
    wire ar_head_due = !ar_empty && $signed(now - ar_due[ar_head_i]) >= 0;

    // {resp, data} of the read beat at the bus-aligned byte address `beat`.
    function [DATA_WIDTH+1:0] read_beat(input [32:0] beat);
        reg [1:0] fault;
        begin
            fault = read_fault(beat);
            if (beat + BYTES > size || beat[32:LG] >= WORDS)
                read_beat = {SLVERR, {DATA_WIDTH{1'b0}}};
            else if (fault != OKAY)
                read_beat = {fault, {BYTES{POISON}}};
            else
                read_beat = {OKAY, mem[beat[IDX+RL+LG-1:RL+LG]][lane_of(beat) * DATA_WIDTH
                                                                +: DATA_WIDTH]};
        end
    endfunction

    function [32:0] aligned(input [ADDR_WIDTH-1:0] addr);
        aligned = {{(33 - ADDR_WIDTH){1'b0}}, addr[ADDR_WIDTH-1:LG], {LG{1'b0}}};
    endfunction

    always @(posedge clk) begin
        if (rst) begin
            ar_head <= 0;
            ar_tail <= 0;
            read_draw <= xorshift(bp_seed ^ 32'h7F4A7C15);
            rd_active <= 1'b0;
            s_rvalid <= 1'b0;
            s_rlast <= 1'b0;
            s_rresp <= OKAY;
            s_rid <= 0;
            s_rdata <= 0;
        end else begin
            if (s_arvalid && s_arready) begin
                ar_addr[ar_tail[AR_PTR-1:0]] <= s_araddr;
                ar_len[ar_tail[AR_PTR-1:0]] <= s_arlen;
                ar_id[ar_tail[AR_PTR-1:0]] <= s_arid;
                ar_due[ar_tail[AR_PTR-1:0]] <= now + R_LATENCY - 1
                                               + extra_latency(read_draw);
                if (bp_enable)
                    read_draw <= xorshift(read_draw);
                ar_tail <= ar_tail + 1'b1;
            end
            if (!s_rvalid || s_rready) begin
                if (rd_active && !stall_r) begin
                    {s_rresp, s_rdata} <= read_beat(aligned(rd_addr));
                    s_rvalid <= 1'b1;
                    s_rlast <= rd_left == 9'd1;
                    rd_addr <= rd_addr + BYTES;
                    rd_left <= rd_left - 9'd1;
                    rd_active <= rd_left != 9'd1;
                end else if (!rd_active && ar_head_due && !stall_r) begin
                    {s_rresp, s_rdata} <= read_beat(aligned(ar_addr[ar_head_i]));
                    s_rvalid <= 1'b1;
                    s_rlast <= ar_len[ar_head_i] == 8'd0;
                    s_rid <= ar_id[ar_head_i];
                    rd_addr <= ar_addr[ar_head_i] + BYTES;
                    rd_left <= {1'b0, ar_len[ar_head_i]};
                    rd_id <= ar_id[ar_head_i];
                    rd_active <= ar_len[ar_head_i] != 8'd0;
                    ar_head <= ar_head + 1'b1;
                end else begin
                    s_rvalid <= 1'b0;
                end
            end
        end
    end

    // ------------------------------------------------------------------ writes
    reg [ADDR_WIDTH-1:0] aw_addr [0:AW_DEPTH-1];
    reg [7:0]            aw_len  [0:AW_DEPTH-1];
    reg [ID_WIDTH-1:0]   aw_id   [0:AW_DEPTH-1];
    reg [AW_PTR:0]       aw_head = 0, aw_tail = 0;
    wire aw_empty = aw_head == aw_tail;
    wire aw_full  = (aw_head ^ aw_tail) == (1 << AW_PTR);
    wire [AW_PTR-1:0] aw_head_i = aw_head[AW_PTR-1:0];

    reg [1:0]            b_resp_q [0:B_DEPTH-1];
    reg [ID_WIDTH-1:0]   b_id_q   [0:B_DEPTH-1];
    reg [31:0]           b_due    [0:B_DEPTH-1];
    reg [B_PTR:0]        b_head = 0, b_tail = 0;
    wire b_empty = b_head == b_tail;
    wire [B_PTR-1:0] b_head_i = b_head[B_PTR-1:0];

    // Room for a burst's response is kept when its address is taken: every accepted burst
    // (queued or answered-but-not-taken) fits in the response queue.
    wire [B_PTR:0] bursts_open = (aw_tail - aw_head) + (b_tail - b_head);
    assign s_awready = !aw_full && bursts_open < B_DEPTH && !stall_aw;
    assign s_wready  = !aw_empty && !stall_w;

    reg [2:0]  dropped = 0;                  // write beats counted for drop_writes
    reg [8:0]  wr_beat = 0;                      // beats of the head burst written so far
    reg        wr_slverr;                    // a byte of the burst fell past `size`
    reg [1:0]  wr_fault;                     // the last fault response of the burst
    reg [32:0] beat_addr;
    reg [IDX-1:0] entry;                     // the beat's memory entry
    reg [32:0] lane;                         // and its bus word in the entry
    reg [DATA_WIDTH-1:0] keep, merged;
    reg [BYTES-1:0] wrote;
    reg [1:0]  byte_fault;
    reg        beat_slverr;
    reg [1:0]  beat_fault;

    always @(posedge clk) begin
        if (rst) begin
            aw_head <= 0;
            aw_tail <= 0;
            b_head <= 0;
            b_tail <= 0;
            write_draw <= xorshift(bp_seed ^ 32'h2545F491);
            wr_beat <= 0;
            wr_slverr <= 1'b0;
            wr_fault <= OKAY;
            s_bvalid <= 1'b0;
            s_bresp <= OKAY;
            s_bid <= 0;
        end else begin
            // The bench's commands; the NPU is idle while they run.
            if (command == 3'd1)
                $readmemh("dram_load.hex", mem, 0, entries(words) - 1);
            if (command == 3'd2) begin
                $writememh("dram_dump.hex", mem, 0, entries(words) - 1);
                $writememh("dram_written.hex", written, 0, entries(words) - 1);
            end
            if (command == 3'd3)
                for (i = 0; i < entries(words); i = i + 1)
                    written[i] <= {(RATIO*BYTES){1'b0}};
            if (s_awvalid && s_awready) begin
                aw_addr[aw_tail[AW_PTR-1:0]] <= s_awaddr;
                aw_len[aw_tail[AW_PTR-1:0]] <= s_awlen;
                aw_id[aw_tail[AW_PTR-1:0]] <= s_awid;
                aw_tail <= aw_tail + 1'b1;
            end
            if (s_wvalid && s_wready) begin
                beat_addr = aligned(aw_addr[aw_head_i]) + (wr_beat << LG);
                wrote = {BYTES{1'b0}};
                beat_slverr = 1'b0;
                beat_fault = OKAY;
                for (i = 0; i < BYTES; i = i + 1) begin
                    byte_fault = write_fault(beat_addr + i);
                    if (s_wstrb[i]) begin
                        if (beat_addr + i >= size || beat_addr[32:LG] >= WORDS)
                            beat_slverr = 1'b1;
                        else if (byte_fault != OKAY)
                            beat_fault = byte_fault;
                        else
                            wrote[i] = 1'b1;
                    end
                end
                if (drop_writes) begin
                    dropped <= dropped + 3'd1;
                    if (dropped == 3'd7)
                        wrote = {BYTES{1'b0}};
                end
                if (wrote != 0) begin
                    for (i = 0; i < BYTES; i = i + 1)
                        keep[8*i +: 8] = wrote[i] ? 8'h00 : 8'hFF;
                    entry = beat_addr[IDX+RL+LG-1:RL+LG];
                    lane = lane_of(beat_addr);
                    merged = (mem[entry][lane*DATA_WIDTH +: DATA_WIDTH] & keep)
                             | (s_wdata & ~keep);
                    mem[entry][lane*DATA_WIDTH +: DATA_WIDTH] <= merged;
                    written[entry][lane*BYTES +: BYTES] <= written[entry][lane*BYTES +: BYTES]
                                                           | wrote;
                end
                if (wr_beat == {1'b0, aw_len[aw_head_i]}) begin
                    // The burst's last beat: queue its response, take the next burst.
                    b_resp_q[b_tail[B_PTR-1:0]] <= (beat_fault != OKAY) ? beat_fault
                                                   : (wr_fault != OKAY) ? wr_fault
                                                   : (wr_slverr | beat_slverr) ? SLVERR : OKAY;
                    b_id_q[b_tail[B_PTR-1:0]] <= aw_id[aw_head_i];
                    b_due[b_tail[B_PTR-1:0]] <= now + B_LATENCY - 1
                                                + extra_latency(write_draw);
                    if (bp_enable)
                        write_draw <= xorshift(write_draw);
                    b_tail <= b_tail + 1'b1;
                    aw_head <= aw_head + 1'b1;
                    wr_beat <= 0;
                    wr_slverr <= 1'b0;
                    wr_fault <= OKAY;
                end else begin
                    wr_beat <= wr_beat + 9'd1;
                    wr_slverr <= wr_slverr | beat_slverr;
                    if (beat_fault != OKAY)
                        wr_fault <= beat_fault;
                end
            end
            if (command == 3'd4 && !s_bvalid) begin
                s_bvalid <= 1'b1;
                s_bresp <= OKAY;
                s_bid <= 0;
            end else if (!s_bvalid || s_bready) begin
                if (!b_empty && $signed(now - b_due[b_head_i]) >= 0 && !stall_b) begin
                    s_bvalid <= 1'b1;
                    s_bresp <= b_resp_q[b_head_i];
                    s_bid <= b_id_q[b_head_i];
                    b_head <= b_head + 1'b1;
                end else begin
                    s_bvalid <= 1'b0;
                end
            end
        end
    end

    always @(posedge clk) begin
        if (rst)
            now <= 32'd0;
        else
            now <= now + 32'd1;
    end
endmodule

`default_nettype wire
