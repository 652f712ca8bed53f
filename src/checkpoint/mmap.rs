//! The one module allowed `unsafe`: read-only memory maps of checkpoint files.
#![allow(unsafe_code)]

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};

/// A read-only view of a whole file. Empty files map to an empty slice.
pub struct MappedFile {
    /// Shared so that views ([`MappedF32`]) can outlive the file's parser.
    map: Option<Arc<memmap2::Mmap>>,
}

/// Little-endian f32 values read in place from a mapped file: a weight the forward pass uses
/// as stored, without a copy (no fresh pages to fault in, none to zero). Keeps the map alive.
#[derive(Clone)]
pub struct MappedF32 {
    map: Arc<memmap2::Mmap>,
    /// Byte offset of the first value: a multiple of 4 from a page-aligned map, so aligned.
    start: usize,
    len: usize,
}

impl MappedF32 {
    pub fn as_slice(&self) -> &[f32] {
        // Alignment, bounds and length were checked in `MappedFile::f32_view`.
        bytemuck::cast_slice(&self.map[self.start..self.start + self.len * 4])
    }
}

/// Bytes read in place from a mapped file (a quantized weight's blocks, which the native
/// runner's one-row product reads as stored). Keeps the map alive.
#[derive(Clone)]
pub struct MappedBytes {
    map: Arc<memmap2::Mmap>,
    start: usize,
    len: usize,
}

impl MappedBytes {
    pub fn as_slice(&self) -> &[u8] {
        // Bounds were checked in `MappedFile::bytes_view`.
        &self.map[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for MappedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MappedBytes {{ start: {}, len: {} }}",
            self.start, self.len
        )
    }
}

impl std::fmt::Debug for MappedF32 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MappedF32 {{ start: {}, len: {} }}",
            self.start, self.len
        )
    }
}

impl MappedFile {
    /// Regular files only (a FIFO or a device would block or never end).
    pub fn open(path: &Path) -> Result<MappedFile> {
        let (file, meta) = crate::files::open_regular(path)?;
        let len = meta.len();
        if len == 0 {
            return Ok(MappedFile { map: None });
        }
        // SAFETY: the map is read-only and private to this process. If another process truncates
        // the file while it is mapped, reads past the new end fault (SIGBUS); checkpoint files are
        // not expected to change under a reader. Every parse copies what it keeps, except the
        // f32 views (`f32_view`) the native runner computes from for a whole run; it refuses a
        // model whose file changed meanwhile (`NativeModel::check_unchanged`).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Ok(MappedFile {
            map: Some(Arc::new(map)),
        })
    }

    /// `len` f32 values stored little-endian at byte `start`, read in place; `None` where they
    /// cannot be (a big-endian host, an unaligned offset, a range outside the file), and the
    /// caller copies instead.
    pub fn f32_view(&self, start: usize, len: usize) -> Option<MappedF32> {
        let map = self.map.as_ref()?;
        let end = len.checked_mul(4).and_then(|b| b.checked_add(start))?;
        let bytes = map.get(start..end)?;
        let aligned = bytemuck::try_cast_slice::<u8, f32>(bytes).is_ok();
        (cfg!(target_endian = "little") && aligned).then(|| MappedF32 {
            map: Arc::clone(map),
            start,
            len,
        })
    }

    /// `len` bytes at byte `start`, read in place; `None` for a range outside the file.
    pub fn bytes_view(&self, start: usize, len: usize) -> Option<MappedBytes> {
        let map = self.map.as_ref()?;
        let end = start.checked_add(len)?;
        map.get(start..end)?;
        Some(MappedBytes {
            map: Arc::clone(map),
            start,
            len,
        })
    }

    /// Tell the kernel the whole file will be read soon (logit files are read end to end):
    /// readahead and fewer page faults. Advice only; failure changes nothing.
    pub fn will_need(&self) {
        if let Some(map) = &self.map {
            #[cfg(unix)]
            let _ = map.advise(memmap2::Advice::WillNeed);
        }
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().map_or(&[], |m| &m[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_views_are_aligned_and_inside_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("values.bin");
        let values: Vec<u8> = [1.5f32, -2.0, 3.25, 0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(&path, [&[0u8; 4][..], &values].concat()).unwrap();
        let map = MappedFile::open(&path).unwrap();
        let view = map.f32_view(4, 4).unwrap();
        assert_eq!(view.as_slice(), [1.5, -2.0, 3.25, 0.0]);
        assert_eq!(map.f32_view(8, 3).unwrap().as_slice(), [-2.0, 3.25, 0.0]);
        // Unaligned, past the end, or overflowing: no view (the caller copies and checks).
        assert!(map.f32_view(2, 1).is_none());
        assert!(map.f32_view(4, 5).is_none());
        assert!(map.f32_view(usize::MAX - 3, 1).is_none());
        assert!(map.f32_view(0, usize::MAX).is_none());
    }
}
