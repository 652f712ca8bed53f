//! Any bytes as a whole safetensors file: header parsing must never panic, and a header it accepts
//! must describe tensors that tile the data section exactly, inside the file.
#![no_main]

use std::path::Path;

use cardproof::checkpoint::safetensors::parse_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let size = data.len() as u64;
    let Ok(file) = parse_header(Path::new("fuzz.safetensors"), data, size) else {
        return;
    };
    assert_eq!(file.file_size, size);
    let mut end = 8 + file.header_len;
    for tensor in &file.tensors {
        assert_eq!(
            tensor.data.start, end,
            "tensors must be contiguous: {tensor:?}"
        );
        assert!(
            tensor.data.start <= tensor.data.end && tensor.data.end <= size,
            "{tensor:?}"
        );
        let bits = tensor
            .numel()
            .checked_mul(tensor.dtype.bits())
            .expect("validated numel");
        assert_eq!(bits, tensor.byte_len() * 8, "{tensor:?}");
        end = tensor.data.end;
    }
    assert_eq!(
        end, size,
        "accepted a file with bytes after its last tensor"
    );
});
