//! Tests: exhaustive decoder checks, per-format round trips through independent packers, bad input.

use super::*;
use crate::checkpoint::dtype::Dtype;

// ---------------------------------------------------------------------------------------------
// Helpers

fn st<'a>(dtype: Dtype, shape: &'a [usize], bytes: &'a [u8]) -> Stored<'a> {
    Stored {
        dtype,
        shape,
        bytes,
    }
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| {
            let h = half::f16::from_f32(x);
            assert_eq!(h.to_f32(), x, "{x} is not an f16 value");
            h.to_le_bytes()
        })
        .collect()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| {
            let h = half::bf16::from_f32(x);
            assert_eq!(h.to_f32(), x, "{x} is not a bf16 value");
            h.to_le_bytes()
        })
        .collect()
}

/// Bitwise equality (NaN == NaN).
fn same(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

fn assert_same(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "length");
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(same(g, w), "element {k}: got {g:e}, want {w:e}");
    }
}

#[track_caller]
fn assert_err<T: std::fmt::Debug>(r: Result<T>, needles: &[&str]) -> String {
    let e = match r {
        Ok(v) => panic!("expected an error containing {needles:?}, got Ok({v:?})"),
        Err(e) => e,
    };
    for n in needles {
        assert!(e.contains(n), "error {e:?} does not mention {n:?}");
    }
    e
}

/// A small deterministic generator (xorshift), for test data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---------------------------------------------------------------------------------------------
// Independent reference decoders (sign / exponent / mantissa, in f64)

fn e4m3_ref(b: u8) -> f64 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b >> 3) & 0xF);
    let m = f64::from(b & 7);
    if e == 15 && m == 7.0 {
        return f64::NAN;
    }
    let mag = if e == 0 {
        m / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 7)
    };
    sign * mag
}

fn e5m2_ref(b: u8) -> f64 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b >> 2) & 0x1F);
    let m = f64::from(b & 3);
    if e == 31 {
        return if m == 0.0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    let mag = if e == 0 {
        m / 4.0 * 2f64.powi(-14)
    } else {
        (1.0 + m / 4.0) * 2f64.powi(e - 15)
    };
    sign * mag
}

fn e2m1_ref(n: u8) -> f64 {
    let sign = if n & 8 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((n >> 1) & 3);
    let m = f64::from(n & 1);
    let mag = if e == 0 {
        m * 0.5
    } else {
        (1.0 + m / 2.0) * 2f64.powi(e - 1)
    };
    sign * mag
}

fn check_f64(got: f32, want: f64, what: &str) {
    if want.is_nan() {
        assert!(got.is_nan(), "{what}: got {got}, want NaN");
    } else {
        assert_eq!(f64::from(got), want, "{what}");
        assert_eq!(
            got.is_sign_negative(),
            want.is_sign_negative(),
            "{what}: sign"
        );
    }
}

#[test]
fn fp8_e4m3_exhaustive() {
    for b in 0..=255u8 {
        check_f64(fp8_e4m3_to_f32(b), e4m3_ref(b), &format!("e4m3 0x{b:02X}"));
    }
    assert_eq!(fp8_e4m3_to_f32(0x7E), 448.0);
    assert_eq!(fp8_e4m3_to_f32(0xFE), -448.0);
    assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
    assert_eq!(fp8_e4m3_to_f32(0x38), 1.0);
    assert!(fp8_e4m3_to_f32(0x7F).is_nan() && fp8_e4m3_to_f32(0xFF).is_nan());
    assert!(fp8_e4m3_to_f32(0x80).is_sign_negative() && fp8_e4m3_to_f32(0x80) == 0.0);
    // No infinities in e4m3fn.
    assert!((0..=255u8).all(|b| !fp8_e4m3_to_f32(b).is_infinite()));
}

#[test]
fn fp8_e5m2_exhaustive() {
    for b in 0..=255u8 {
        let got = fp8_e5m2_to_f32(b);
        check_f64(got, e5m2_ref(b), &format!("e5m2 0x{b:02X}"));
        // E5M2 is the upper byte of an IEEE f16.
        let via_f16 = half::f16::from_bits(u16::from(b) << 8).to_f32();
        assert!(same(got, via_f16) || (got.is_nan() && via_f16.is_nan()));
    }
    assert_eq!(fp8_e5m2_to_f32(0x7B), 57344.0);
    assert_eq!(fp8_e5m2_to_f32(0x7C), f32::INFINITY);
    assert_eq!(fp8_e5m2_to_f32(0xFC), f32::NEG_INFINITY);
    assert!(fp8_e5m2_to_f32(0x7D).is_nan());
}

#[test]
fn e8m0_exhaustive() {
    for b in 0..=254u8 {
        let want = 2f64.powi(i32::from(b) - 127);
        assert_eq!(f64::from(e8m0_to_f32(b)), want, "e8m0 {b}");
    }
    assert!(e8m0_to_f32(0xFF).is_nan());
    assert_eq!(e8m0_to_f32(127), 1.0);
}

#[test]
fn fp4_exhaustive() {
    let positives = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    for n in 0..16u8 {
        check_f64(fp4_e2m1_to_f32(n), e2m1_ref(n), &format!("e2m1 {n}"));
        let mag = positives[(n & 7) as usize];
        assert_eq!(fp4_e2m1_to_f32(n).abs(), mag);
        // Only the low nibble counts.
        assert!(same(fp4_e2m1_to_f32(n | 0xF0), fp4_e2m1_to_f32(n)));
    }
}

