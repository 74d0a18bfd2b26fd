// Behavioural model of the Lattice ECP5 DP16KD block RAM, as far as hw/bram.py uses it:
// both ports the same width (DATA_WIDTH 1, 2, 4, 9 or 18; data on the low DI/DO pins, the
// word address above the bits a wide word leaves free, x18 byte enables on AD1 and AD0),
// write mode NORMAL (a port's own read data does not change while it writes), REGMODE
// NOREG or OUTREG (the output register loads with OCE), chip selects against CSDECODE,
// synchronous RST of the output (register, or address stage without one). The memory and
// the registers start at zero; INITVAL and GSR are not modelled. Port names and parameters
// follow Yosys' share/ecp5/cells_sim.v (where the primitive is a blackbox only).
//
// A read of a word that the other port writes at the same clock edge gives X, and so does a
// write of a word that the other port writes too: a design that relies on either is caught.
`timescale 1ns/1ps
module DP16KD(
    input DIA17, DIA16, DIA15, DIA14, DIA13, DIA12, DIA11, DIA10, DIA9, DIA8, DIA7, DIA6, DIA5, DIA4, DIA3, DIA2, DIA1, DIA0,
    input ADA13, ADA12, ADA11, ADA10, ADA9, ADA8, ADA7, ADA6, ADA5, ADA4, ADA3, ADA2, ADA1, ADA0,
    input CEA, OCEA, CLKA, WEA, RSTA,
    input CSA2, CSA1, CSA0,
    output DOA17, DOA16, DOA15, DOA14, DOA13, DOA12, DOA11, DOA10, DOA9, DOA8, DOA7, DOA6, DOA5, DOA4, DOA3, DOA2, DOA1, DOA0,
    input DIB17, DIB16, DIB15, DIB14, DIB13, DIB12, DIB11, DIB10, DIB9, DIB8, DIB7, DIB6, DIB5, DIB4, DIB3, DIB2, DIB1, DIB0,
    input ADB13, ADB12, ADB11, ADB10, ADB9, ADB8, ADB7, ADB6, ADB5, ADB4, ADB3, ADB2, ADB1, ADB0,
    input CEB, OCEB, CLKB, WEB, RSTB,
    input CSB2, CSB1, CSB0,
    output DOB17, DOB16, DOB15, DOB14, DOB13, DOB12, DOB11, DOB10, DOB9, DOB8, DOB7, DOB6, DOB5, DOB4, DOB3, DOB2, DOB1, DOB0
);
    parameter DATA_WIDTH_A = 18;
    parameter DATA_WIDTH_B = 18;
    parameter REGMODE_A = "NOREG";
    parameter REGMODE_B = "NOREG";
    parameter RESETMODE = "SYNC";
    parameter ASYNC_RESET_RELEASE = "SYNC";
    parameter CSDECODE_A = "0b000";
    parameter CSDECODE_B = "0b000";
    parameter WRITEMODE_A = "NORMAL";
    parameter WRITEMODE_B = "NORMAL";
    parameter GSR = "ENABLED";

    localparam SHIFT = DATA_WIDTH_A == 1 ? 0 : DATA_WIDTH_A == 2 ? 1 : DATA_WIDTH_A == 4 ? 2 :
                       DATA_WIDTH_A == 9 ? 3 : 4;
    localparam ROWS = 16384 >> SHIFT;
    // "0b101": the last bit of each character's code is the bit it stands for.
    localparam [2:0] SELECT_A = {CSDECODE_A[16], CSDECODE_A[8], CSDECODE_A[0]};
    localparam [2:0] SELECT_B = {CSDECODE_B[16], CSDECODE_B[8], CSDECODE_B[0]};

    initial begin
        if (DATA_WIDTH_A != DATA_WIDTH_B || !(DATA_WIDTH_A == 1 || DATA_WIDTH_A == 2 ||
                DATA_WIDTH_A == 4 || DATA_WIDTH_A == 9 || DATA_WIDTH_A == 18)) begin
            $display("DP16KD model: DATA_WIDTH_A = DATA_WIDTH_B of 1, 2, 4, 9 or 18 only, not %0d and %0d",
                     DATA_WIDTH_A, DATA_WIDTH_B);
            $finish;
        end
        if (WRITEMODE_A != "NORMAL" || WRITEMODE_B != "NORMAL" || RESETMODE != "SYNC") begin
            $display("DP16KD model: WRITEMODE NORMAL and RESETMODE SYNC only");
            $finish;
        end
    end

    wire [17:0] dia = {DIA17, DIA16, DIA15, DIA14, DIA13, DIA12, DIA11, DIA10, DIA9, DIA8, DIA7, DIA6, DIA5, DIA4, DIA3, DIA2, DIA1, DIA0};
    wire [17:0] dib = {DIB17, DIB16, DIB15, DIB14, DIB13, DIB12, DIB11, DIB10, DIB9, DIB8, DIB7, DIB6, DIB5, DIB4, DIB3, DIB2, DIB1, DIB0};
    wire [13:0] ada = {ADA13, ADA12, ADA11, ADA10, ADA9, ADA8, ADA7, ADA6, ADA5, ADA4, ADA3, ADA2, ADA1, ADA0};
    wire [13:0] adb = {ADB13, ADB12, ADB11, ADB10, ADB9, ADB8, ADB7, ADB6, ADB5, ADB4, ADB3, ADB2, ADB1, ADB0};
    wire [13:0] row_a = ada >> SHIFT;
    wire [13:0] row_b = adb >> SHIFT;
    // Which bits of the word a write changes: x18 has a byte enable for each half.
    wire [17:0] mask_a = DATA_WIDTH_A == 18 ? {{9{ADA1}}, {9{ADA0}}} : {18{1'b1}};
    wire [17:0] mask_b = DATA_WIDTH_B == 18 ? {{9{ADB1}}, {9{ADB0}}} : {18{1'b1}};
    wire enabled_a = CEA && {CSA2, CSA1, CSA0} == SELECT_A;
    wire enabled_b = CEB && {CSB2, CSB1, CSB0} == SELECT_B;

    reg [17:0] memory [0:ROWS-1];
    reg [17:0] stage_a = 18'd0, stage_b = 18'd0;      // the address stage's word
    reg [17:0] output_a = 18'd0, output_b = 18'd0;    // the output registers
    // What each port did at which edge, for the collision checks.
    time read_time_a = ~64'd0, write_time_a = ~64'd0, read_time_b = ~64'd0, write_time_b = ~64'd0;
    reg [13:0] read_row_a, write_row_a, read_row_b, write_row_b;
    integer row;
    initial for (row = 0; row < ROWS; row = row + 1) memory[row] = 18'd0;

    // Writes and the latch updates are non-blocking, reads of the array blocking: a read sees
    // the array as it was before the edge whichever port's block runs first, and the X of a
    // collision is scheduled after the read's word either way.
    always @(posedge CLKA) begin
        if (enabled_a && WEA) begin
            write_time_a = $time;
            write_row_a = row_a;
            memory[row_a] <= (memory[row_a] & ~mask_a) | (dia & mask_a);
            if (write_time_b == $time && write_row_b == row_a)
                memory[row_a] <= 18'bx;
            if (read_time_b == $time && read_row_b == row_a)
                stage_b <= 18'bx;
        end else if (enabled_a) begin
            read_time_a = $time;
            read_row_a = row_a;
            stage_a <= (write_time_b == $time && write_row_b == row_a) ? 18'bx : memory[row_a];
        end
        if (REGMODE_A == "NOREG" && RSTA)
            stage_a <= 18'd0;
        if (RSTA)
            output_a <= 18'd0;
        else if (OCEA)
            output_a <= stage_a;
    end

    always @(posedge CLKB) begin
        if (enabled_b && WEB) begin
            write_time_b = $time;
            write_row_b = row_b;
            memory[row_b] <= (memory[row_b] & ~mask_b) | (dib & mask_b);
            if (write_time_a == $time && write_row_a == row_b)
                memory[row_b] <= 18'bx;
            if (read_time_a == $time && read_row_a == row_b)
                stage_a <= 18'bx;
        end else if (enabled_b) begin
            read_time_b = $time;
            read_row_b = row_b;
            stage_b <= (write_time_a == $time && write_row_a == row_b) ? 18'bx : memory[row_b];
        end
        if (REGMODE_B == "NOREG" && RSTB)
            stage_b <= 18'd0;
        if (RSTB)
            output_b <= 18'd0;
        else if (OCEB)
            output_b <= stage_b;
    end

    wire [17:0] doa = REGMODE_A == "OUTREG" ? output_a : stage_a;
    wire [17:0] dob = REGMODE_B == "OUTREG" ? output_b : stage_b;
    // Pins above the port's width read 0.
    wire [17:0] width_mask = DATA_WIDTH_A == 18 ? 18'h3ffff : (18'd1 << DATA_WIDTH_A) - 18'd1;
    assign {DOA17, DOA16, DOA15, DOA14, DOA13, DOA12, DOA11, DOA10, DOA9, DOA8, DOA7, DOA6, DOA5, DOA4, DOA3, DOA2, DOA1, DOA0} = doa & width_mask;
    assign {DOB17, DOB16, DOB15, DOB14, DOB13, DOB12, DOB11, DOB10, DOB9, DOB8, DOB7, DOB6, DOB5, DOB4, DOB3, DOB2, DOB1, DOB0} = dob & width_mask;
endmodule
