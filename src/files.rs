//! Opening input files fail-closed. Only regular files are read: opening a FIFO blocks until a
//! writer appears and a device such as `/dev/zero` never ends, so either would hang a command.
//! Files read whole (configs, tokenizers, cards, indexes) are capped, checked from the metadata
//! and again while reading, since the size can change under us.

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

use crate::error::{Error, ErrorKind, Result};

/// `config.json`, `tokenizer_config.json`, `hf_quant_config.json`: real ones are kilobytes.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// `tokenizer.json`: the largest real ones (262k-token vocabularies) are about 35 MB.
pub const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

/// What a file that is not a regular file is, for messages ("a FIFO").
pub fn kind_name(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    if t.is_symlink() {
        return "a symbolic link";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
    }
    if t.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

/// The error for a path that is not a regular file.
pub fn not_regular(path: &Path, meta: &Metadata) -> Error {
    Error::usage(
        path,
        format!(
            "is {}, not a regular file; cardproof reads regular files only",
            kind_name(meta)
        ),
    )
}

/// Open `path` for reading if it is (or links to) a regular file, and return its metadata. On
/// Unix the open is non-blocking, so a FIFO swapped in after any earlier check cannot hang it;
/// the handle's own metadata decides.
pub fn open_regular(path: &Path) -> Result<(File, Metadata)> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(not_regular(path, &meta));
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
    }
    let file = options.open(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(not_regular(path, &meta));
    }
    Ok((file, meta))
}