#[test]
fn to_f32_dtypes() {
    // Every f16 bit pattern.
    let all16: Vec<u16> = (0..=u16::MAX).collect();
    let bytes: Vec<u8> = all16.iter().flat_map(|x| x.to_le_bytes()).collect();
    let shape = [all16.len()];
    let got = to_f32(st(Dtype::F16, &shape, &bytes)).unwrap();
    for (&h, &g) in all16.iter().zip(&got) {
        assert!(same(g, half::f16::from_bits(h).to_f32()), "f16 {h:04X}");
    }
    let got = to_f32(st(Dtype::BF16, &shape, &bytes)).unwrap();
    for (&h, &g) in all16.iter().zip(&got) {
        assert!(same(g, f32::from_bits(u32::from(h) << 16)), "bf16 {h:04X}");
    }
    let f = [1.5f32, -0.0, f32::INFINITY, 3.0e-39];
    assert_same(
        &to_f32(st(Dtype::F32, &[2, 2], &f32_bytes(&f))).unwrap(),
        &f,
    );
    let d: Vec<u8> = [0.25f64, -7.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    assert_eq!(to_f32(st(Dtype::F64, &[2], &d)).unwrap(), vec![0.25, -7.0]);
    let i8s = [0x80u8, 0xFF, 0x7F, 0];
    assert_eq!(
        to_f32(st(Dtype::I8, &[4], &i8s)).unwrap(),
        vec![-128.0, -1.0, 127.0, 0.0]
    );
    let i32s = i32_bytes(&[-5, 1 << 24, 7]);
    assert_eq!(
        to_f32(st(Dtype::I32, &[3], &i32s)).unwrap(),
        vec![-5.0, 16_777_216.0, 7.0]
    );
    let codes: Vec<u8> = (0..=255).collect();
    let got = to_f32(st(Dtype::F8_E4M3, &[16, 16], &codes)).unwrap();
    for (b, &g) in codes.iter().zip(&got) {
        assert!(same(g, fp8_e4m3_to_f32(*b)));
    }
    let got = to_f32(st(Dtype::F8_E8M0, &[256], &codes)).unwrap();
    assert_eq!(got[127], 1.0);
    assert!(got[255].is_nan());
    // Scalar shape.
    assert_eq!(
        to_f32(st(Dtype::F32, &[], &f32_bytes(&[2.5]))).unwrap(),
        vec![2.5]
    );
    // Errors.
    assert_err(to_f32(st(Dtype::F4, &[2], &[0x21])), &["F4"]);
    assert_err(to_f32(st(Dtype::F32, &[2], &[0; 7])), &["7 bytes", "8"]);
    assert_err(to_f32(st(Dtype::F32, &[usize::MAX, 2], &[])), &["overflow"]);
}

// ---------------------------------------------------------------------------------------------
// Rounding

/// All finite non-negative E4M3 values with their codes, ascending.
fn e4m3_positive() -> Vec<(f64, u8)> {
    (0..0x7Fu8).map(|b| (e4m3_ref(b), b)).collect()
}

/// Nearest representable value by brute force, ties to the even code, sign applied afterwards.
fn nearest(table: &[(f64, u8)], x: f32, max: f64) -> f32 {
    if x.is_nan() {
        return f32::NAN;
    }
    let a = f64::from(x.abs()).min(max);
    let mut best = table[0];
    for &(v, c) in table {
        let (d, db) = ((v - a).abs(), (best.0 - a).abs());
        if d < db || (d == db && c % 2 == 0 && best.1 % 2 == 1) {
            best = (v, c);
        }
    }
    (best.0 as f32).copysign(x)
}

fn e4m3_inputs(table: &[(f64, u8)]) -> Vec<f32> {
    let mut xs = Vec::new();
    for w in table.windows(2) {
        let mid = ((w[0].0 + w[1].0) / 2.0) as f32;
        xs.extend([
            mid,
            mid.next_up(),
            mid.next_down(),
            w[0].0 as f32,
            w[1].0 as f32,
        ]);
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..20_000 {
        let e = rng.below(24) as i32 - 14;
        let m = 1.0 + rng.below(1 << 20) as f32 / (1 << 20) as f32;
        xs.push(m * 2f32.powi(e));
    }
    let neg: Vec<f32> = xs.iter().map(|x| -x).collect();
    xs.extend(neg);
    xs.extend([0.0, -0.0, 1e-30, -1e-30, 449.0, 464.0, 480.0, 1e9, f32::MAX]);
    xs
}

#[test]
fn round_to_e4m3_matches_brute_force() {
    let table = e4m3_positive();
    for x in e4m3_inputs(&table) {
        let (got, want) = (round_to_e4m3(x), nearest(&table, x, 448.0));
        assert!(
            same(got, want),
            "round_to_e4m3({x:e}) = {got:e}, want {want:e}"
        );
    }
}

#[test]
fn round_to_e4m3_fixed_points_ties_saturation() {
    for b in 0..=255u8 {
        let v = fp8_e4m3_to_f32(b);
        if !v.is_nan() {
            assert!(same(round_to_e4m3(v), v), "0x{b:02X}");
        }
    }
    let p = |e: i32| 2f32.powi(e);
    // Ties to even.
    assert!(same(round_to_e4m3(p(-10)), 0.0)); // 0 vs 2^-9
    assert!(same(round_to_e4m3(-p(-10)), -0.0));
    assert_eq!(round_to_e4m3(3.0 * p(-10)), p(-8)); // 2^-9 (m=1) vs 2^-8 (m=2)
    assert_eq!(round_to_e4m3(1.0625), 1.0);
    assert_eq!(round_to_e4m3(1.1875), 1.25);
    assert_eq!(round_to_e4m3(15.5), 16.0);
    assert_eq!(round_to_e4m3(400.0), 384.0);
    assert_eq!(round_to_e4m3(432.0), 448.0);
    // Saturation (the reference clamps to ±448 before the cast).
    for x in [448.5, 464.0, 465.0, 1e20, f32::INFINITY] {
        assert_eq!(round_to_e4m3(x), 448.0, "{x}");
        assert_eq!(round_to_e4m3(-x), -448.0, "-{x}");
    }
    assert!(round_to_e4m3(f32::NAN).is_nan());
}

fn e2m1_positive() -> Vec<(f64, u8)> {
    (0..8u8).map(|n| (e2m1_ref(n), n)).collect()
}

#[test]
fn round_to_e2m1_matches_brute_force_and_ties() {
    let table = e2m1_positive();
    for n in 0..16u8 {
        let v = fp4_e2m1_to_f32(n);
        assert!(same(round_to_e2m1(v), v), "nibble {n}");
    }
    let mut xs: Vec<f32> = (-640..=640).map(|k| k as f32 / 64.0).collect();
    for w in table.windows(2) {
        let mid = ((w[0].0 + w[1].0) / 2.0) as f32;
        xs.extend([mid, mid.next_up(), mid.next_down()]);
    }
    let mut rng = Rng(12345);
    xs.extend((0..5000).map(|_| (rng.below(1 << 24) as f32 / (1 << 20) as f32) - 8.0));
    for x in xs {
        let (got, want) = (round_to_e2m1(x), nearest(&table, x, 6.0));
        assert!(same(got, want), "round_to_e2m1({x}) = {got}, want {want}");
    }
    for (x, want) in [
        (0.25, 0.0),
        (0.75, 1.0),
        (1.25, 1.0),
        (1.75, 2.0),
        (2.5, 2.0),
        (3.5, 4.0),
        (5.0, 4.0),
        (5.0001, 6.0),
        (7.0, 6.0),
        (f32::INFINITY, 6.0),
    ] {
        assert_eq!(round_to_e2m1(x), want, "{x}");
        assert_eq!(round_to_e2m1(-x), -want, "-{x}");
    }
    assert!(round_to_e2m1(f32::NAN).is_nan());
}

// ---------------------------------------------------------------------------------------------
// compressed-tensors dense

fn args(strategy: CtStrategy, group_size: Option<usize>, block: Option<[usize; 2]>) -> CtArgs {
    CtArgs {
        strategy,
        group_size,
        block,
    }
}

#[test]
fn ct_dense_int8_group_with_zero_points() {
    let (rows, cols, g) = (3usize, 8usize, 4usize);
    let q: Vec<i8> = (0..rows * cols)
        .map(|k| (k as i32 * 37 % 255 - 127) as i8)
        .collect();
    let s = [0.5f32, 0.25, 2.0, 1.5, 0.125, 3.0];
    let z: Vec<i8> = vec![0, 3, -4, 1, 2, -1];
    let qb: Vec<u8> = q.iter().map(|&v| v as u8).collect();
    let zb: Vec<u8> = z.iter().map(|&v| v as u8).collect();
    let sb = bf16_bytes(&s);
    let got = ct_dense(
        st(Dtype::I8, &[rows, cols], &qb),
        st(Dtype::BF16, &[rows, 2], &sb),
        Some(st(Dtype::I8, &[rows, 2], &zb)),
        &args(CtStrategy::Group, Some(g), None),
    )
    .unwrap();
    let want: Vec<f32> = (0..rows * cols)
        .map(|k| {
            let (o, i) = (k / cols, k % cols);
            let j = o * 2 + i / g;
            (f32::from(q[k]) - f32::from(z[j])) * s[j]
        })
        .collect();
    assert_same(&got, &want);
}

#[test]
fn ct_dense_strategies() {
    let (rows, cols) = (5usize, 6usize);
    let codes: Vec<u8> = (0..rows * cols)
        .map(|k| (k * 29 % 0x7E) as u8 | ((k as u8 & 1) << 7))
        .collect();
    let fp = |k: usize| fp8_e4m3_to_f32(codes[k]);
    // Tensor, [] and [1].
    for shape in [&[][..], &[1][..]] {
        let sb = f32_bytes(&[0.75]);
        let got = ct_dense(
            st(Dtype::F8_E4M3, &[rows, cols], &codes),
            st(Dtype::F32, shape, &sb),
            None,
            &args(CtStrategy::Tensor, None, None),
        )
        .unwrap();
        let want: Vec<f32> = (0..rows * cols).map(|k| fp(k) * 0.75).collect();
        assert_same(&got, &want);
    }
    // Channel.
    let s: Vec<f32> = (0..rows).map(|o| 1.0 + o as f32 / 4.0).collect();
    let sb = f16_bytes(&s);
    let got = ct_dense(
        st(Dtype::F8_E4M3, &[rows, cols], &codes),
        st(Dtype::F16, &[rows, 1], &sb),
        None,
        &args(CtStrategy::Channel, None, None),
    )
    .unwrap();
    let want: Vec<f32> = (0..rows * cols).map(|k| fp(k) * s[k / cols]).collect();
    assert_same(&got, &want);
    // Block 2x4 with partial blocks: scales [3, 2].
    let s: Vec<f32> = (0..6).map(|k| 0.5 + k as f32).collect();
    let sb = f32_bytes(&s);
    let got = ct_dense(
        st(Dtype::F8_E4M3, &[rows, cols], &codes),
        st(Dtype::F32, &[3, 2], &sb),
        None,
        &args(CtStrategy::Block, None, Some([2, 4])),
    )
    .unwrap();
    let want: Vec<f32> = (0..rows * cols)
        .map(|k| fp(k) * s[(k / cols / 2) * 2 + (k % cols) / 4])
        .collect();
    assert_same(&got, &want);
}

#[test]
fn ct_dense_bad_input() {
    let w = vec![0u8; 8];
    let sb = f32_bytes(&[1.0; 4]);
    let a = args(CtStrategy::Group, Some(2), None);
    // Wrong scale shape, with the message format of the contract.
    let e = assert_err(
        ct_dense(
            st(Dtype::I8, &[2, 4], &w),
            st(Dtype::F32, &[4, 1], &sb),
            None,
            &a,
        ),
        &[
            "weight_scale",
            "[4, 1]",
            "[2, 2]",
            "group size of 2 over 4 input columns",
        ],
    );
    assert_eq!(
        e,
        "weight_scale has shape [4, 1]; a group size of 2 over 4 input columns needs [2, 2]"
    );
    // Wrong weight dtype, wrong scale dtype.
    assert_err(
        ct_dense(
            st(Dtype::U8, &[2, 4], &w),
            st(Dtype::F32, &[2, 2], &sb),
            None,
            &a,
        ),
        &["weight", "U8"],
    );
    assert_err(
        ct_dense(
            st(Dtype::I8, &[2, 4], &w),
            st(Dtype::I32, &[2, 2], &sb),
            None,
            &a,
        ),
        &["weight_scale", "I32"],
    );
    // Truncated bytes.
    assert_err(
        ct_dense(
            st(Dtype::I8, &[2, 4], &w[..7]),
            st(Dtype::F32, &[2, 2], &sb),
            None,
            &a,
        ),
        &["weight", "7 bytes"],
    );
    assert_err(
        ct_dense(
            st(Dtype::I8, &[2, 4], &w),
            st(Dtype::F32, &[2, 2], &sb[..15]),
            None,
            &a,
        ),
        &["weight_scale", "15 bytes"],
    );
    // Zero point of the wrong shape.
    let zb = [0u8; 2];
    assert_err(
        ct_dense(
            st(Dtype::I8, &[2, 4], &w),
            st(Dtype::F32, &[2, 2], &sb),
            Some(st(Dtype::I8, &[2, 1], &zb)),
            &a,
        ),
        &["weight_zero_point", "[2, 1]"],
    );
    // Missing group size / block structure; tensor_group.
    assert_err(
        ct_dense(
            st(Dtype::I8, &[2, 4], &w),
            st(Dtype::F32, &[2, 2], &sb),
            None,
            &args(CtStrategy::Group, None, None),
        ),
        &["group_size"],
    );
    assert_err(
        ct_dense(
            st(Dtype::I8, &[2, 4], &w),
            st(Dtype::F32, &[2, 2], &sb),
            None,
            &args(CtStrategy::Block, None, None),
        ),
        &["block_structure"],
    );
    assert_err(
        ct_dense(
            st(Dtype::I8, &[2, 4], &w),
            st(Dtype::F32, &[2, 2], &sb),
            None,
            &args(CtStrategy::TensorGroup, Some(2), None),
        ),
        &["ct_nvfp4"],
    );
    // Not 2-D.
    assert_err(
        ct_dense(
            st(Dtype::I8, &[8], &w),
            st(Dtype::F32, &[2, 2], &sb),
            None,
            &a,
        ),
        &["weight", "2-D"],
    );
}

// ---------------------------------------------------------------------------------------------
// compressed-tensors pack-quantized

/// compressed-tensors `pack_to_int32` (dense): signed values offset by `2^(bits-1)`, element `i`
/// of a row at bit `i*bits` of the row's words, spilling into the next word.
fn ct_pack_dense(vals: &[i32], rows: usize, cols: usize, bits: usize) -> Vec<u32> {
    let wpr = (cols * bits).div_ceil(32);
    let mut out = vec![0u32; rows * wpr];
    for o in 0..rows {
        for i in 0..cols {
            let u = (vals[o * cols + i] + (1 << (bits - 1))) as u32;
            assert!(u < (1 << bits));
            let start = i * bits;
            let (w, off) = (start / 32, start % 32);
            out[o * wpr + w] |= u << off;
            if off + bits > 32 {
                out[o * wpr + w + 1] |= u >> (32 - off);
            }
        }
    }
    out
}

/// The pre-#715 compressed-tensors packing: `32 / bits` values per word, no straddling.
fn ct_pack_per_word(vals: &[i32], rows: usize, cols: usize, bits: usize) -> Vec<u32> {
    let pf = 32 / bits;
    let wpr = cols.div_ceil(pf);
    let mut out = vec![0u32; rows * wpr];
    for o in 0..rows {
        for i in 0..cols {
            let u = (vals[o * cols + i] + (1 << (bits - 1))) as u32;
            out[o * wpr + i / pf] |= u << (bits * (i % pf));
        }
    }
    out
}

/// Transpose of a row-major `[rows, cols]` matrix.
fn transpose<T: Copy>(v: &[T], rows: usize, cols: usize) -> Vec<T> {
    (0..rows * cols)
        .map(|k| v[(k % rows) * cols + k / rows])
        .collect()
}

fn signed_values(rng: &mut Rng, n: usize, bits: usize) -> Vec<i32> {
    (0..n)
        .map(|_| rng.below(1 << bits) as i32 - (1 << (bits - 1)))
        .collect()
}

#[test]
fn ct_pack_int4_asymmetric_group_with_packed_zero_points() {
    let (rows, cols, bits, g) = (10usize, 40usize, 4usize, 8usize);
    let ng = cols / g;
    let mut rng = Rng(7);
    let q = signed_values(&mut rng, rows * cols, bits);
    let z = signed_values(&mut rng, rows * ng, bits);
    let s: Vec<f32> = (0..rows * ng)
        .map(|k| 0.5 + (k % 7) as f32 * 0.125)
        .collect();
    let packed = u32_bytes(&ct_pack_dense(&q, rows, cols, bits));
    // Zero points are packed along dim 0: pack the transpose, then transpose back.
    let zt = transpose(&z, rows, ng); // [ng, rows]
    let zp_t = ct_pack_dense(&zt, ng, rows, bits); // [ng, zr]
    let zr = (rows * bits).div_ceil(32);
    let zp = transpose(&zp_t, ng, zr); // [zr, ng]
    let zpb = u32_bytes(&zp);
    let sb = bf16_bytes(&s);
    let got = ct_pack_quantized(
        st(Dtype::I32, &[rows, cols * bits / 32], &packed),
        [rows, cols],
        bits as u32,
        st(Dtype::BF16, &[rows, ng], &sb),
        Some(st(Dtype::I32, &[zr, ng], &zpb)),
        None,
        &args(CtStrategy::Group, Some(g), None),
    )
    .unwrap();
    let want: Vec<f32> = (0..rows * cols)
        .map(|k| {
            let j = (k / cols) * ng + (k % cols) / g;
            (q[k] - z[j]) as f32 * s[j]
        })
        .collect();
    assert_same(&got, &want);
}

#[test]
fn ct_pack_widths_and_layouts() {
    let mut rng = Rng(99);
    // (bits, cols, strategy) over dense packing; 3 bits straddles words.
    for (bits, cols) in [(8usize, 12usize), (4, 24), (2, 36), (3, 64), (1, 40)] {
        let rows = 3;
        let q = signed_values(&mut rng, rows * cols, bits);
        let s: Vec<f32> = (0..rows).map(|o| 0.25 * (o + 1) as f32).collect();
        let sb = f32_bytes(&s);
        for (packer, name) in [
            (
                ct_pack_dense as fn(&[i32], usize, usize, usize) -> Vec<u32>,
                "dense",
            ),
            (ct_pack_per_word, "per-word"),
        ] {
            if name == "per-word" && 32 % bits == 0 {
                continue; // identical to dense
            }
            let words = packer(&q, rows, cols, bits);
            let wpr = words.len() / rows;
            let pb = u32_bytes(&words);
            let got = ct_pack_quantized(
                st(Dtype::I32, &[rows, wpr], &pb),
                [rows, cols],
                bits as u32,
                st(Dtype::F32, &[rows, 1], &sb),
                None,
                None,
                &args(CtStrategy::Channel, None, None),
            )
            .unwrap_or_else(|e| panic!("{bits} bits {name}: {e}"));
            let want: Vec<f32> = (0..rows * cols)
                .map(|k| q[k] as f32 * s[k / cols])
                .collect();
            assert_same(&got, &want);
        }
    }
    // 3 bits over 40 columns: 4 words either way, which is ambiguous.
    let q = vec![0i32; 40];
    let pb = u32_bytes(&ct_pack_dense(&q, 1, 40, 3));
    let sb = f32_bytes(&[1.0]);
    assert_err(
        ct_pack_quantized(
            st(Dtype::I32, &[1, 4], &pb),
            [1, 40],
            3,
            st(Dtype::F32, &[1, 1], &sb),
            None,
            None,
            &args(CtStrategy::Channel, None, None),
        ),
        &["weight_packed", "cannot tell"],
    );
}

#[test]
fn ct_pack_g_idx_activation_order() {
    let (rows, cols, bits, g) = (4usize, 64usize, 4usize, 16usize);
    let ng = cols / g;
    let mut rng = Rng(3);
    let q = signed_values(&mut rng, rows * cols, bits);
    let s: Vec<f32> = (0..rows * ng).map(|k| 1.0 + k as f32).collect();
    // A permuted grouping: each group still has 16 members.
    let gidx: Vec<i32> = (0..cols).map(|i| ((i * 7 + 3) % ng) as i32).collect();
    let pb = u32_bytes(&ct_pack_dense(&q, rows, cols, bits));
    let sb = f32_bytes(&s);
    let gb = i32_bytes(&gidx);
    let run = |gb: &[u8]| {
        ct_pack_quantized(
            st(Dtype::I32, &[rows, cols * bits / 32], &pb),
            [rows, cols],
            bits as u32,
            st(Dtype::F32, &[rows, ng], &sb),
            None,
            Some(st(Dtype::I32, &[cols], gb)),
            &args(CtStrategy::Group, Some(g), None),
        )
    };
    let want: Vec<f32> = (0..rows * cols)
        .map(|k| q[k] as f32 * s[(k / cols) * ng + gidx[k % cols] as usize])
        .collect();
    assert_same(&run(&gb).unwrap(), &want);
    // -1 anywhere: column order, as the reference.
    let mut gm = gidx.clone();
    gm[5] = -1;
    let want: Vec<f32> = (0..rows * cols)
        .map(|k| q[k] as f32 * s[(k / cols) * ng + (k % cols) / g])
        .collect();
    assert_same(&run(&i32_bytes(&gm)).unwrap(), &want);
    // Out of range.
    let mut gb2 = gidx.clone();
    gb2[9] = ng as i32;
    assert_err(run(&i32_bytes(&gb2)), &["weight_g_idx[9]", "4 groups"]);
    gb2[9] = -2;
    assert_err(run(&i32_bytes(&gb2)), &["weight_g_idx[9]", "-2"]);
    // Wrong length.
    assert_err(run(&gb[..gb.len() - 4]), &["weight_g_idx"]);
}

#[test]
fn ct_pack_bad_input() {
    let pb = vec![0u8; 4 * 2 * 2];
    let sb = f32_bytes(&[1.0; 4]);
    let a = args(CtStrategy::Group, Some(8), None);
    let call = |p: Stored, s: Stored, zp: Option<Stored>, bits: u32| {
        ct_pack_quantized(p, [2, 16], bits, s, zp, None, &a)
    };
    // Good baseline.
    call(
        st(Dtype::I32, &[2, 2], &pb),
        st(Dtype::F32, &[2, 2], &sb),
        None,
        4,
    )
    .unwrap();
    assert_err(
        call(
            st(Dtype::I32, &[2, 2], &pb),
            st(Dtype::F32, &[2, 1], &sb[..8]),
            None,
            4,
        ),
        &["weight_scale", "[2, 1]", "[2, 2]"],
    );
    assert_err(
        call(
            st(Dtype::U32, &[2, 2], &pb),
            st(Dtype::F32, &[2, 2], &sb),
            None,
            4,
        ),
        &["weight_packed", "U32"],
    );
    assert_err(
        call(
            st(Dtype::I32, &[2, 2], &pb[..15]),
            st(Dtype::F32, &[2, 2], &sb),
            None,
            4,
        ),
        &["weight_packed", "15 bytes"],
    );
    assert_err(
        call(
            st(Dtype::I32, &[2, 3], &[0; 24]),
            st(Dtype::F32, &[2, 2], &sb),
            None,
            4,
        ),
        &["weight_packed", "3 packed words", "need 2"],
    );
    assert_err(
        call(
            st(Dtype::I32, &[3, 2], &[0; 24]),
            st(Dtype::F32, &[2, 2], &sb),
            None,
            4,
        ),
        &["weight_packed", "2 rows"],
    );
    assert_err(
        call(
            st(Dtype::I32, &[2, 2], &pb),
            st(Dtype::F32, &[2, 2], &sb),
            None,
            9,
        ),
        &["num_bits"],
    );
    let zb = [0u8; 8];
    assert_err(
        call(
            st(Dtype::I32, &[2, 2], &pb),
            st(Dtype::F32, &[2, 2], &sb),
            Some(st(Dtype::I32, &[1, 1], &zb[..4])),
            4,
        ),
        &["weight_zero_point", "[1, 1]"],
    );
    assert_err(
        call(
            st(Dtype::I32, &[2, 2], &pb),
            st(Dtype::F32, &[2, 2], &sb),
            Some(st(Dtype::I32, &[2, 2], &zb)),
            4,
        ),
        &["weight_zero_point"],
    );
}

// ---------------------------------------------------------------------------------------------
// Block FP8

#[test]
fn fp8_block_partial_blocks_and_scale_formats() {
    let (rows, cols) = (130usize, 200usize);
    let mut rng = Rng(11);
    let codes: Vec<u8> = (0..rows * cols)
        .map(|_| {
            let b = rng.below(256) as u8;
            if b & 0x7F == 0x7F { 0x10 } else { b }
        })
        .collect();
    let (sr, sc) = (2usize, 2usize);
    let exps: [u8; 4] = [120, 127, 130, 0];
    let sf: Vec<f32> = exps.iter().map(|&e| e8m0_to_f32(e)).collect();
    let want: Vec<f32> = (0..rows * cols)
        .map(|k| {
            let (o, i) = (k / cols, k % cols);
            fp8_e4m3_to_f32(codes[k]) * sf[(o / 128) * sc + i / 128]
        })
        .collect();
    let wshape = [rows, cols];
    let w = st(Dtype::F8_E4M3, &wshape, &codes);
    let sfb = f32_bytes(&sf);
    // F32 scales (the 2^-127 subnormal is an f32 value).
    let got = fp8_block(w, st(Dtype::F32, &[sr, sc], &sfb), [128, 128], false).unwrap();
    assert_same(&got, &want);
    // UE8M0 as F8_E8M0, and as U8 with ue8m0.
    let got = fp8_block(w, st(Dtype::F8_E8M0, &[sr, sc], &exps), [128, 128], false).unwrap();
    assert_same(&got, &want);
    let got = fp8_block(w, st(Dtype::U8, &[sr, sc], &exps), [128, 128], true).unwrap();
    assert_same(&got, &want);
    // BF16 scales.
    let sbf = [1.5f32, -0.75, 0.0078125, 3.0];
    let bb = bf16_bytes(&sbf);
    let got = fp8_block(w, st(Dtype::BF16, &[sr, sc], &bb), [128, 128], false).unwrap();
    let want: Vec<f32> = (0..rows * cols)
        .map(|k| fp8_e4m3_to_f32(codes[k]) * sbf[(k / cols / 128) * sc + (k % cols) / 128])
        .collect();
    assert_same(&got, &want);
}

#[test]
fn fp8_block_bad_input() {
    let w = vec![0u8; 130 * 200];
    let s = f32_bytes(&[1.0; 4]);
    let wt = st(Dtype::F8_E4M3, &[130, 200], &w);
    let e = assert_err(
        fp8_block(wt, st(Dtype::F32, &[1, 4], &s), [128, 128], false),
        &["weight_scale_inv", "[1, 4]", "[2, 2]"],
    );
    assert!(e.contains("130 x 200"), "{e}");
    assert_err(
        fp8_block(
            st(Dtype::I8, &[130, 200], &w),
            st(Dtype::F32, &[2, 2], &s),
            [128, 128],
            false,
        ),
        &["weight", "I8"],
    );
    assert_err(
        fp8_block(wt, st(Dtype::U8, &[2, 2], &[127; 4]), [128, 128], false),
        &["weight_scale_inv", "U8", "ue8m0"],
    );
    assert_err(
        fp8_block(
            st(Dtype::F8_E4M3, &[130, 200], &w[1..]),
            st(Dtype::F32, &[2, 2], &s),
            [128, 128],
            false,
        ),
        &["weight", "25999 bytes"],
    );
    assert_err(
        fp8_block(wt, st(Dtype::F32, &[2, 2], &s[..12]), [128, 128], false),
        &["weight_scale_inv", "12 bytes"],
    );
    assert_err(
        fp8_block(
            wt,
            st(Dtype::F8_E8M0, &[2, 2], &[127, 127, 0xFF, 127]),
            [128, 128],
            false,
        ),
        &["weight_scale_inv[1][0]", "0xFF"],
    );
    assert_err(
        fp8_block(wt, st(Dtype::F32, &[2, 2], &s), [0, 128], false),
        &["positive"],
    );
}

// ---------------------------------------------------------------------------------------------
// FP4: NVFP4 and MXFP4

/// Packs E2M1 nibble codes two per byte, even index in the low nibble.
fn pack_nibbles(codes: &[u8]) -> Vec<u8> {
    codes
        .chunks(2)
        .map(|c| (c[0] & 0xF) | (c[1] << 4))
        .collect()
}

fn e4m3_code(v: f32) -> u8 {
    (0..=255u8)
        .find(|&b| fp8_e4m3_to_f32(b) == v && (b & 0x80 != 0) == v.is_sign_negative())
        .unwrap()
}

#[test]
fn nvfp4_both_conventions() {
    let (rows, cols) = (3usize, 48usize);
    let mut rng = Rng(5);
    let codes: Vec<u8> = (0..rows * cols).map(|_| rng.below(16) as u8).collect();
    let packed = pack_nibbles(&codes);
    let scols = cols / 16;
    let svals: Vec<f32> = (0..rows * scols)
        .map(|k| [448.0, 1.0, 0.001953125, 6.5, 96.0, 0.0][k % 6])
        .collect();
    let sbytes: Vec<u8> = svals.iter().map(|&v| e4m3_code(v)).collect();
    let (wshape, sshape) = ([rows, cols / 2], [rows, scols]);
    let w = st(Dtype::U8, &wshape, &packed);
    let s = st(Dtype::F8_E4M3, &sshape, &sbytes);
    // Reciprocal power-of-two global scales: identical weights.
    let gsb = f32_bytes(&[256.0]);
    let s2b = f32_bytes(&[1.0 / 256.0]);
    let ct = ct_nvfp4(w, s, st(Dtype::F32, &[1], &gsb)).unwrap();
    let mo = modelopt_nvfp4(w, s, st(Dtype::F32, &[], &s2b)).unwrap();
    assert_same(&ct, &mo);
    let want: Vec<f32> = (0..rows * cols)
        .map(|k| {
            let v =
                e2m1_ref(codes[k]) * f64::from(svals[(k / cols) * scols + (k % cols) / 16]) / 256.0;
            v as f32
        })
        .collect();
    for (k, (&g, &w)) in ct.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "element {k}");
    }
    // A non-power-of-two global scale: the quotient is taken first, in f32 (ct), versus the
    // product with scale_2 (ModelOpt).
    let gs = 2688.0f32 / 7.0;
    let gsb = f32_bytes(&[gs]);
    let ct = ct_nvfp4(w, s, st(Dtype::F32, &[], &gsb)).unwrap();
    let want: Vec<f32> = (0..rows * cols)
        .map(|k| fp4_e2m1_to_f32(codes[k]) * (svals[(k / cols) * scols + (k % cols) / 16] / gs))
        .collect();
    assert_same(&ct, &want);
    let s2 = 0.37f32;
    let s2b = f32_bytes(&[s2]);
    let mo = modelopt_nvfp4(w, s, st(Dtype::F32, &[1], &s2b)).unwrap();
    let want: Vec<f32> = (0..rows * cols)
        .map(|k| fp4_e2m1_to_f32(codes[k]) * (svals[(k / cols) * scols + (k % cols) / 16] * s2))
        .collect();
    assert_same(&mo, &want);
}

