//! A weight's rows as its GGUF file stores them (Q8_0 or Q4_0 blocks), read in place by the
//! one-row product of a decode step. A step is bound by reading every weight once: the f32
//! values the forward pass holds are 4 bytes a parameter, these blocks 1.06 (Q8_0) or 0.56
//! (Q4_0). Each block is dequantized as it is read, to the very f32 values the dequantized
//! matrix holds (an f16 scale times a small integer is exact in f32, so no order of operations
//! can round it differently), so the product's bits are those of the f32 path.

use half::f16;

use crate::checkpoint::mmap::MappedBytes;

/// Values per block of both types.
pub(super) const BLOCK: usize = 32;
/// Rows per group of the [`Grouped`] layout: one AVX2 register's lanes.
pub(super) const GROUP: usize = 8;

/// The block types read in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockType {
    /// An f16 scale, then 32 signed bytes: `q · d`.
    Q8_0,
    /// An f16 scale, then 16 bytes of two 4-bit codes: `(q - 8) · d`, the low nibbles first.
    Q4_0,
}

impl BlockType {
    /// Bytes per block (ggml's `block_q8_0`, `block_q4_0`).
    pub(super) fn block_bytes(self) -> usize {
        match self {
            BlockType::Q8_0 => 34,
            BlockType::Q4_0 => 18,
        }
    }

    /// Code bytes of one block of one row (after the scale).
    pub(super) fn code_bytes(self) -> usize {
        match self {
            BlockType::Q8_0 => BLOCK,
            BlockType::Q4_0 => BLOCK / 2,
        }
    }

    /// One block's 32 values.
    pub(super) fn dequantize(self, b: &[u8], out: &mut [f32; BLOCK]) {
        let d = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        match self {
            BlockType::Q8_0 => {
                for (y, &q) in out.iter_mut().zip(&b[2..2 + BLOCK]) {
                    *y = f32::from(q as i8) * d;
                }
            }
            BlockType::Q4_0 => {
                let (low, high) = out.split_at_mut(BLOCK / 2);
                for ((l, h), &q) in low.iter_mut().zip(high).zip(&b[2..2 + BLOCK / 2]) {
                    *l = f32::from(i16::from(q & 0x0F) - 8) * d;
                    *h = f32::from(i16::from(q >> 4) - 8) * d;
                }
            }
        }
    }
}

/// A `[rows, cols]` weight's blocks in place in the file: row `r` of the weight (Hugging Face
/// order) is the file's row `order[r]` (llama.cpp stores Q and K with each head's rows
/// interleaved), each row `cols / 32` blocks.
#[derive(Debug, Clone)]
pub struct PackedRows {
    pub(super) ty: BlockType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    bytes: MappedBytes,
    order: Option<Vec<u32>>,
    /// The whole groups of eight rows regrouped for the SIMD product (absent: fewer than eight
    /// rows).
    pub(super) grouped: Option<std::sync::Arc<Grouped>>,
}

/// The rows' blocks regrouped so that one load serves eight rows: rows in groups of [`GROUP`]
/// (Hugging Face order; the rows after the last whole group are not here), each group's blocks
/// in depth order; a group's block is its eight rows' codes side by side per code byte (for
/// Q8_0 byte `i` is depth `i`; for Q4_0 byte `i` holds depth `i` in its low nibble and `i + 16`
/// in its high one, as the file's bytes do, each nibble `q` stored as `q - 8` in 4-bit two's
/// complement, `q ^ 8`), and its eight f16 scales as the file stores them (widened exactly to
/// f32 as they are read).
/// A decode step then reads each weight once, in order, with no transpose.
#[derive(Debug)]
pub(super) struct Grouped {
    /// `[group][block][code byte][row of the group]`.
    pub(super) codes: Vec<u8>,
    /// `[group][block][row of the group]`.
    pub(super) scales: Vec<u16>,
}