/// Read a regular file whole, refusing one over `limit` bytes (`what` names it in the message:
/// "a card", "a tokenizer.json"). Never reads more than `limit + 1` bytes.
pub fn read_capped(path: &Path, limit: u64, what: &'static str) -> Result<Vec<u8>> {
    let too_large = |size: u64| Error::new(path, ErrorKind::TooLarge { size, limit, what });
    let (file, meta) = open_regular(path)?;
    if meta.len() > limit {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_capped`] for a file that may be absent: `Ok(None)` when it does not exist.
pub fn read_capped_if_present(
    path: &Path,
    limit: u64,
    what: &'static str,
) -> Result<Option<Vec<u8>>> {
    match read_capped(path, limit, what) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(Error {
            kind: ErrorKind::NotFound,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A JSON config (`config.json` and the like), read whole under [`MAX_CONFIG_BYTES`].
pub fn read_config(path: &Path) -> Result<serde_json::Value> {
    let bytes = read_capped(path, MAX_CONFIG_BYTES, "a config")?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::format(path, None, format!("not valid JSON: {e}")))
}

/// [`read_config`] for a config that may be absent.
pub fn read_config_if_present(path: &Path) -> Result<Option<serde_json::Value>> {
    match read_config(path) {
        Ok(v) => Ok(Some(v)),
        Err(Error {
            kind: ErrorKind::NotFound,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Write to a fresh temporary file beside `path` (`.NAME.cardproof-tmp-XXXXXX`, unique, so two
/// writers never share one), then rename: a reader never sees a partial file. Errors name `path`
/// and are worded as writes. A set of files that belong together is written as one
/// [`crate::outset::OutputSet`] instead.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(path.file_name().unwrap_or_default());
    prefix.push(".cardproof-tmp-");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder
        .tempfile_in(dir)
        .map_err(|e| Error::write(path, e))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| Error::write(path, e))?;
    tmp.persist(path).map_err(|e| Error::write(path, e.error))?;
    Ok(())
}

/// Why a path a file names is not a file inside that file's directory ([`inside_dir`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outside {
    /// The path is empty.
    NotNamed,
    /// Absolute, or with `..` (or a prefix).
    NotInside,
    /// It does not exist, or cannot be resolved.
    Unreadable,
    /// It resolves (through a link) outside the directory.
    ThroughLink,
    /// It is a directory, a FIFO, a device.
    NotRegular,
}

impl Outside {
    /// The reason as a phrase, `holder` being what names the file (`card`, `study file`).
    pub fn why(self, holder: &str) -> String {
        match self {
            Outside::NotNamed => "is not named".into(),
            Outside::NotInside => format!(
                "is not a path inside the {holder}'s directory, and a {holder} cannot make cardproof read files elsewhere"
            ),
            Outside::Unreadable => format!("is not a readable file in the {holder}'s directory"),
            Outside::ThroughLink => format!(
                "resolves (through a link) outside the {holder}'s directory, and a {holder} cannot make cardproof read files elsewhere"
            ),
            Outside::NotRegular => format!("is not a regular file in the {holder}'s directory"),
        }
    }
}

/// A file that a card or a study file names, as a path inside that file's directory `dir`,
/// resolved. A file that is data never makes cardproof read a file outside its own directory
/// (an absolute path, `..`, or a link out of it): whatever it names is hashed, signed, and for
/// an eval text recoverable from the rows written, so `/proc/self/environ` must not be
/// reachable. Files elsewhere are given by the user's own flags.
pub fn inside_dir(dir: &Path, source: &str) -> std::result::Result<std::path::PathBuf, Outside> {
    let relative = Path::new(source);
    if source.is_empty() {
        return Err(Outside::NotNamed);
    }
    if relative.is_absolute()
        || relative.components().any(|c| {
            !matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        })
    {
        return Err(Outside::NotInside);
    }
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let (Ok(root), Ok(real)) = (dir.canonicalize(), dir.join(relative).canonicalize()) else {
        return Err(Outside::Unreadable);
    };
    if !real.starts_with(&root) {
        return Err(Outside::ThroughLink);
    }
    if !std::fs::metadata(&real).is_ok_and(|m| m.is_file()) {
        return Err(Outside::NotRegular);
    }
    Ok(real)
}

/// Bytes an unprivileged user may still write on the file system holding `path` (`None` when
/// it cannot be read).
#[cfg(unix)]
pub fn free_space(path: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(path).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}

#[cfg(not(unix))]
pub fn free_space(_path: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_over_the_cap_are_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let file = File::create(&path).unwrap();
        // Sparse: the size is what counts, not the bytes on disk.
        file.set_len(MAX_TOKENIZER_BYTES + 1).unwrap();
        let e = read_capped(&path, MAX_TOKENIZER_BYTES, "a tokenizer.json").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("tokenizer.json") && text.contains("limit for a tokenizer.json"),
            "{text}"
        );
        std::fs::write(&path, b"{}").unwrap();
        assert_eq!(
            read_capped(&path, MAX_TOKENIZER_BYTES, "a tokenizer.json").unwrap(),
            b"{}"
        );
        assert!(
            read_capped_if_present(&dir.path().join("absent"), 10, "x")
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_file_named_by_a_card_or_study_file_is_inside_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::fs::write(dir.path().join("data/eval.txt"), b"text").unwrap();
        let real = dir.path().canonicalize().unwrap().join("data/eval.txt");
        assert_eq!(inside_dir(dir.path(), "data/eval.txt"), Ok(real.clone()));
        assert_eq!(inside_dir(dir.path(), "./data/eval.txt"), Ok(real));
        for (source, why) in [
            ("", Outside::NotNamed),
            ("/proc/self/environ", Outside::NotInside),
            ("../eval.txt", Outside::NotInside),
            ("data/../data/eval.txt", Outside::NotInside),
            ("missing.txt", Outside::Unreadable),
            ("data", Outside::NotRegular),
        ] {
            assert_eq!(inside_dir(dir.path(), source), Err(why), "{source}");
        }
        #[cfg(unix)]
        {
            let elsewhere = tempfile::tempdir().unwrap();
            std::fs::write(elsewhere.path().join("secret"), b"s").unwrap();
            std::os::unix::fs::symlink(elsewhere.path().join("secret"), dir.path().join("out.txt"))
                .unwrap();
            assert_eq!(inside_dir(dir.path(), "out.txt"), Err(Outside::ThroughLink));
        }
        assert!(
            Outside::NotInside
                .why("study file")
                .contains("a study file cannot make cardproof read files elsewhere")
        );
    }

    #[cfg(unix)]
    #[test]
    #[allow(clippy::print_stderr)] // the visible skip when mkfifo is missing
    fn a_fifo_or_a_device_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = read_capped(&link, 10, "a config").unwrap_err().to_string();
        assert!(e.contains("character device"), "{e}");
        let fifo = dir.path().join("pipe.json");
        match std::process::Command::new("mkfifo").arg(&fifo).status() {
            Ok(s) if s.success() => {
                let e = read_capped(&fifo, 10, "a config").unwrap_err().to_string();
                assert!(e.contains("FIFO") && e.contains("pipe.json"), "{e}");
                let e = open_regular(&fifo).unwrap_err().to_string();
                assert!(e.contains("FIFO"), "{e}");
            }
            _ => eprintln!("SKIPPED the FIFO case: mkfifo is not available"),
        }
    }
}