#[test]
fn nvfp4_bad_input() {
    let packed = vec![0u8; 2 * 16];
    let s = vec![0x38u8; 4];
    let g = f32_bytes(&[1.0]);
    let w = st(Dtype::U8, &[2, 16], &packed);
    assert_err(
        ct_nvfp4(
            w,
            st(Dtype::F8_E4M3, &[2, 1], &s[..2]),
            st(Dtype::F32, &[1], &g),
        ),
        &["weight_scale", "[2, 1]", "[2, 2]"],
    );
    assert_err(
        modelopt_nvfp4(w, st(Dtype::F8_E4M3, &[4, 1], &s), st(Dtype::F32, &[1], &g)),
        &["weight_scale", "[4, 1]", "[2, 2]"],
    );
    assert_err(
        ct_nvfp4(
            st(Dtype::I8, &[2, 16], &packed),
            st(Dtype::F8_E4M3, &[2, 2], &s),
            st(Dtype::F32, &[1], &g),
        ),
        &["weight_packed", "I8"],
    );
    assert_err(
        modelopt_nvfp4(
            w,
            st(Dtype::BF16, &[2, 2], &[0; 8]),
            st(Dtype::F32, &[1], &g),
        ),
        &["weight_scale", "BF16"],
    );
    assert_err(
        ct_nvfp4(
            w,
            st(Dtype::F8_E4M3, &[2, 2], &s),
            st(Dtype::F32, &[2], &[0; 8]),
        ),
        &["weight_global_scale", "[2]"],
    );
    assert_err(
        ct_nvfp4(
            w,
            st(Dtype::F8_E4M3, &[2, 2], &s),
            st(Dtype::F32, &[1], &[0; 4]),
        ),
        &["weight_global_scale", "non-zero"],
    );
    assert_err(
        modelopt_nvfp4(
            w,
            st(Dtype::F8_E4M3, &[2, 2], &s),
            st(Dtype::F32, &[1], &g[..3]),
        ),
        &["weight_scale_2", "3 bytes"],
    );
    assert_err(
        modelopt_nvfp4(
            st(Dtype::U8, &[2, 16], &packed[1..]),
            st(Dtype::F8_E4M3, &[2, 2], &s),
            st(Dtype::F32, &[1], &g),
        ),
        &["weight", "31 bytes"],
    );
    assert_err(
        ct_nvfp4(
            w,
            st(Dtype::F8_E4M3, &[2, 2], &[0x38, 0x7F, 0x38, 0x38]),
            st(Dtype::F32, &[1], &g),
        ),
        &["weight_scale[0][1]", "NaN"],
    );
}

