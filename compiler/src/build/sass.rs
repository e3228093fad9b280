//! What a kernel's hottest loop issues, read from its SASS (`cuobjdump -sass` of the cubin
//! ptxas makes): the instructions a weight costs, without a GPU. A GEMV streaming weights at
//! the memory's rate has an issue budget a weight (about two slots on an H200 for a
//! 2-bit type); this count says whether a decoder fits it before any device runs it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The innermost loop with the most matrix-unit instructions, else the most int8 dots
/// (the shortest such loop where several tie): a product's chunk loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotLoop {
    /// Instructions in the loop body, the backward branch included.
    pub instructions: u32,
    /// Four-way int8 dots (`IDP`): one a lane per four weights of one column.
    pub dots: u32,
    /// Weights (rows x depth, 16 · k for an m16nNk`k` instruction) the loop's matrix-unit
    /// instructions take, per eight columns.
    pub matrix_weights: u32,
}

impl HotLoop {
    /// Instructions a lane issues per weight, for a product of `columns` input columns:
    /// the loop's instructions over the weights each lane's pass covers (a dot's four,
    /// once a column; a matrix instruction's share, once per tile of eight columns).
    /// `None` for a loop of neither (a float dot, whose multiply-adds also scale).
    pub fn slots_per_weight(&self, columns: u32) -> Option<f64> {
        let columns = f64::from(columns.max(1));
        let lane_weights = if self.matrix_weights > 0 {
            f64::from(self.matrix_weights) / 32.0 / (columns / 8.0).ceil()
        } else if self.dots > 0 {
            4.0 * f64::from(self.dots) / columns
        } else {
            return None;
        };
        Some(f64::from(self.instructions) / lane_weights)
    }
}

/// One SASS instruction: its address and opcode (guard and modifiers dropped), and for a
/// branch its target.
struct Instruction<'a> {
    at: u64,
    opcode: &'a str,
    modifiers: &'a str,
    target: Option<u64>,
}

/// Each function's hot loop in `cuobjdump -sass` text, by name; functions without a loop
/// of matrix or dot instructions are left out.
pub fn hot_loops(sass: &str) -> BTreeMap<String, HotLoop> {
    let mut out = BTreeMap::new();
    let mut sections = sass.split("Function : ").skip(1);
    for section in sections.by_ref() {
        let (name, body) = section.split_once('\n').unwrap_or((section, ""));
        let code: Vec<Instruction<'_>> = body.lines().filter_map(instruction).collect();
        if let Some(hot) = hottest(&code) {
            out.insert(name.trim().to_owned(), hot);
        }
    }
    out
}

/// `/*0c40*/  @!P1 LDG.E.CONSTANT R128, desc[UR6][R62.64+-0x10] ;` → an instruction;
/// encoding lines (`/* 0x... */` alone) → none.
fn instruction(line: &str) -> Option<Instruction<'_>> {
    let rest = line.trim_start().strip_prefix("/*")?;
    let (address, rest) = rest.split_once("*/")?;
    let at = u64::from_str_radix(address, 16).ok()?;
    let mut words = rest.split_whitespace();
    let mut word = words.next()?;
    if word.starts_with('@') {
        word = words.next()?;
    }
    let (opcode, modifiers) = word.split_once('.').unwrap_or((word, ""));
    if !opcode.starts_with(|c: char| c.is_ascii_uppercase()) {
        return None;
    }
    let target = (opcode == "BRA")
        .then(|| {
            words.find_map(|w| w.strip_prefix("0x").and_then(|h| u64::from_str_radix(h.trim_end_matches(';'), 16).ok()))
        })
        .flatten();
    Some(Instruction { at, opcode, modifiers, target })
}

