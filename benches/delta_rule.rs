//! The gated delta rule's throughput (src/runner/native/delta_rule.rs): tokens per second of the
//! recurrent and the chunked form at 2k and 16k tokens, on one Gated DeltaNet layer of a
//! 0.5B-class hybrid shape (16 key heads x 128, 32 value heads x 128), f32 (the f32/bf16 compute
//! modes) and f64. The per-token cost at 16k against 2k shows whether the cost is linear in
//! context. `cargo bench --bench delta_rule`.

#![allow(clippy::print_stdout)]

use std::time::Instant;

use cardproof::runner::native::delta_rule::{self, DeltaFloat, DeltaRuleShape};

/// splitmix64 uniforms in [0, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn values<F: DeltaFloat>(&mut self, n: usize, f: impl Fn(f64) -> f64) -> Vec<F> {
        (0..n).map(|_| F::from_f64(f(self.next()))).collect()
    }
}

struct Inputs<F> {
    shape: DeltaRuleShape,
    q: Vec<F>,
    k: Vec<F>,
    v: Vec<F>,
    g: Vec<F>,
    beta: Vec<F>,
}

fn inputs<F: DeltaFloat>(tokens: usize) -> Inputs<F> {
    let shape = DeltaRuleShape {
        tokens,
        key_heads: 16,
        value_heads: 32,
        key_dim: 128,
        value_dim: 128,
    };
    let mut r = Rng(42);
    let nk = tokens * shape.key_heads * shape.key_dim;
    let nv = tokens * shape.value_heads * shape.value_dim;
    let ng = tokens * shape.value_heads;
    Inputs {
        q: r.values(nk, |u| 2.0 * u - 1.0),
        k: r.values(nk, |u| 2.0 * u - 1.0),
        v: r.values(nv, |u| 2.0 * u - 1.0),
        // log decays in (-0.5, 0]: a slow forgetting, as trained GDN layers mostly have.
        g: r.values(ng, |u| -0.5 * u),
        beta: r.values(ng, |u| 0.2 + 0.6 * u),
        shape,
    }
}

type Form<F> =
    fn(DeltaRuleShape, &[F], &[F], &[F], &[F], &[F], &mut [F]) -> cardproof::Result<Vec<F>>;

/// Best of `reps` runs of `form` from a zero state, in seconds.
fn time<F: DeltaFloat>(x: &Inputs<F>, form: Form<F>, reps: usize) -> f64 {
    let s = x.shape;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let mut state = vec![F::ZERO; s.value_heads * s.key_dim * s.value_dim];
        let t = Instant::now();
        let o = form(s, &x.q, &x.k, &x.v, &x.g, &x.beta, &mut state).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
        assert_eq!(o.len(), s.tokens * s.value_heads * s.value_dim);
    }
    best
}

fn row<F: DeltaFloat>(name: &str, dtype: &str, lengths: &[usize]) {
    let mut per_token = Vec::new();
    for &n in lengths {
        let x = inputs::<F>(n);
        let form: Form<F> = if name == "recurrent" {
            delta_rule::recurrent
        } else {
            delta_rule::chunked
        };
        let _ = time(&x, form, 1);
        let t = time(&x, form, 3);
        per_token.push(t / n as f64);
        // The rule's nominal work, the same for both forms: per token and value head, kᵀS, the
        // rank-1 update and qᵀS, 6 · key_dim · value_dim FLOPs.
        let s = x.shape;
        let flops = 6.0 * (n * s.value_heads * s.key_dim * s.value_dim) as f64;
        println!(
            "{name:9} {dtype} {n:6} tokens: {t:8.3} s  {:9.0} tokens/s  {:6.1} GFLOP/s (nominal)",
            n as f64 / t,
            flops / t / 1e9
        );
    }
    if let [a, .., b] = per_token[..] {
        println!(
            "{name:9} {dtype} cost per token at {} vs {} tokens: {:.2}x",
            lengths[lengths.len() - 1],
            lengths[0],
            b / a
        );
    }
}

fn main() {
    println!(
        "gated delta rule, one layer: 16 key heads x 128, 32 value heads x 128, {} threads",
        rayon::current_num_threads()
    );
    let lengths = [2048, 16384];
    row::<f32>("chunked", "f32", &lengths);
    row::<f32>("recurrent", "f32", &lengths);
    row::<f64>("chunked", "f64", &lengths);
    row::<f64>("recurrent", "f64", &lengths);
}