#[test]
fn mxfp4_layouts() {
    let (experts, rows, groups) = (2usize, 3usize, 2usize);
    let cols = groups * 32;
    let n = experts * rows * cols;
    let mut rng = Rng(17);
    let codes: Vec<u8> = (0..n).map(|_| rng.below(16) as u8).collect();
    let blocks = pack_nibbles(&codes);
    let exps: Vec<u8> = (0..experts * rows * groups)
        .map(|k| (100 + k * 3) as u8)
        .collect();
    let want: Vec<f32> = (0..n)
        .map(|k| {
            let r = k / cols;
            let g = (k % cols) / 32;
            (e2m1_ref(codes[k]) * 2f64.powi(i32::from(exps[r * groups + g]) - 127)) as f32
        })
        .collect();
    // gpt-oss: blocks [E, R, G, 16], scales [E, R, G].
    let got = mxfp4(
        st(Dtype::U8, &[experts, rows, groups, 16], &blocks),
        st(Dtype::U8, &[experts, rows, groups], &exps),
    )
    .unwrap();
    assert_same(&got, &want);
    // Last-dim layout: blocks [E, R, K/2], scales [E, R, K/32], scale dtype F8_E8M0.
    let got = mxfp4(
        st(Dtype::U8, &[experts, rows, cols / 2], &blocks),
        st(Dtype::F8_E8M0, &[experts, rows, groups], &exps),
    )
    .unwrap();
    assert_same(&got, &want);
    // compressed-tensors 2-D.
    let got = ct_mxfp4(
        st(Dtype::U8, &[experts * rows, cols / 2], &blocks),
        st(Dtype::U8, &[experts * rows, groups], &exps),
    )
    .unwrap();
    assert_same(&got, &want);
}

