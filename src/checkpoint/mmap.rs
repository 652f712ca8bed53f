//! The one module allowed `unsafe`: read-only memory maps of checkpoint files.
#![allow(unsafe_code)]

use std::path::Path;

use crate::error::{Error, Result};

/// A read-only view of a whole file. Empty files map to an empty slice.
pub struct MappedFile {
    map: Option<memmap2::Mmap>,
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
        // not expected to change under a reader, and every parse copies what it keeps.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Ok(MappedFile { map: Some(map) })
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
        self.map.as_deref().unwrap_or(&[])
    }
}
