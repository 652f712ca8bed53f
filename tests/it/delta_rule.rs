//! The native runner's gated delta rule against transformers' own torch implementation
//! (`torch_chunk_gated_delta_rule` / `torch_recurrent_gated_delta_rule` of Qwen3.5) and an
//! independent numpy float64 transcription, recorded in tests/fixtures/delta_rule by the
//! `make.py` beside them.

use std::path::PathBuf;

use cardproof::runner::native::delta_rule::{self, DeltaRuleShape};
use safetensors::SafeTensors;
use safetensors::tensor::Dtype;

const CASES: [usize; 5] = [1, 63, 64, 65, 130];

fn read(tokens: usize) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/delta_rule/t{tokens}.safetensors"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(t.dtype(), Dtype::F32, "{name}");
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn f64s(st: &SafeTensors, name: &str) -> Vec<f64> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(t.dtype(), Dtype::F64, "{name}");
    t.data()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn max_abs<F: Copy + Into<f64>>(a: &[F], b: &[F]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x.into() - y.into()).abs())
        .fold(0.0, f64::max)
}

struct Case {
    shape: DeltaRuleShape,
    inputs: [Vec<f32>; 6],
}

fn case(st: &SafeTensors, tokens: usize) -> Case {
    let shape = DeltaRuleShape {
        tokens,
        key_heads: 2,
        value_heads: 4,
        key_dim: 16,
        value_dim: 8,
    };
    assert_eq!(st.tensor("q").unwrap().shape(), [tokens, 2, 16]);
    assert_eq!(st.tensor("state").unwrap().shape(), [4, 16, 8]);
    let inputs = ["q", "k", "v", "g", "beta", "state"].map(|n| f32s(st, n));
    Case { shape, inputs }
}

type Form<F> =
    fn(DeltaRuleShape, &[F], &[F], &[F], &[F], &[F], &mut [F]) -> cardproof::error::Result<Vec<F>>;

fn run<F: Copy>(c: &Case, form: Form<F>, conv: fn(f32) -> F) -> (Vec<F>, Vec<F>) {
    let [q, k, v, g, beta, state] = c
        .inputs
        .each_ref()
        .map(|x| x.iter().map(|&x| conv(x)).collect::<Vec<F>>());
    let mut state = state;
    let o = form(c.shape, &q, &k, &v, &g, &beta, &mut state).unwrap();
    (o, state)
}

#[test]
fn delta_rule_f32_matches_transformers_chunked_and_recurrent_within_1e_5() {
    for tokens in CASES {
        let bytes = read(tokens);
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let c = case(&st, tokens);
        for (form, name) in [
            (delta_rule::chunked as Form<f32>, "chunked"),
            (delta_rule::recurrent, "recurrent"),
        ] {
            let (o, s) = run(&c, form, |x| x);
            // Each of our forms against each of transformers' forms.
            for theirs in ["chunked", "recurrent"] {
                let d = max_abs(&o, &f32s(&st, &format!("{theirs}_o")));
                assert!(
                    d < 1e-5,
                    "t{tokens}: our {name} vs torch {theirs}: output off by {d:e}"
                );
                let d = max_abs(&s, &f32s(&st, &format!("{theirs}_state")));
                assert!(
                    d < 1e-5,
                    "t{tokens}: our {name} vs torch {theirs}: state off by {d:e}"
                );
            }
            assert!(
                o.iter().any(|&x| x.abs() > 1e-3),
                "t{tokens}: a real output"
            );
        }
    }
}

#[test]
fn delta_rule_f64_matches_a_numpy_float64_recurrence_within_1e_12() {
    for tokens in CASES {
        let bytes = read(tokens);
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let c = case(&st, tokens);
        let (want_o, want_s) = (f64s(&st, "f64_o"), f64s(&st, "f64_state"));
        for (form, name) in [
            (delta_rule::chunked as Form<f64>, "chunked"),
            (delta_rule::recurrent, "recurrent"),
        ] {
            let (o, s) = run(&c, form, f64::from);
            let d = max_abs(&o, &want_o);
            assert!(d < 1e-12, "t{tokens}: {name} f64 output off by {d:e}");
            let d = max_abs(&s, &want_s);
            assert!(d < 1e-12, "t{tokens}: {name} f64 state off by {d:e}");
            // The f32 torch outputs are much further away: the f64 path is not f32 in disguise.
            let torch = f32s(&st, "recurrent_o");
            let off = max_abs(&o, &torch.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
            assert!(
                off > 1e-12,
                "t{tokens}: f64 result equals torch's f32 one ({off:e})"
            );
        }
    }
}