#[test]
fn mxfp4_bad_input() {
    let b = vec![0u8; 2 * 32];
    let s = vec![127u8; 4];
    assert_err(
        mxfp4(
            st(Dtype::U8, &[2, 2, 16], &b),
            st(Dtype::U8, &[2, 3], &[127; 6]),
        ),
        &["blocks", "scales", "[2, 3]"],
    );
    assert_err(
        mxfp4(st(Dtype::U8, &[2, 32], &b), st(Dtype::U8, &[2, 1], &s[..2])),
        &["scales", "[2, 1]", "needs 2"],
    );
    assert_err(
        mxfp4(st(Dtype::I8, &[2, 32], &b), st(Dtype::U8, &[2, 2], &s)),
        &["blocks", "I8"],
    );
    assert_err(
        mxfp4(
            st(Dtype::U8, &[2, 32], &b),
            st(Dtype::F16, &[2, 2], &[0; 8]),
        ),
        &["scales", "F16"],
    );
    assert_err(
        mxfp4(
            st(Dtype::U8, &[2, 32], &b[..63]),
            st(Dtype::U8, &[2, 2], &s),
        ),
        &["blocks", "63 bytes"],
    );
    assert_err(
        mxfp4(
            st(Dtype::U8, &[2, 32], &b),
            st(Dtype::U8, &[2, 2], &[127, 127, 127, 0xFF]),
        ),
        &["scales[1][1]", "0xFF"],
    );
    assert_err(
        ct_mxfp4(st(Dtype::U8, &[2, 32], &b), st(Dtype::U8, &[2, 1], &s[..2])),
        &["weight_scale", "[2, 1]", "[2, 2]"],
    );
    assert_err(
        ct_mxfp4(
            st(Dtype::U8, &[2, 32], &b),
            st(Dtype::F32, &[2, 2], &[0; 16]),
        ),
        &["weight_scale", "F32"],
    );
    assert_err(
        ct_mxfp4(
            st(Dtype::U8, &[2, 32], &b[..10]),
            st(Dtype::U8, &[2, 2], &s),
        ),
        &["weight_packed", "10 bytes"],
    );
}

