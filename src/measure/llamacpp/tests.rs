use std::path::Path;
use super::*;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures/llamacpp/");

#[test]
fn explore() {
    let r = BaseFile::open(&Path::new(DIR).join("ref.kld")).unwrap();
    for (c, t) in [("cand-q5_0.kld", "kld-q5_0.txt"), ("cand-q6_k.kld", "kld-q6_k.txt")] {
        let cf = BaseFile::open(&Path::new(DIR).join(c)).unwrap();
        let s = compare_base_files(&r, &cf).unwrap();
        let text = std::fs::read_to_string(Path::new(DIR).join(t)).unwrap();
        let p = parse_printed(&text);
        eprintln!("{}", s.render());
        eprintln!("{:?}", p);
        let rendered = s.render();
        for (a, b) in rendered.lines().zip(text.lines()) {
            eprintln!("{} {a}\n  {b}", if a == b { "==" } else { "!=" });
        }
        eprintln!("{s:?}");
    }
}