/// The hot loop among the backward branches' bodies.
fn hottest(code: &[Instruction<'_>]) -> Option<HotLoop> {
    let mut best: Option<HotLoop> = None;
    for end in code {
        let Some(start) = end.target.filter(|&t| t < end.at) else { continue };
        let body = code.iter().filter(|i| (start..=end.at).contains(&i.at));
        let mut hot = HotLoop { instructions: 0, dots: 0, matrix_weights: 0 };
        for i in body {
            hot.instructions += 1;
            hot.dots += u32::from(i.opcode == "IDP");
            hot.matrix_weights += matrix_weights(i.opcode, i.modifiers);
        }
        let key = |h: &HotLoop| (h.matrix_weights, h.dots, std::cmp::Reverse(h.instructions));
        if (hot.matrix_weights > 0 || hot.dots > 0) && best.is_none_or(|b| key(&hot) > key(&b)) {
            best = Some(hot);
        }
    }
    best
}

/// Weights one matrix-unit instruction takes: 16 rows times its depth (`IMMA.16832` →
/// k = 32), or 0 for any other instruction.
fn matrix_weights(opcode: &str, modifiers: &str) -> u32 {
    if !matches!(opcode, "HMMA" | "IMMA") {
        return 0;
    }
    // The shape is m n k run together: 16816 → 16, 8, 16; 16832 → 16, 8, 32; 1688 → 16, 8, 8.
    let shape = modifiers.split('.').next().unwrap_or_default();
    shape.strip_prefix("168").and_then(|k| k.parse::<u32>().ok()).map_or(0, |k| 16 * k)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cuobjdump's layout: a function header, then each instruction's line with its
    /// address and the encoding's second word on a line of its own.
    const SASS: &str = "\tcode for sm_90\n\
        \t\tFunction : gemv_iq2_xs_14336x4096\n\
        \t.headerflags\t@\"EF_CUDA_SM90\"\n\
        \x20       /*0000*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */\n\
        \x20                                                        /* 0x000e700000000800 */\n\
        \x20       /*0010*/                   LDS.64 R4, [R2] ;        /* 0x0000000002047984 */\n\
        \x20       /*0020*/                   LOP3.LUT R5, R4, 0xff, RZ, 0xc0, !PT ;\n\
        \x20       /*0030*/                   IDP.4A.S8.S8 R6, R5, R7, R6 ;\n\
        \x20       /*0040*/                   IDP.4A.S8.S8 R6, R4, R8, R6 ;\n\
        \x20       /*0050*/              @!P0 BRA 0x10 ;\n\
        \x20       /*0060*/                   STS [R3], R9 ;\n\
        \x20       /*0070*/                   BRA 0x60 ;\n\
        \x20       /*0080*/                   EXIT ;\n\
        \t\tFunction : gemv_mma_t8\n\
        \x20       /*0000*/                   LDS R4, [R2] ;\n\
        \x20       /*0010*/                   IMMA.16832.S8.S8 R8, R4.ROW, R6.COL, R8 ;\n\
        \x20       /*0020*/                   FFMA R9, R8, R10, R9 ;\n\
        \x20       /*0030*/                   HMMA.16816.F32 R12, R4, R6, R12 ;\n\
        \x20       /*0040*/                   BRA 0x0 ;\n\
        \t\tFunction : argmax_256\n\
        \x20       /*0000*/                   FMNMX R1, R2, R3, !PT ;\n\
        \x20       /*0010*/                   BRA 0x0 ;\n";

    #[test]
    fn the_hot_loop_of_each_function() {
        let loops = hot_loops(SASS);
        // 0x10..=0x50: five instructions, two dots; the later loop (0x60..=0x70) has none.
        assert_eq!(loops["gemv_iq2_xs_14336x4096"], HotLoop { instructions: 5, dots: 2, matrix_weights: 0 });
        assert_eq!(loops["gemv_mma_t8"], HotLoop { instructions: 5, dots: 0, matrix_weights: 16 * 32 + 16 * 16 });
        assert!(!loops.contains_key("argmax_256"), "a loop of neither dots nor products is no product's");
    }

    #[test]
    fn issue_slots_a_weight() {
        // One column: each dot takes four weights a lane.
        let dots = HotLoop { instructions: 10, dots: 2, matrix_weights: 0 };
        assert_eq!(dots.slots_per_weight(1), Some(10.0 / 8.0));
        // Two columns share each weight's two dots.
        assert_eq!(dots.slots_per_weight(2), Some(10.0 / 4.0));
        // An m16n8k32 a tile of eight columns: 512 weights over 32 lanes, once for 1-8 columns.
        let mma = HotLoop { instructions: 32, dots: 0, matrix_weights: 2 * 512 };
        assert_eq!(mma.slots_per_weight(8), Some(1.0));
        assert_eq!(mma.slots_per_weight(16), Some(2.0), "two tiles: each weight in two products");
        assert_eq!(HotLoop { instructions: 9, dots: 0, matrix_weights: 0 }.slots_per_weight(1), None);
    }
}