// ---------------------------------------------------------------------------------------------
// AWQ

/// AutoAWQ `WQLinear_GEMM.from_linear` packing: `intweight` `[in, out]`, column block `c`, nibble
/// `i` holds column `8c + order_map[i]` with `order_map = [0, 2, 4, 6, 1, 3, 5, 7]`.
fn awq_pack(int: &[u32], rows: usize, cols: usize) -> Vec<u32> {
    let order_map = [0usize, 2, 4, 6, 1, 3, 5, 7];
    let packs = cols / 8;
    let mut out = vec![0u32; rows * packs];
    for r in 0..rows {
        for c in 0..packs {
            for (i, &m) in order_map.iter().enumerate() {
                out[r * packs + c] |= int[r * cols + c * 8 + m] << (i * 4);
            }
        }
    }
    out
}

#[test]
fn awq_gemm_interleaved_order() {
    let (inf, outf, g) = (32usize, 16usize, 16usize);
    let ng = inf / g;
    let mut rng = Rng(23);
    let q: Vec<u32> = (0..inf * outf).map(|_| rng.below(16) as u32).collect(); // [in, out]
    let z: Vec<u32> = (0..ng * outf).map(|_| rng.below(16) as u32).collect(); // [ng, out]
    let s: Vec<f32> = (0..ng * outf).map(|k| 0.0625 * (k + 1) as f32).collect();
    let qw = u32_bytes(&awq_pack(&q, inf, outf));
    let qz = u32_bytes(&awq_pack(&z, ng, outf));
    let sb = f16_bytes(&s);
    let got = awq_gemm(
        st(Dtype::I32, &[inf, outf / 8], &qw),
        st(Dtype::I32, &[ng, outf / 8], &qz),
        st(Dtype::F16, &[ng, outf], &sb),
        g,
    )
    .unwrap();
    let want: Vec<f32> = (0..outf * inf)
        .map(|k| {
            let (o, i) = (k / inf, k % inf);
            let j = (i / g) * outf + o;
            (q[i * outf + o] as i32 - z[j] as i32) as f32 * s[j]
        })
        .collect();
    assert_same(&got, &want);
    // A specific word: column o=1 lives in nibble 4.
    let mut one = vec![0u32; 8];
    one[1] = 5;
    let w = awq_pack(&one, 1, 8);
    assert_eq!(w[0], 5 << 16);
}

#[test]
fn awq_bad_input() {
    let qw = vec![0u8; 32 * 2 * 4];
    let qz = vec![0u8; 2 * 2 * 4];
    let sb = vec![0u8; 2 * 16 * 2];
    let ok = |qw: Stored, qz: Stored, s: Stored| awq_gemm(qw, qz, s, 16);
    ok(
        st(Dtype::I32, &[32, 2], &qw),
        st(Dtype::I32, &[2, 2], &qz),
        st(Dtype::F16, &[2, 16], &sb),
    )
    .unwrap();
    assert_err(
        ok(
            st(Dtype::I32, &[32, 2], &qw),
            st(Dtype::I32, &[2, 2], &qz),
            st(Dtype::F16, &[1, 32], &sb),
        ),
        &["scales", "[1, 32]", "[2, 16]"],
    );
    assert_err(
        ok(
            st(Dtype::I32, &[32, 2], &qw),
            st(Dtype::I32, &[4, 1], &qz),
            st(Dtype::F16, &[2, 16], &sb),
        ),
        &["qzeros", "[4, 1]", "[2, 2]"],
    );
    assert_err(
        ok(
            st(Dtype::F32, &[32, 2], &qw),
            st(Dtype::I32, &[2, 2], &qz),
            st(Dtype::F16, &[2, 16], &sb),
        ),
        &["qweight", "F32"],
    );
    assert_err(
        ok(
            st(Dtype::I32, &[32, 2], &qw),
            st(Dtype::I32, &[2, 2], &qz),
            st(Dtype::I8, &[2, 16], &sb[..32]),
        ),
        &["scales", "I8"],
    );
    assert_err(
        ok(
            st(Dtype::I32, &[32, 2], &qw[..100]),
            st(Dtype::I32, &[2, 2], &qz),
            st(Dtype::F16, &[2, 16], &sb),
        ),
        &["qweight", "100 bytes"],
    );
    assert_err(
        ok(
            st(Dtype::I32, &[32, 2], &qw),
            st(Dtype::I32, &[2, 2], &qz[..15]),
            st(Dtype::F16, &[2, 16], &sb),
        ),
        &["qzeros", "15 bytes"],
    );
    assert_err(
        awq_gemm(
            st(Dtype::I32, &[32, 2], &qw),
            st(Dtype::I32, &[2, 2], &qz),
            st(Dtype::F16, &[2, 16], &sb),
            12,
        ),
        &["qweight", "group size 12"],
    );
}

