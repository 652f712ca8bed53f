//! Any bytes as a GGUF file: the header reader must never panic; a header it accepts must place
//! every tensor inside the file, and reading a prefix must agree with reading the whole.
#![no_main]

use std::path::Path;

use cardproof::checkpoint::gguf::{self, ParseError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.gguf");
    let size = data.len() as u64;
    let whole = gguf::parse(path, data, size);
    if let Ok(file) = &whole {
        assert!(file.data_offset <= size);
        for t in &file.tensors {
            let end = t
                .offset
                .checked_add(t.n_bytes)
                .expect("tensor end overflows");
            assert!(
                t.offset >= file.data_offset && end <= size,
                "tensor outside the file: {t:?}"
            );
            assert_eq!(t.n_bytes, t.numel() / t.ty.block_size() * t.ty.type_size());
        }
    }
    // Half the bytes of the same file: either more is needed, or the same answer.
    let half = &data[..data.len() / 2];
    match gguf::parse_header(path, half, size) {
        Err(ParseError::NeedMore(n)) => assert!(n > half.len() as u64 && n <= size),
        Ok(prefix) => {
            let whole = whole.expect("a prefix parsed but the whole file did not");
            assert_eq!(prefix.tensors, whole.tensors);
            assert_eq!(prefix.metadata.len(), whole.metadata.len());
        }
        Err(ParseError::Malformed(_)) => assert!(whole.is_err()),
    }
});