impl Grouped {
    /// Rows `0..rows / GROUP * GROUP` of `packed`, regrouped.
    fn new(packed: &PackedRows) -> Grouped {
        let (ty, blocks) = (packed.ty, packed.cols / BLOCK);
        let (size, code) = (ty.block_bytes(), ty.code_bytes());
        let groups = packed.rows / GROUP;
        let mut codes = vec![0u8; groups * blocks * code * GROUP];
        let mut scales = vec![0u16; groups * blocks * GROUP];
        for g in 0..groups {
            for r in 0..GROUP {
                let row = packed.row(g * GROUP + r);
                for b in 0..blocks {
                    let block = &row[b * size..(b + 1) * size];
                    let at = g * blocks + b;
                    scales[at * GROUP + r] = u16::from_le_bytes([block[0], block[1]]);
                    for (i, &q) in block[2..].iter().enumerate() {
                        codes[(at * code + i) * GROUP + r] = match ty {
                            BlockType::Q8_0 => q,
                            // Each nibble q becomes q - 8 in 4-bit two's complement (q ^ 8), so
                            // an arithmetic shift yields the signed value.
                            BlockType::Q4_0 => q ^ 0x88,
                        };
                    }
                }
            }
        }
        Grouped { codes, scales }
    }
}

/// An f32 weight's whole groups of [`GROUP`] rows regrouped as [`Grouped`] regroups blocks,
/// for the same SIMD product: `[group][depth][row of the group]`. Values that are all bf16
/// (the low 16 bits of every f32 zero: a bf16 checkpoint's, or an F32 file made from one) are
/// kept as those 16 bits, half the bytes a step reads, widened exactly by a shift.
#[derive(Debug)]
pub(super) enum GroupedValues {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl GroupedValues {
    /// Rows `0..rows / GROUP * GROUP` of the row-major `[rows, cols]` `values`, regrouped.
    pub(super) fn new(values: &[f32], rows: usize, cols: usize) -> GroupedValues {
        let whole = rows / GROUP * GROUP * cols;
        fn regroup<T>(values: &[f32], rows: usize, cols: usize, f: impl Fn(f32) -> T) -> Vec<T> {
            let mut out = Vec::with_capacity(rows / GROUP * GROUP * cols);
            for g in 0..rows / GROUP {
                let group = &values[g * GROUP * cols..(g + 1) * GROUP * cols];
                for t in 0..cols {
                    out.extend((0..GROUP).map(|r| f(group[r * cols + t])));
                }
            }
            out
        }
        if values[..whole].iter().all(|v| v.to_bits() & 0xFFFF == 0) {
            GroupedValues::Bf16(regroup(values, rows, cols, |v| (v.to_bits() >> 16) as u16))
        } else {
            GroupedValues::F32(regroup(values, rows, cols, |v| v))
        }
    }

    /// Values held (the whole groups' `rows × cols`).
    pub(super) fn len(&self) -> usize {
        match self {
            GroupedValues::F32(v) => v.len(),
            GroupedValues::Bf16(v) => v.len(),
        }
    }
}

impl PackedRows {
    /// `None` unless `bytes` holds exactly `rows` rows of `cols / 32` whole blocks and `order`
    /// (where given) is a permutation of the rows.
    pub fn new(
        ty: BlockType,
        rows: usize,
        cols: usize,
        bytes: MappedBytes,
        order: Option<Vec<u32>>,
    ) -> Option<PackedRows> {
        let row_bytes = (cols.is_multiple_of(BLOCK) && cols > 0)
            .then(|| (cols / BLOCK).checked_mul(ty.block_bytes()))??;
        if rows.checked_mul(row_bytes)? != bytes.as_slice().len() || u32::try_from(rows).is_err() {
            return None;
        }
        if let Some(o) = &order {
            let mut seen = vec![false; rows];
            let permutation = o.len() == rows
                && o.iter().all(|&r| {
                    let r = r as usize;
                    r < rows && !std::mem::replace(&mut seen[r], true)
                });
            if !permutation {
                return None;
            }
        }
        let mut packed = PackedRows {
            ty,
            rows,
            cols,
            bytes,
            order,
            grouped: None,
        };
        if rows >= GROUP {
            packed.grouped = Some(std::sync::Arc::new(Grouped::new(&packed)));
        }
        Some(packed)
    }

    /// Row `r`'s bytes (Hugging Face order).
    pub(super) fn row(&self, r: usize) -> &[u8] {
        let stored = self.order.as_ref().map_or(r, |o| o[r] as usize);
        let row_bytes = self.cols / BLOCK * self.ty.block_bytes();
        &self.bytes.as_slice()[stored * row_bytes..(stored + 1) * row_bytes]
    }

    /// Row `r`'s block `b` dequantized.
    pub(super) fn block(&self, r: usize, b: usize, out: &mut [f32; BLOCK]) {
        let size = self.ty.block_bytes();
        self.ty
            .dequantize(&self.row(r)[b * size..(b + 1) * size], out);
    }