// ---------------------------------------------------------------------------------------------
// GPTQ

/// AutoGPTQ `QuantLinear.pack` (qlinear_cuda_old.py), packing `int` `[n, m]` along dim 0 into
/// `[n * bits / 32, m]` words (AutoGPTQ writes `n // 32 * bits`, the same when 32 divides `n`);
/// for 3 bits the explicit three-word layout.
fn gptq_pack(int: &[u32], n: usize, m: usize, bits: usize) -> Vec<u32> {
    let rows = n * bits / 32;
    let mut q = vec![0u32; rows * m];
    let at = |r: usize| r * m;
    let (mut i, mut row) = (0usize, 0usize);
    while row < rows {
        for c in 0..m {
            let v = |j: usize| int[j * m + c];
            match bits {
                2 | 4 | 8 => {
                    for j in i..i + 32 / bits {
                        q[at(row) + c] |= v(j) << (bits * (j - i));
                    }
                }
                3 => {
                    let mut k = i;
                    let mut r = row;
                    for j in k..k + 10 {
                        q[at(r) + c] |= v(j) << (3 * (j - k));
                    }
                    k += 10;
                    q[at(r) + c] |= v(k) << 30;
                    r += 1;
                    q[at(r) + c] |= (v(k) >> 2) & 1;
                    k += 1;
                    for j in k..k + 10 {
                        q[at(r) + c] |= v(j) << (3 * (j - k) + 1);
                    }
                    k += 10;
                    q[at(r) + c] |= v(k) << 31;
                    r += 1;
                    q[at(r) + c] |= (v(k) >> 1) & 0x3;
                    k += 1;
                    for j in k..k + 10 {
                        q[at(r) + c] |= v(j) << (3 * (j - k) + 2);
                    }
                }
                _ => unreachable!(),
            }
        }
        if bits == 3 {
            i += 32;
            row += 3;
        } else {
            i += 32 / bits;
            row += 1;
        }
    }
    q
}

struct GptqCase {
    q: Vec<u32>,  // [in, out]
    zf: Vec<u32>, // stored zero fields [ng, out]
    s: Vec<f32>,  // [ng, out]
    qw: Vec<u8>,
    qz: Vec<u8>,
    sb: Vec<u8>,
    inf: usize,
    outf: usize,
    ng: usize,
}

fn gptq_case(inf: usize, outf: usize, ng: usize, bits: usize, seed: u64) -> GptqCase {
    let mut rng = Rng(seed);
    let q: Vec<u32> = (0..inf * outf)
        .map(|_| rng.below(1 << bits) as u32)
        .collect();
    let zf: Vec<u32> = (0..ng * outf)
        .map(|_| rng.below(1 << bits) as u32)
        .collect();
    let s: Vec<f32> = (0..ng * outf)
        .map(|k| 0.03125 * ((k % 13) + 1) as f32)
        .collect();
    let qw = u32_bytes(&gptq_pack(&q, inf, outf, bits));
    // qzeros pack along the output dim: pack the transpose, transpose back.
    let zt = transpose(&zf, ng, outf); // [out, ng]
    let zp = gptq_pack(&zt, outf, ng, bits); // [out/32*bits, ng]
    let qz = u32_bytes(&transpose(&zp, outf * bits / 32, ng));
    let sb = f16_bytes(&s);
    GptqCase {
        q,
        zf,
        s,
        qw,
        qz,
        sb,
        inf,
        outf,
        ng,
    }
}

impl GptqCase {
    fn run(
        &self,
        bits: usize,
        g_idx: Option<&[u8]>,
        gs: Option<usize>,
        f: GptqFormat,
    ) -> Result<Vec<f32>> {
        let qws = [self.inf * bits / 32, self.outf];
        let qzs = [self.ng, self.outf * bits / 32];
        let ss = [self.ng, self.outf];
        let gsh = [self.inf];
        gptq(
            st(Dtype::I32, &qws, &self.qw),
            st(Dtype::I32, &qzs, &self.qz),
            st(Dtype::F16, &ss, &self.sb),
            g_idx.map(|b| st(Dtype::I32, &gsh, b)),
            bits as u32,
            gs,
            f,
        )
    }
    fn want(&self, group: impl Fn(usize) -> usize, plus: u32) -> Vec<f32> {
        (0..self.outf * self.inf)
            .map(|k| {
                let (o, i) = (k / self.inf, k % self.inf);
                let j = group(i) * self.outf + o;
                (self.q[i * self.outf + o] as f32 - (self.zf[j] + plus) as f32) * self.s[j]
            })
            .collect()
    }
}

#[test]
fn gptq_v1_v2_zero_points() {
    let c = gptq_case(64, 16, 4, 4, 41);
    let v1 = c.run(4, None, Some(16), GptqFormat::V1).unwrap();
    let v2 = c.run(4, None, Some(16), GptqFormat::V2).unwrap();
    assert_same(&v1, &c.want(|i| i / 16, 1));
    assert_same(&v2, &c.want(|i| i / 16, 0));
    // v1 stores z - 1: a field of 0b1111 means z = 16 (no re-masking after +1).
    assert!(c.zf.contains(&15) || c.zf.contains(&0));
}

#[test]
fn gptq_bit_widths() {
    for (bits, inf, outf, seed) in [
        (2usize, 64usize, 32usize, 1u64),
        (3, 64, 32, 2),
        (4, 32, 8, 3),
        (8, 32, 8, 4),
    ] {
        let c = gptq_case(inf, outf, 2, bits, seed);
        let got = c.run(bits, None, Some(inf / 2), GptqFormat::V1).unwrap();
        assert_same(&got, &c.want(|i| i / (inf / 2), 1));
    }
    // group_size -1 (None): one group.
    let c = gptq_case(64, 32, 1, 3, 9);
    let got = c.run(3, None, None, GptqFormat::V2).unwrap();
    assert_same(&got, &c.want(|_| 0, 0));
}

#[test]
fn gptq_permuted_g_idx() {
    let c = gptq_case(64, 16, 4, 4, 77);
    let gidx: Vec<i32> = (0..64).map(|i| (i * 7 + 3) % 4).collect();
    let gb = i32_bytes(&gidx);
    let got = c.run(4, Some(&gb), Some(16), GptqFormat::V1).unwrap();
    assert_same(&got, &c.want(|i| gidx[i] as usize, 1));
    let mut bad = gidx.clone();
    bad[63] = 4;
    assert_err(
        c.run(4, Some(&i32_bytes(&bad)), Some(16), GptqFormat::V1),
        &["g_idx[63]", "4 groups"],
    );
    assert_err(
        c.run(4, Some(&gb[..8]), Some(16), GptqFormat::V1),
        &["g_idx"],
    );
}

