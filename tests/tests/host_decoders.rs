//! The GPU block decoders' own code, built for the host by clang (the host prelude), against
//! the CPU reference: every supported type's `strata_dequant32_<type>` value for value, and
//! the int8-dot decoders `strata_dot32_<type>` (and the int8 GEMM's, `ops::gemm::q8_decoder`)
//! against the reference weights' dot product with int8 activations, and the matrix-unit
//! fragments `strata_frag8_<type>` (each lane's bytes, its halves' scales and offset) against the
//! reference weights. A decoder bug shows here, in CI, before any device runs it.

use std::collections::BTreeSet;
use std::process::Command;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_compiler::emit;
use strata_compiler::ops::gemm::q8_decoder_terms;
use strata_compiler::plan::rules::{INT8_DOT, MMA_FRAGMENTS, fragment_zero};
use strata_compiler::quant::{GgmlType, SUPPORTED, random_blocks};
use strata_tests::toolchain;

type Dequant = unsafe extern "C" fn(*const u8, u32, *mut f32);
type Dot = unsafe extern "C" fn(*const u8, u32, *const i32, i32) -> f32;
type Frag = unsafe extern "C" fn(*const u8, u32, u32, *mut u32, *mut f32);

#[test]
fn gpu_decoders_match_the_cpu_reference_on_the_host() {
    let Some(tools) = toolchain() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let types: BTreeSet<GgmlType> = SUPPORTED.into_iter().collect();
    let source = emit::host_decoders(&types).expect("renders");
    let src = dir.path().join("decoders.cpp");
    std::fs::write(&src, source).expect("written");
    // The host's own loads, and the GPUs' aligned loads and funnel shifts (for the
    // decoders whose blocks alternate 4-byte alignment; the others read aligned vectors
    // the host's test rows do not promise).
    let build = |name: &str, define: &[&str]| {
        let lib = dir.path().join(name);
        let out = Command::new(&tools.clang)
            .args(["-x", "c++", "-std=c++17", "-O2", "-shared", "-fPIC", "-fuse-ld=lld"])
            .args(define)
            .arg("-o")
            .arg(&lib)
            .arg(&src)
            .output()
            .expect("clang runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        // SAFETY: the library is the one just built from strata's own decoders; loading runs
        // no initializers beyond the C++ runtime's.
        unsafe { libloading::Library::new(&lib) }.expect("loads")
    };
    let lib = build("libdecoders.so", &[]);
    // Misaligned loads trap there, as on a GPU (this CPU would load them).
    let aligned =
        build("libaligned.so", &["-DSTRATA_UNALIGNED_LOADS=0", "-fsanitize=alignment", "-fsanitize-trap=alignment"]);

    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for ty in SUPPORTED {
        let name = ty.name().to_ascii_lowercase();
        let cols = ty.block_len().max(256);
        let row_bytes = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
        let rows = 16;
        let mut blocks = vec![0u8; rows * row_bytes];
        random_blocks(ty, &mut rng, &mut blocks, 1.0).expect("random blocks");
        let mut reference = vec![0f32; rows * cols];
        ty.dequantize(&blocks, &mut reference).expect("dequantizes");
        // SAFETY: the symbols are the extern "C" entry points host_decoders writes, with
        // these signatures.
        let dequant =
            unsafe { lib.get::<Dequant>(format!("strata_host_dequant32_{name}").as_bytes()) }.expect("dequant entry");
        let dots = INT8_DOT.contains(&ty).then(|| {
            // SAFETY: as above.
            let entry = |kind: &str| unsafe { lib.get::<Dot>(format!("strata_host_{kind}_{name}").as_bytes()) };
            [entry("dot32").expect("dot entry"), entry("gemm_dot32").expect("GEMM dot entry")]
        });
        let frag = MMA_FRAGMENTS.contains(&ty).then(|| {
            // SAFETY: as above.
            unsafe { lib.get::<Frag>(format!("strata_host_frag8_{name}").as_bytes()) }.expect("fragment entry")
        });
        let (offset, halves) = q8_decoder_terms(ty);
        // Q6_K's 210-byte rows of 256 put every other row at 2 (mod 4), as its slabs are
        // in a GEMV's shared memory: its fragments by aligned loads must match.
        let aligned_frag = (ty == GgmlType::Q6_K).then(|| {
            // SAFETY: as above.
            unsafe { aligned.get::<Frag>(format!("strata_host_frag8_{name}").as_bytes()) }.expect("fragment entry")
        });
        for r in 0..rows {
            let row = &blocks[r * row_bytes..][..row_bytes];
            for c in 0..cols / 32 {
                let want = &reference[r * cols + 32 * c..][..32];
                let mut got = [0f32; 32];
                // SAFETY: `row` holds the whole row, `got` 32 floats.
                unsafe { dequant(row.as_ptr(), c as u32, got.as_mut_ptr()) };
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    assert!((g - w).abs() <= 1e-6 * w.abs().max(1e-3), "{ty} row {r} chunk {c} [{i}]: {g} vs {w}");
                }
                // Lane q's fragment: weights 4q + i (lo) and 16 + 4q + i (hi), i < 4.
                for q in 0..4u32 {
                    let Some(frag) = &frag else { break };
                    let (mut words, mut terms) = ([0u32; 5], [0f32; 3]);
                    // SAFETY: `row` holds the whole row; `words` and `terms` what the entry writes.
                    unsafe { frag(row.as_ptr(), c as u32, q, words.as_mut_ptr(), terms.as_mut_ptr()) };
                    if let Some(aligned_frag) = &aligned_frag {
                        let (mut by_words, mut by_terms) = ([0u32; 5], [0f32; 3]);
                        // SAFETY: as above.
                        unsafe {
                            aligned_frag(row.as_ptr(), c as u32, q, by_words.as_mut_ptr(), by_terms.as_mut_ptr())
                        };
                        let at = row.as_ptr() as usize % 4;
                        assert_eq!(
                            (by_words, by_terms),
                            (words, terms),
                            "{ty} row {r} (at {at} mod 4) chunk {c} lane {q}"
                        );
                    }
                    let ([lo, hi, z, signed_lo, signed_hi], [d, m, d2]) = (words, terms);
                    assert!(offset || m == 0.0, "{ty} row {r} chunk {c}: offset {m} in a type without");
                    assert!(halves || d2 == d, "{ty} row {r} chunk {c}: one scale a chunk, yet d2 {d2} != d {d}");
                    assert_eq!(z, fragment_zero(ty).unwrap_or(0), "{ty}: the fragment's zero point is the rule's");
                    // The bytes as stored with their zero point, and with it taken out.
                    for (words, zero) in [([lo, hi], z), ([signed_lo, signed_hi], 0)] {
                        for (half, word) in words.into_iter().enumerate() {
                            for (i, byte) in word.to_le_bytes().into_iter().enumerate() {
                                let k = 16 * half + 4 * q as usize + i;
                                let value =
                                    if zero == 0 { i32::from(byte as i8) } else { i32::from(byte) - zero as i32 };
                                let scale = if half == 0 { d } else { d2 };
                                let (g, w) = (scale * value as f32 + m, want[k]);
                                let tol = 1e-6 * (g - m).abs().max(m.abs()).max(1e-3);
                                assert!(
                                    (g - w).abs() <= tol,
                                    "{ty} fragment (zero {zero}), row {r} chunk {c} [{k}]: {g} vs {w}"
                                );
                                assert!(
                                    zero == 0 || byte < 128,
                                    "{ty}: a byte with a zero point is a non-negative int8"
                                );
                            }
                        }
                    }
                }
                let Some(dots) = &dots else { continue };
                // The decoders load the activations as aligned 16-byte vectors.
                #[repr(align(16))]
                struct Quants([i8; 32]);
                let mut q = Quants([0; 32]);
                q.0.iter_mut().for_each(|v| *v = rng.random_range(-127..=127));
                let qsum: i32 = q.0.iter().map(|&v| i32::from(v)).sum();
                let exact: f64 = want.iter().zip(&q.0).map(|(&w, &v)| f64::from(w) * f64::from(v)).sum();
                let scale: f64 = want.iter().zip(&q.0).map(|(&w, &v)| (f64::from(w) * f64::from(v)).abs()).sum();
                for (dot, what) in dots.iter().zip(["GEMV", "GEMM"]) {
                    // SAFETY: as above; `q` is 32 int8 quants, 16-byte aligned.
                    let got = f64::from(unsafe { dot(row.as_ptr(), c as u32, q.0.as_ptr().cast(), qsum) });
                    let close = (got - exact).abs() <= 1e-5 * scale.max(1e-6);
                    assert!(close, "{ty} {what} decoder, row {r} chunk {c}: {got} vs {exact}");
                }
            }
        }
    }
}
