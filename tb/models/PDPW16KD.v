// Behavioural model of the Lattice ECP5 PDPW16KD block RAM (the pseudo-dual-port 512x36
// form of the DP16KD), as far as hw/bram.py uses it: a 36-bit write port (ADW, byte enables
// BE3..BE0 for DI[35:27] .. DI[8:0], CEW) and a 36-bit read port (word address on ADR13..ADR5,
// CER), REGMODE NOREG or OUTREG (the output register loads with OCER), chip selects against
// CSDECODE_W / CSDECODE_R, synchronous RST of the output. The memory and the registers start
// at zero; INITVAL and GSR are not modelled. Port names and parameters follow Yosys'
// share/ecp5/cells_bb.v (where the primitive is a blackbox only).
//
// A read of the word written at the same clock edge gives X: a design that relies on it is
// caught.
`timescale 1ns/1ps
module PDPW16KD(
    input DI35, DI34, DI33, DI32, DI31, DI30, DI29, DI28, DI27, DI26, DI25, DI24, DI23, DI22, DI21, DI20, DI19, DI18,
    input DI17, DI16, DI15, DI14, DI13, DI12, DI11, DI10, DI9, DI8, DI7, DI6, DI5, DI4, DI3, DI2, DI1, DI0,
    input ADW8, ADW7, ADW6, ADW5, ADW4, ADW3, ADW2, ADW1, ADW0,
    input BE3, BE2, BE1, BE0, CEW, CLKW, CSW2, CSW1, CSW0,
    input ADR13, ADR12, ADR11, ADR10, ADR9, ADR8, ADR7, ADR6, ADR5, ADR4, ADR3, ADR2, ADR1, ADR0,
    input CER, OCER, CLKR, CSR2, CSR1, CSR0, RST,
    output DO35, DO34, DO33, DO32, DO31, DO30, DO29, DO28, DO27, DO26, DO25, DO24, DO23, DO22, DO21, DO20, DO19, DO18,
    output DO17, DO16, DO15, DO14, DO13, DO12, DO11, DO10, DO9, DO8, DO7, DO6, DO5, DO4, DO3, DO2, DO1, DO0
);
    parameter DATA_WIDTH_W = 36;
    parameter DATA_WIDTH_R = 36;
    parameter GSR = "ENABLED";
    parameter REGMODE = "NOREG";
    parameter RESETMODE = "SYNC";
    parameter ASYNC_RESET_RELEASE = "SYNC";
    parameter CSDECODE_W = "0b000";
    parameter CSDECODE_R = "0b000";

    // "0b101": the last bit of each character's code is the bit it stands for.
    localparam [2:0] SELECT_W = {CSDECODE_W[16], CSDECODE_W[8], CSDECODE_W[0]};
    localparam [2:0] SELECT_R = {CSDECODE_R[16], CSDECODE_R[8], CSDECODE_R[0]};

    initial begin
        if (DATA_WIDTH_W != 36 || DATA_WIDTH_R != 36 || RESETMODE != "SYNC") begin
            $display("PDPW16KD model: DATA_WIDTH_W = DATA_WIDTH_R = 36 and RESETMODE SYNC only");
            $finish;
        end
    end

    wire [35:0] di = {DI35, DI34, DI33, DI32, DI31, DI30, DI29, DI28, DI27, DI26, DI25, DI24, DI23, DI22, DI21, DI20, DI19, DI18,
                      DI17, DI16, DI15, DI14, DI13, DI12, DI11, DI10, DI9, DI8, DI7, DI6, DI5, DI4, DI3, DI2, DI1, DI0};
    wire [8:0] write_row = {ADW8, ADW7, ADW6, ADW5, ADW4, ADW3, ADW2, ADW1, ADW0};
    wire [8:0] read_row = {ADR13, ADR12, ADR11, ADR10, ADR9, ADR8, ADR7, ADR6, ADR5};
    wire [35:0] mask = {{9{BE3}}, {9{BE2}}, {9{BE1}}, {9{BE0}}};
    wire write_enabled = CEW && {CSW2, CSW1, CSW0} == SELECT_W;
    wire read_enabled = CER && {CSR2, CSR1, CSR0} == SELECT_R;

    reg [35:0] memory [0:511];
    reg [35:0] stage = 36'd0, out = 36'd0;
    time read_time = ~64'd0, write_time = ~64'd0;
    reg [8:0] last_read_row, last_write_row;
    integer row;
    initial for (row = 0; row < 512; row = row + 1) memory[row] = 36'd0;

    // As in the DP16KD model: non-blocking updates, blocking reads of the array, so that a
    // read sees the array as it was before the edge and a collision ends in X either way.
    always @(posedge CLKW) begin
        if (write_enabled && mask != 36'd0) begin
            write_time = $time;
            last_write_row = write_row;
            memory[write_row] <= (memory[write_row] & ~mask) | (di & mask);
            if (read_time == $time && last_read_row == write_row)
                stage <= 36'bx;
        end
    end

    always @(posedge CLKR) begin
        if (read_enabled) begin
            read_time = $time;
            last_read_row = read_row;
            stage <= (write_time == $time && last_write_row == read_row) ? 36'bx : memory[read_row];
        end
        if (REGMODE == "NOREG" && RST)
            stage <= 36'd0;
        if (RST)
            out <= 36'd0;
        else if (OCER)
            out <= stage;
    end

    assign {DO35, DO34, DO33, DO32, DO31, DO30, DO29, DO28, DO27, DO26, DO25, DO24, DO23, DO22, DO21, DO20, DO19, DO18,
            DO17, DO16, DO15, DO14, DO13, DO12, DO11, DO10, DO9, DO8, DO7, DO6, DO5, DO4, DO3, DO2, DO1, DO0}
        = REGMODE == "OUTREG" ? out : stage;
endmodule