#[test]
fn gptq_bad_input() {
    let c = gptq_case(64, 16, 4, 4, 5);
    let q = |shape: &'static [usize], b: &[u8], dt: Dtype| {
        gptq(
            st(dt, shape, b),
            st(Dtype::I32, &[4, 2], &c.qz),
            st(Dtype::F16, &[4, 16], &c.sb),
            None,
            4,
            Some(16),
            GptqFormat::V1,
        )
    };
    q(&[8, 16], &c.qw, Dtype::I32).unwrap();
    assert_err(q(&[8, 16], &c.qw, Dtype::F32), &["qweight", "F32"]);
    assert_err(
        q(&[8, 16], &c.qw[..500], Dtype::I32),
        &["qweight", "500 bytes"],
    );
    assert_err(
        gptq(
            st(Dtype::I32, &[8, 16], &c.qw),
            st(Dtype::I32, &[4, 2], &c.qz),
            st(Dtype::F16, &[2, 32], &c.sb),
            None,
            4,
            Some(16),
            GptqFormat::V1,
        ),
        &["scales", "[2, 32]", "[4, 16]", "group size of 16"],
    );
    assert_err(
        gptq(
            st(Dtype::I32, &[8, 16], &c.qw),
            st(Dtype::I32, &[2, 4], &c.qz),
            st(Dtype::F16, &[4, 16], &c.sb),
            None,
            4,
            Some(16),
            GptqFormat::V1,
        ),
        &["qzeros", "[2, 4]", "[4, 2]"],
    );
    assert_err(
        gptq(
            st(Dtype::I32, &[8, 16], &c.qw),
            st(Dtype::I32, &[4, 2], &c.qz[..31]),
            st(Dtype::F16, &[4, 16], &c.sb),
            None,
            4,
            Some(16),
            GptqFormat::V1,
        ),
        &["qzeros", "31 bytes"],
    );
    assert_err(
        gptq(
            st(Dtype::I32, &[8, 16], &c.qw),
            st(Dtype::I32, &[4, 2], &c.qz),
            st(Dtype::I32, &[4, 16], &[0; 256]),
            None,
            4,
            Some(16),
            GptqFormat::V1,
        ),
        &["scales", "I32"],
    );
    assert_err(
        gptq(
            st(Dtype::I32, &[8, 16], &c.qw),
            st(Dtype::I32, &[4, 2], &c.qz),
            st(Dtype::F16, &[4, 16], &c.sb),
            None,
            5,
            Some(16),
            GptqFormat::V1,
        ),
        &["bits"],
    );
    // 3-bit qweight rows must come in threes.
    assert_err(
        gptq(
            st(Dtype::I32, &[4, 32], &[0; 512]),
            st(Dtype::I32, &[1, 3], &[0; 12]),
            st(Dtype::F16, &[1, 32], &[0; 64]),
            None,
            3,
            None,
            GptqFormat::V2,
        ),
        &["qweight", "multiple of 3"],
    );
}

// ---------------------------------------------------------------------------------------------
// Fake quantization

#[test]
fn fake_quant_fp8() {
    let table = e4m3_positive();
    let mut x = vec![
        0.0f32, -0.0, 0.0, 0.0, 3.0, -1.7, 0.01, 100.0, 1e-3, -2.5, 7.25, 0.3,
    ];
    let orig = x.clone();
    fake_quant_fp8_per_token(&mut x, 4);
    assert_same(&x[..4], &orig[..4]); // amax 0 row unchanged
    for row in 1..3 {
        let r = &orig[row * 4..row * 4 + 4];
        let amax = r.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = amax / 448.0;
        for (k, &v) in r.iter().enumerate() {
            let want = nearest(&table, v / scale, 448.0) * scale;
            assert!(same(x[row * 4 + k], want), "row {row} col {k}");
        }
    }
    let mut y = vec![1000.0f32, -1000.0, 0.3, f32::NAN];
    fake_quant_fp8_static(&mut y, 1.0);
    assert_eq!(&y[..3], &[448.0, -448.0, 0.3125]);
    assert!(y[3].is_nan());
    let mut y = vec![1000.0f32, 0.3];
    fake_quant_fp8_static(&mut y, 0.5);
    assert_eq!(y, vec![224.0, 0.3125]);
    // cols == 0 is a no-op.
    let mut z = vec![1.1f32];
    fake_quant_fp8_per_token(&mut z, 0);
    assert_eq!(z, vec![1.1]);
}

#[test]
fn fake_quant_int8() {
    let mut x = vec![127.0f32, 63.5, -64.5, 0.5, 1.5, 2.5, -127.0, 0.0];
    fake_quant_int8_per_token(&mut x, 8);
    // scale 1: ties to even.
    assert_eq!(x, vec![127.0, 64.0, -64.0, 0.0, 2.0, 2.0, -127.0, 0.0]);
    let mut x = vec![0.0f32; 3];
    fake_quant_int8_per_token(&mut x, 3);
    assert_eq!(x, vec![0.0; 3]);
    let mut x = vec![2.54f32, 1.0, -0.01, 0.0];
    fake_quant_int8_per_token(&mut x, 2);
    let scale = 2.54f32 / 127.0;
    assert_eq!(x[0], 127.0 * scale);
    assert_eq!(x[1], (1.0f32 / scale).round_ties_even() * scale);
    assert_eq!(&x[2..], &[-0.01, 0.0]); // second row: amax 0.01, scale 0.01/127
}

#[test]
fn fake_quant_nvfp4_blocks() {
    let fp4 = e2m1_positive();
    let e4m3 = e4m3_positive();
    let reference = |v: &[f32], gs: f32| -> Vec<f32> {
        let amax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let mut s = nearest(&e4m3, gs * (amax / 6.0), 448.0);
        if s == 0.0 {
            s = 0.125;
        }
        let scale = s / gs;
        v.iter()
            .map(|&x| nearest(&fp4, (x / scale).clamp(-6.0, 6.0), 6.0) * scale)
            .collect()
    };
    let mut rng = Rng(31);
    let mut x: Vec<f32> = (0..64)
        .map(|_| (rng.below(1 << 16) as f32 / 4096.0 - 8.0) * 0.37)
        .collect();
    // Third block all zeros; fourth block tiny (its FP8 scale underflows to 0 -> eps).
    for v in &mut x[32..48] {
        *v = 0.0;
    }
    for (k, v) in x[48..64].iter_mut().enumerate() {
        *v = (k as f32 - 8.0) * 1e-9;
    }
    let gs = 448.0 * 6.0 / 3.0;
    let orig = x.clone();
    fake_quant_nvfp4(&mut x, 32, gs);
    let want: Vec<f32> = orig.chunks(16).flat_map(|b| reference(b, gs)).collect();
    assert_same(&x, &want);
    assert!(x[32..48].iter().all(|&v| v == 0.0));
    assert!(x[48..64].iter().all(|&v| v == 0.0));
    // Global scale 1, amax 6: block scale 1, values snap to the FP4 grid.
    let mut y = vec![6.0f32, 5.0, 2.5, 0.25, -1.75, -5.5, 0.74, 3.49];
    fake_quant_nvfp4(&mut y, 8, 1.0);
    assert_eq!(y, vec![6.0, 4.0, 2.0, 0.0, -2.0, -6.0, 0.5, 3.0]);
}

#[test]
fn degenerate_shapes_neither_hang_nor_allocate() {
    let big = 1usize << 50;
    // Zero-width tensors with huge leading dims hold no bytes; results are empty.
    let got = gptq(
        st(Dtype::I32, &[big, 0], &[]),
        st(Dtype::I32, &[(big * 8).div_ceil(128), 0], &[]),
        st(Dtype::F16, &[(big * 8).div_ceil(128), 0], &[]),
        None,
        4,
        Some(128),
        GptqFormat::V2,
    );
    assert_eq!(got.unwrap().len(), 0);
    let got = awq_gemm(
        st(Dtype::I32, &[big, 0], &[]),
        st(Dtype::I32, &[big / 128, 0], &[]),
        st(Dtype::F16, &[big / 128, 0], &[]),
        128,
    );
    assert_eq!(got.unwrap().len(), 0);
    let got = ct_pack_quantized(
        st(Dtype::I32, &[big, 0], &[]),
        [big, 0],
        4,
        st(Dtype::F32, &[big, 0], &[]),
        Some(st(Dtype::I32, &[big / 8, 0], &[])),
        None,
        &args(CtStrategy::Group, Some(128), None),
    );
    assert_eq!(got.unwrap().len(), 0);
    let got = ct_dense(
        st(Dtype::I8, &[big, 0], &[]),
        st(Dtype::F32, &[big.div_ceil(128), 0], &[]),
        None,
        &args(CtStrategy::Block, None, Some([128, 128])),
    );
    assert_eq!(got.unwrap().len(), 0);
    assert_eq!(
        mxfp4(st(Dtype::U8, &[big, 0], &[]), st(Dtype::U8, &[big, 0], &[]))
            .unwrap()
            .len(),
        0
    );
    // A huge claimed shape with few bytes is a length error, not an allocation.
    assert_err(
        fp8_block(
            st(Dtype::F8_E4M3, &[big, 4], &[0; 4]),
            st(Dtype::F32, &[big / 128, 1], &[]),
            [128, 128],
            false,
        ),
        &["weight", "4 bytes"],
    );
}
