//! Uploading a pack's tensors to a backend, once, with progress: norms and biases as
//! f32 whatever the pack stores, projections as their raw blocks (read in place from the
//! pack's mapping on the CPU backends), and the projections a decode step fuses (Q·K·V,
//! gate·up) stacked in one buffer that both the fused and the separate products read:
//! the pack's own bytes where it stores them adjacent, else a copy (none on the CPU,
//! which then runs the separate products).

use strata_compiler::ops::{self, Op};
use strata_compiler::pack::Pack;
use strata_compiler::plan;
use strata_compiler::quant::GgmlType;

use super::weights::Weight;
use crate::backend::{Backend, RunError};
use crate::kernels::Kernels;

/// Uploads tensors and reports bytes done.
pub(super) struct Uploader<'a> {
    pub pack: &'a Pack,
    pub done: u64,
    pub total: u64,
    pub progress: &'a mut dyn FnMut(u64, u64),
}

impl Uploader<'_> {
    /// One tensor in a buffer of its own.
    pub fn one(&mut self, b: &mut dyn Backend, name: &str) -> Result<Weight, RunError> {
        let t = self.pack.tensor(name).ok_or_else(|| RunError::Other(format!("tensor {name} is missing")))?;
        let data = self.pack.data(t);
        let cols = t.shape.first().copied().unwrap_or(1) as u32;
        let rows = t.shape.iter().skip(1).product::<u64>() as u32;
        let (buf, ty) = if t.shape.len() == 1 && t.ty != GgmlType::F32 {
            let mut f = vec![0f32; cols as usize];
            t.ty.dequantize(data, &mut f).map_err(|e| RunError::Other(format!("tensor {name}: {e}")))?;
            let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
            let buf = b.alloc(bytes.len())?;
            b.write(buf, 0, &bytes)?;
            (buf, GgmlType::F32)
        } else {
            let shared = self.pack.shared(&[t]).ok_or_else(|| RunError::Other(format!("tensor {name}: no bytes")))?;
            (b.alloc_weights(shared)?, t.ty)
        };
        self.advance(t.bytes);
        Ok(Weight { buf, offset: 0, ty, cols, rows })
    }

    /// Two 1-D tensors as f32, side by side in one buffer (qwen3's query and key norms,
    /// which one launch applies): each one's view, then both.
    pub fn norm_pair(&mut self, b: &mut dyn Backend, names: [&str; 2]) -> Result<[Weight; 3], RunError> {
        let mut floats = Vec::new();
        let mut cols = 0;
        for name in names {
            let t = self.pack.tensor(name).ok_or_else(|| RunError::Other(format!("tensor {name} is missing")))?;
            cols = t.shape.first().copied().unwrap_or(1) as usize;
            let mut f = vec![0f32; cols];
            t.ty.dequantize(self.pack.data(t), &mut f).map_err(|e| RunError::Other(format!("tensor {name}: {e}")))?;
            floats.extend(f);
            self.advance(t.bytes);
        }
        if floats.len() != 2 * cols {
            return Err(RunError::Other(format!("tensors {} and {} differ in length", names[0], names[1])));
        }
        let bytes: Vec<u8> = floats.iter().flat_map(|v| v.to_le_bytes()).collect();
        let buf = b.alloc(bytes.len())?;
        b.write(buf, 0, &bytes)?;
        let part = |offset, rows| Weight { buf, offset, ty: GgmlType::F32, cols: cols as u32, rows };
        Ok([part(0, 1), part(cols * 4, 1), part(0, 2)])
    }

    /// A tensor only some families have.
    pub fn optional(&mut self, b: &mut dyn Backend, name: &str, wanted: bool) -> Result<Option<Weight>, RunError> {
        if wanted { self.one(b, name).map(Some) } else { Ok(None) }
    }

    /// `names` stacked by rows in one buffer, when the artifacts have the fused product
    /// over them: each tensor's view, then the fused one. `None` uploads nothing.
    pub fn stacked(
        &mut self,
        b: &mut dyn Backend,
        kernels: &Kernels,
        names: &[String],
    ) -> Result<Option<Vec<Weight>>, RunError> {
        let tensors: Vec<_> = names.iter().filter_map(|n| self.pack.tensor(n)).collect();
        if tensors.len() != names.len() {
            return Ok(None);
        }
        let Some(Op::Gemv(ops::Gemv { quant, rows, cols, .. })) =
            plan::fused_gemv(&tensors).filter(|op| kernels.has(op))
        else {
            return Ok(None);
        };
        let buf = match self.pack.shared(&tensors) {
            Some(adjacent) => b.alloc_weights(adjacent)?,
            // A backend that reads the pack in place runs the separate products rather
            // than hold a second copy of these weights.
            None if b.reads_in_place() => return Ok(None),
            None => {
                let bytes: Vec<u8> = tensors.iter().flat_map(|t| self.pack.data(t).iter().copied()).collect();
                let buf = b.alloc(bytes.len())?;
                b.write(buf, 0, &bytes)?;
                buf
            }
        };
        let mut offset = 0;
        let mut parts = Vec::with_capacity(tensors.len() + 1);
        for t in &tensors {
            parts.push(Weight { buf, offset, ty: t.ty, cols: t.shape[0] as u32, rows: t.shape[1] as u32 });
            offset += t.bytes as usize;
        }
        self.advance(offset as u64);
        parts.push(Weight { buf, offset: 0, ty: quant, cols, rows });
        Ok(Some(parts))
    }

    /// Tensor `i` of a stack, or the tensor on its own when there is no stack.
    pub fn part(
        &mut self,
        b: &mut dyn Backend,
        stack: &Option<Vec<Weight>>,
        i: usize,
        name: &str,
    ) -> Result<Weight, RunError> {
        match stack {
            Some(parts) => Ok(parts[i]),
            None => self.one(b, name),
        }
    }

    fn advance(&mut self, bytes: u64) {
        self.done += bytes;
        (self.progress)(self.done, self.total);
    }
}