    /// Row `r` dequantized whole (`cols` values).
    pub(super) fn dequantize_row(&self, r: usize) -> Vec<f32> {
        let mut out = vec![0f32; self.cols];
        let mut block = [0f32; BLOCK];
        for (b, chunk) in out.chunks_exact_mut(BLOCK).enumerate() {
            self.block(r, b, &mut block);
            chunk.copy_from_slice(&block);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::gguf::GgmlType;
    use crate::runner::native::matmul::tests::{same_bits, values};
    use crate::runner::native::matmul::{F32Matrix, Values, x_wt};

    /// Random blocks of `ty`, their scales drawn from ordinary values and the awkward ones
    /// (zero, subnormal, the largest f16, infinity, NaN).
    fn blocks(ty: BlockType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut rng = crate::kld::stats::SplitMix64::new(seed);
        let scales = [
            0x3c00u16, 0x2e66, 0xb4cd, 0x0000, 0x0001, 0x7bff, 0x7c00, 0x7e00, 0x1400,
        ];
        let n = rows * cols / BLOCK;
        let mut out = Vec::with_capacity(n * ty.block_bytes());
        for i in 0..n {
            let r = rng.next_u64();
            // Mostly ordinary scales; an awkward one every so often.
            let s = if i % 5 == 4 {
                scales[(r % 9) as usize]
            } else {
                0x2000 + (r % 0x1800) as u16
            };
            out.extend_from_slice(&s.to_le_bytes());
            for _ in 2..ty.block_bytes() {
                out.push(rng.next_u64() as u8);
            }
        }
        out
    }

    fn mapped(bytes: &[u8]) -> (tempfile::TempDir, MappedBytes) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blocks.bin");
        std::fs::write(&path, bytes).unwrap();
        let file = crate::checkpoint::mmap::MappedFile::open(&path).unwrap();
        let view = file.bytes_view(0, bytes.len()).unwrap();
        (dir, view)
    }

    fn ggml(ty: BlockType) -> GgmlType {
        match ty {
            BlockType::Q8_0 => GgmlType::Q8_0,
            BlockType::Q4_0 => GgmlType::Q4_0,
        }
    }

    #[test]
    fn blocks_dequantize_to_the_dequantizers_bits() {
        for ty in [BlockType::Q8_0, BlockType::Q4_0] {
            let (rows, cols) = (6, 96);
            let bytes = blocks(ty, rows, cols, 1);
            let want =
                crate::runner::native::gguf::dequantize_bytes(ggml(ty), &bytes, &[rows, cols])
                    .unwrap();
            let (_dir, view) = mapped(&bytes);
            let p = PackedRows::new(ty, rows, cols, view, None).unwrap();
            for r in 0..rows {
                let got = p.dequantize_row(r);
                assert!(
                    same_bits(&got, &want[r * cols..(r + 1) * cols]),
                    "{ty:?} row {r}"
                );
            }
        }
    }

    /// The one-row product on the blocks gives the bits of the product on the dequantized
    /// values: depths one chain long and cut in blocks (288 + 288; 400 + 400, whose cut falls
    /// inside a quant block), output counts with and without a partial tile, 1 to 3 threads,
    /// rows in file order and permuted.
    #[test]
    fn the_packed_product_is_the_f32_products_bits() {
        for ty in [BlockType::Q8_0, BlockType::Q4_0] {
            for (n, k) in [(8, 64), (37, 256), (200, 576), (96, 800), (40, 1568)] {
                let bytes = blocks(ty, n, k, n as u64 + k as u64);
                let stored =
                    crate::runner::native::gguf::dequantize_bytes(ggml(ty), &bytes, &[n, k])
                        .unwrap();
                // Rows in reverse file order (a permutation the product must follow).
                let orders = [None, Some((0..n as u32).rev().collect::<Vec<_>>())];
                for order in orders {
                    let values: Vec<f32> = match &order {
                        None => stored.clone(),
                        Some(o) => o
                            .iter()
                            .flat_map(|&r| stored[r as usize * k..(r as usize + 1) * k].to_vec())
                            .collect(),
                    };
                    let (_dir, view) = mapped(&bytes);
                    let p = PackedRows::new(ty, n, k, view, order.clone()).unwrap();
                    let m = F32Matrix::new(n, k, Values::Owned(values.clone()))
                        .unwrap()
                        .with_packed(Some(p))
                        .unwrap();
                    let x = values_row(k);
                    let mut want = vec![0f32; n];
                    x_wt(&x, 1, k, &values, n, &mut want);
                    for threads in [1, 2, 3] {
                        let pool = rayon::ThreadPoolBuilder::new()
                            .num_threads(threads)
                            .build()
                            .unwrap();
                        let mut got = Vec::new();
                        let xt = candle_core::Tensor::from_vec(
                            x.clone(),
                            (1, k),
                            &candle_core::Device::Cpu,
                        )
                        .unwrap();
                        pool.install(|| m.apply_into(&xt, &mut got)).unwrap();
                        let same = same_bits(&got, &want);
                        assert!(
                            same,
                            "{ty:?} [{n}, {k}], order {}, {threads} threads",
                            order.is_some()
                        );
                    }
                }
            }
        }
    }

    fn values_row(k: usize) -> Vec<f32> {
        values(k, 9)
    }

    /// The grouped layout holds every whole group's weights where the SIMD tile reads them:
    /// code byte `i` of a group's block, lane `r`, is row `r`'s (depth `i`, or depths `i` and
    /// `i + 16` for Q4_0), its scale the row's block's, in permuted order too.
    #[test]
    fn grouped_codes_are_the_rows_weights() {
        for ty in [BlockType::Q8_0, BlockType::Q4_0] {
            let (n, k) = (21, 96);
            let bytes = blocks(ty, n, k, 11);
            let (_dir, view) = mapped(&bytes);
            let order: Vec<u32> = (0..n as u32).map(|r| (r * 5) % n as u32).collect();
            let p = PackedRows::new(ty, n, k, view, Some(order)).unwrap();
            let g = p.grouped.as_deref().unwrap();
            let (blocks, code) = (k / BLOCK, ty.code_bytes());
            assert_eq!(g.codes.len(), n / GROUP * blocks * code * GROUP);
            for row in 0..n / GROUP * GROUP {
                let want = p.dequantize_row(row);
                let (group, r) = (row / GROUP, row % GROUP);
                for (t, want) in want.iter().enumerate() {
                    let (b, d) = (t / BLOCK, t % BLOCK);
                    let at = group * blocks + b;
                    let byte = g.codes[(at * code + d % code) * GROUP + r];
                    // Q4_0's nibbles are stored as q ^ 8.
                    let byte = if ty == BlockType::Q4_0 {
                        byte ^ 0x88
                    } else {
                        byte
                    };
                    let q = match ty {
                        BlockType::Q8_0 => f32::from(byte as i8),
                        BlockType::Q4_0 if d < 16 => f32::from(byte & 0x0F) - 8.0,
                        BlockType::Q4_0 => f32::from(byte >> 4) - 8.0,
                    };
                    let got = q * f16::from_bits(g.scales[at * GROUP + r]).to_f32();
                    assert_eq!(got.to_bits(), want.to_bits(), "{ty:?} row {row} depth {t}");
                }
            }
        }
    }

    #[test]
    fn blocks_of_another_shape_order_or_tensor_are_refused() {
        let ty = BlockType::Q4_0;
        let bytes = blocks(ty, 4, 64, 2);
        let (_dir, view) = mapped(&bytes);
        assert!(PackedRows::new(ty, 4, 64, view.clone(), None).is_some());
        assert!(
            PackedRows::new(ty, 5, 64, view.clone(), None).is_none(),
            "size"
        );
        assert!(
            PackedRows::new(ty, 4, 48, view.clone(), None).is_none(),
            "partial block"
        );
        assert!(PackedRows::new(ty, 4, 64, view.clone(), Some(vec![0, 1, 1, 3])).is_none());
        assert!(PackedRows::new(ty, 4, 64, view.clone(), Some(vec![0, 1, 2])).is_none());
        assert!(PackedRows::new(ty, 4, 64, view.clone(), Some(vec![0, 1, 2, 4])).is_none());
        // Blocks that are not the matrix's values: refused when attached.
        let p = PackedRows::new(ty, 4, 64, view, None).unwrap();
        let other = F32Matrix::new(4, 64, Values::Owned(values(256, 5))).unwrap();
        assert!(other.with_packed(Some(p.clone())).is_err());
        let wrong_shape = F32Matrix::new(2, 128, Values::Owned(vec![0.0; 256])).unwrap();
        assert!(wrong_shape.with_packed(Some(p)).is_err());
    }
}
