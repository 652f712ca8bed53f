//! Arbitrary bytes as a logit dump: opening it as a `kld` source must never panic, and an accepted
//! file must yield every row without reading outside the map.
#![no_main]

use cardproof::kld::source::LogitSource;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("dump.safetensors");
    std::fs::write(&path, data).expect("write");
    for context_length in [None, Some(4)] {
        let Ok(source) = LogitSource::open(&path, context_length) else { continue };
        assert_eq!(source.meta.len(), source.rows);
        let mut buf = Vec::new();
        for r in 0..source.rows.min(64) {
            let row = source.row(r, &mut buf);
            assert_eq!(row.len(), source.vocab);
        }
    }
});
