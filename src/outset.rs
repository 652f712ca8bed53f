//! Output sets: every file one `verify` or `measure` run writes into `--out`, as one unit.
//!
//! A set is written whole into a fresh temporary directory beside `--out` (same parent, so the
//! same filesystem), named `.cardproof-tmp.<run id>.<name of --out>`, and moved into place by
//! renaming that directory: a reader sees the previous set or the new one, never a mix, and a run
//! that fails or is killed (SIGINT and SIGTERM are not caught: a killed process runs no cleanup)
//! leaves at most that hidden temporary directory, which the next run into the same `--out`
//! removes. The policy for what `--out` already holds:
//!
//! * nothing, or an empty directory: the set is renamed into place;
//! * an earlier cardproof set (every entry a file name a cardproof run writes, the older
//!   versions' `*.partial` temporaries included, or a directory of such files: a sweep's pairs):
//!   replaced as a unit: the old set is renamed aside (`.cardproof-old.<run id>.<name>`), the new
//!   one renamed in, the old one removed. For the instant between the two renames `--out` is
//!   absent, never mixed;
//! * anything else (another file, a symbolic link inside it): refused before any work, unless
//!   `force`, which replaces the whole directory the same way (its old contents are deleted);
//! * a file, the working directory (or a directory holding it), the root, a checkpoint being
//!   measured or a directory holding one: always refused.
//!
//! `--out` is resolved to its real path first (symbolic links and `..` of the nearest existing
//! ancestor, the rest appended), so no spelling of a path reaches into a checkpoint
//! ([`outside_checkpoints`]). An exclusive lock (`.<name>.cardproof-lock` in the parent, taken
//! with `try_lock` before any work and removed when the run ends) keeps two runs from writing one
//! `--out`: the second fails at once. Creating the lock, the temporary directory and its marker
//! up front is also the writability check: a read-only or missing parent fails before the rerun.
//!
//! Every file of a set carries the same run id (a random UUID v4): `run_id` in report.json and so
//! in the signed statement, in measurement.json and sweep.json; report.md and report.html show it.
//! The marker `.cardproof-set.json` lists the run id and every file's size and SHA-256;
//! [`check_set`] (`verify-report`) refuses an envelope whose neighbours belong to another run.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::error::{Error, Result};

/// The set's marker: run id, kind and every file's digest.
pub const MARKER: &str = ".cardproof-set.json";
/// Prefix of a run's temporary directory (beside `--out`).
pub const TMP_PREFIX: &str = ".cardproof-tmp.";
/// Prefix of the previous set while it is being replaced.
pub const OLD_PREFIX: &str = ".cardproof-old.";
const LOCK_SUFFIX: &str = ".cardproof-lock";
/// The files a cardproof run (or `sign`) writes into a set (the one list every checkpoint reader
/// leaves out, [`crate::checkpoint::members`]).
pub const SET_FILES: &[&str] = crate::checkpoint::members::REPORT_SET_FILES;
/// An interrupted study's record in its incomplete set (no study.json, nothing signed): what
/// ran, what failed, what `study --resume` carries.
pub const INCOMPLETE: &str = "study.incomplete.json";

/// Whether `name` is a file a cardproof set holds: one of [`SET_FILES`], a carried arm's rows, or
/// an older version's `*.partial`.
fn is_set_file(name: &str) -> bool {
    crate::checkpoint::members::is_report_file(name) || name.ends_with(".partial")
}

/// A study's arms: `arms/<name>/` holding each arm's measurement set.
const ARMS_DIR: &str = "arms";
/// A directory beside an envelope with more entries than this is not a report set.
pub(crate) const MAX_SET_ENTRIES: usize = 100_000;
/// For tests (a full disk cannot be made on demand): the free bytes cardproof assumes the file
/// system of `--out` has, instead of asking it.
pub const FREE_SPACE_ENV: &str = "CARDPROOF_FREE_SPACE_BYTES";

/// One file of a set and its SHA-256, as the signed statement binds it (`set_files` of the
/// predicate: every file of the set but the signed document itself, the envelope and the
/// marker).
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct SetFile {
    /// Relative to the set's directory, forward slashes.
    pub path: String,
    pub sha256: String,
}
/// Documents read beside an envelope are refused above this (as envelopes are).
const MAX_DOCUMENT: u64 = 64 * 1024 * 1024;
/// A run id: 8-4-4-4-12 hex digits.
const RUN_ID_LEN: usize = 36;

/// What a set holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `verify`: the report, its envelope and renderings, the measurement.
    Verify,
    /// `measure`: measurement.json and positions.safetensors, or a sweep.
    Measure,
    /// `study`: study.json and its renderings and envelope, each arm's measurement.
    Study,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Verify => "verify",
            Kind::Measure => "measure",
            Kind::Study => "study",
        }
    }
}

/// How to open a set.
pub struct SetOptions<'a> {
    pub kind: Kind,
    /// Replace an `--out` that holds other files than a cardproof set.
    pub force: bool,
    /// The checkpoints the run reads: `--out` must be neither inside one nor hold one.
    pub models: &'a [&'a Path],
}

/// An open set: its temporary directory, the lock on `--out` and the run id. Dropped without
/// [`OutputSet::commit`], it removes its temporary directory and `--out` is untouched.
pub struct OutputSet {
    /// `--out` as given, for messages and the paths printed.
    out: PathBuf,
    /// Its real path.
    target: PathBuf,
    parent: PathBuf,
    name: OsString,
    dir: tempfile::TempDir,
    lock: Lock,
    run_id: String,
    kind: Kind,
    force: bool,
}

impl OutputSet {
    /// Check `--out` against the policy, take its lock, remove what killed runs left, and create
    /// the temporary directory with its marker. Any failure here is before any work.
    pub fn create(out: &Path, options: &SetOptions) -> Result<OutputSet> {
        let target = real_path(out)?;
        outside_checkpoints(out, options.models)?;
        let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
            return Err(Error::usage(
                out,
                "is the root directory; --out names a directory cardproof creates or replaces",
            ));
        };
        if let Ok(cwd) = std::env::current_dir().and_then(|d| d.canonicalize())
            && cwd.starts_with(&target)
        {
            return Err(Error::usage(
                out,
                "is the working directory or holds it; --out names a directory cardproof \
                 creates or replaces as a whole",
            ));
        }
        let (parent, name) = (parent.to_owned(), name.to_owned());
        fs::create_dir_all(&parent).map_err(|e| {
            // `mkdir` says "File exists" for a file in the way; say which one.
            match parent.ancestors().find(|a| fs::symlink_metadata(a).is_ok()) {
                Some(a) if !a.is_dir() => Error::write(
                    out,
                    std::io::Error::other(format!("{} is a file, not a directory", a.display())),
                ),
                _ => Error::write(out, e),
            }
        })?;
        let lock = Lock::acquire(&parent.join(dotted(&name, LOCK_SUFFIX)), out)?;
        existing(&target, out, options.force)?;
        remove_stale(&parent, &name);
        let run_id = new_run_id(out)?;
        let mut builder = tempfile::Builder::new();
        let prefix = set_dir_name(TMP_PREFIX, &run_id, &name);
        builder.prefix(&prefix).rand_bytes(0);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(fs::Permissions::from_mode(0o777));
        }
        let dir = builder
            .tempdir_in(&parent)
            .map_err(|e| Error::write(out, e))?;
        let set = OutputSet {
            out: out.to_owned(),
            target,
            parent,
            name,
            dir,
            lock,
            run_id,
            kind: options.kind,
            force: options.force,
        };
        // The marker, marked incomplete: it also proves the directory takes a write.
        set.write_marker(&json!({
            "schema_version": crate::JSON_SCHEMA_VERSION,
            "kind": set.kind.as_str(),
            "run_id": set.run_id,
            "complete": false,
        }))?;
        Ok(set)
    }

    /// The temporary directory: every file of the set is written here.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `--out` as given.
    pub fn out(&self) -> &Path {
        &self.out
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Write `rel` into the set.
    pub fn write(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        let path = self.dir().join(rel);
        if let Some(d) = path.parent() {
            fs::create_dir_all(d).map_err(|e| Error::write(&self.out.join(rel), e))?;
        }
        fs::write(&path, bytes).map_err(|e| Error::write(&self.out.join(rel), e))
    }

    /// Write `document` (with this run's id, see [`with_run_id`]) as pretty JSON to `rel`;
    /// returns what was written.
    pub fn write_json(&self, rel: &str, document: &Value) -> Result<Value> {
        let document = with_run_id(document, &self.run_id);
        let mut text = serde_json::to_vec_pretty(&document)
            .map_err(|e| Error::internal(&self.out.join(rel), format!("cannot encode: {e}")))?;
        text.push(b'\n');
        self.write(rel, &text)?;
        Ok(document)
    }

    /// Every file written into the set so far (the marker left out) with its SHA-256, sorted:
    /// what the signed statement binds, so that no file of the set (report.md, report.html,
    /// positions, measurements) can be rewritten after signing.
    pub fn set_files(&self) -> Result<Vec<SetFile>> {
        set_files(self.dir()).map_err(|e| match e.kind {
            crate::ErrorKind::Io(io) => Error::write(&self.out, io),
            _ => e,
        })
    }

    /// Refuse (exit 2, naming `--out`) a set of about `estimate` bytes that the file system of
    /// `--out` has no room for, before the rerun that would fill it. When the free space cannot
    /// be read the run goes ahead (the write still fails closed, later).
    pub fn check_space(&self, estimate: u64) -> Result<()> {
        let free = match std::env::var(FREE_SPACE_ENV) {
            Ok(v) => Some(v.trim().parse::<u64>().map_err(|_| {
                Error::usage(
                    Path::new(FREE_SPACE_ENV),
                    format!("is `{v}`, not a number of bytes"),
                )
            })?),
            Err(_) => crate::files::free_space(self.dir()),
        };
        match free {
            Some(free) if free < estimate => Err(Error::write(
                &self.out,
                std::io::Error::other(format!(
                    "its file system has {} free, and this run's output set needs about {} \
                     (positions.safetensors holds every scored row); free some space or choose \
                     another --out",
                    bytes(free),
                    bytes(estimate)
                )),
            )),
            _ => Ok(()),
        }
    }

    fn write_marker(&self, marker: &Value) -> Result<()> {
        let text = serde_json::to_vec_pretty(marker).unwrap_or_default();
        self.write(MARKER, &text)
    }

    /// Seal the set (the marker lists every file with its SHA-256), flush it to disk and move it
    /// into place as one unit. Returns the files, as paths under `--out`.
    pub fn commit(self) -> Result<Vec<PathBuf>> {
        self.seal(true)
    }

    /// [`OutputSet::commit`] for an interrupted study's completed arms: the marker says
    /// `complete: false` and names [`INCOMPLETE`]; nothing in it is signed, and only `study
    /// --resume` reads it back ([`read_incomplete`]).
    pub fn commit_incomplete(self) -> Result<Vec<PathBuf>> {
        self.seal(false)
    }

    fn seal(self, complete: bool) -> Result<Vec<PathBuf>> {
        let files = list_files(self.dir()).map_err(|e| Error::write(&self.out, e))?;
        let mut listed = Vec::new();
        for rel in &files {
            let path = self.dir().join(rel);
            let file = File::open(&path).map_err(|e| Error::write(&self.out.join(rel), e))?;
            file.sync_all()
                .map_err(|e| Error::write(&self.out.join(rel), e))?;
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            listed.push(json!({
                "path": rel,
                "size": size,
                "sha256": crate::checkpoint::hash::hash_file(&path)?,
            }));
        }
        let mut marker = json!({
            "schema_version": crate::JSON_SCHEMA_VERSION,
            "kind": self.kind.as_str(),
            "run_id": self.run_id,
            "complete": complete,
            "files": listed,
        });
        if !complete {
            marker["incomplete"] = INCOMPLETE.into();
        }
        self.write_marker(&marker)?;
        let replace = existing(&self.target, &self.out, self.force)?;
        let OutputSet {
            out,
            target,
            parent,
            name,
            dir,
            lock,
            run_id,
            ..
        } = self;
        let tmp = dir.keep();
        let fail = |e: std::io::Error| {
            let _ = fs::remove_dir_all(&tmp);
            Error::write(&out, e)
        };
        if replace {
            let old = parent.join(set_dir_name(OLD_PREFIX, &run_id, &name));
            fs::rename(&target, &old).map_err(fail)?;
            if let Err(e) = fs::rename(&tmp, &target) {
                let _ = fs::rename(&old, &target);
                return Err(fail(e));
            }
            // What cannot be removed now is removed by the next run.
            let _ = fs::remove_dir_all(&old);
        } else {
            fs::rename(&tmp, &target).map_err(fail)?;
        }
        if let Ok(d) = File::open(&parent) {
            let _ = d.sync_all();
        }
        drop(lock);
        Ok(files.iter().map(|f| out.join(f)).collect())
    }
}

/// `n` bytes, for people.
fn bytes(n: u64) -> String {
    format!("{n} bytes ({:.1} MiB)", n as f64 / (1024.0 * 1024.0))
}

/// `document` with `"run_id"` placed after `schema_version` (first, without one), replacing any
/// run id it had. Anything but an object is returned as it is.
pub fn with_run_id(document: &Value, run_id: &str) -> Value {
    let Some(object) = document.as_object() else {
        return document.clone();
    };
    let mut out = Map::new();
    if !object.contains_key("schema_version") {
        out.insert("run_id".into(), run_id.into());
    }
    for (k, v) in object {
        if k == "run_id" {
            continue;
        }
        out.insert(k.clone(), v.clone());
        if k == "schema_version" {
            out.insert("run_id".into(), run_id.into());
        }
    }
    Value::Object(out)
}

/// A fresh run id: a random UUID v4 from the operating system's generator.
pub fn new_run_id(out: &Path) -> Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| {
        Error::new(
            out,
            crate::ErrorKind::Io(std::io::Error::other(format!(
                "the system random number generator failed: {e}"
            ))),
        )
    })?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = crate::digest::hex(&b);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

/// `path` as it will be reached once created: walked from the root, each component that exists
/// resolved by the filesystem (symbolic links, and `..` after them), each that does not yet exist
/// kept as written, with `.` dropped and `..` taking back the last of those (they will be plain
/// directories, never links). So `LINK/sub`, `x/../LINK/sub` and `new/../../LINK` all end where
/// the filesystem will put them.
pub fn real_path(path: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
    let mut real = PathBuf::new();
    let mut pending: Vec<&OsStr> = Vec::new();
    for part in absolute.components() {
        match part {
            Component::Prefix(_) | Component::RootDir => real.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if pending.pop().is_none() {
                    real.pop();
                }
            }
            Component::Normal(name) if pending.is_empty() => {
                let next = real.join(name);
                if fs::symlink_metadata(&next).is_ok() {
                    real = next.canonicalize().map_err(|e| {
                        Error::usage(
                            path,
                            format!(
                                "{} exists but cannot be resolved ({e}): a dangling symbolic link?",
                                next.display()
                            ),
                        )
                    })?;
                } else {
                    pending.push(name);
                }
            }
            Component::Normal(name) => pending.push(name),
        }
    }
    real.extend(pending);
    Ok(real)
}

/// Outputs never go into a checkpoint being read (its digest would change), and never into a
/// directory holding one (replacing the set would delete it). Both sides are compared as real
/// paths ([`real_path`]), so `LINK/sub` with LINK a link to the checkpoint, or `x/../cand`, are
/// caught. A model that is not on disk (an `hf:` source before its download) is skipped; check
/// again with the downloaded snapshot.
pub fn outside_checkpoints(out: &Path, models: &[&Path]) -> Result<()> {
    let target = real_path(out)?;
    for model in models {
        let dir = if model.is_file() {
            model.parent().unwrap_or(Path::new("."))
        } else {
            model
        };
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let Ok(real) = dir.canonicalize() else {
            continue;
        };
        if target.starts_with(&real) {
            return Err(Error::usage(
                out,
                format!(
                    "is inside the checkpoint {} (it resolves to {}); write the outputs elsewhere",
                    model.display(),
                    target.display()
                ),
            ));
        }
        if real.starts_with(&target) {
            return Err(Error::usage(
                out,
                format!(
                    "holds the checkpoint {}; write the outputs elsewhere",
                    model.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Whether `target` holds something to replace (`true`), nothing (`false`), or must not be
/// touched (an error naming what is there).
fn existing(target: &Path, out: &Path, force: bool) -> Result<bool> {
    match fs::symlink_metadata(target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::write(out, e)),
        Ok(m) if m.is_dir() => match foreign_entry(target, "").map_err(|e| Error::io(out, e))? {
            Some(name) if !force => Err(Error::usage(
                out,
                format!(
                    "holds `{name}`, which is not a file of a cardproof report set; choose another \
                     --out, or pass --force to replace the whole directory (its contents are \
                     deleted)"
                ),
            )),
            _ => Ok(true),
        },
        Ok(_) => Err(Error::usage(
            out,
            "is a file, not a directory: --out names the directory the outputs go into",
        )),
    }
}

/// The first entry of `dir` that a cardproof set does not hold, as a path relative to `--out`
/// (`rel` is `dir`'s). A set holds set files, and at its top directories of them: a sweep's
/// pairs, and a study's `arms/`, whose entries are the arms' directories of set files.
fn foreign_entry(dir: &Path, rel: &str) -> std::io::Result<Option<String>> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let text = name.to_string_lossy();
        let path = if rel.is_empty() {
            text.clone().into_owned()
        } else {
            format!("{rel}/{text}")
        };
        let kind = entry.file_type()?;
        let may_hold_directories = rel.is_empty() || rel == ARMS_DIR;
        if kind.is_dir() && may_hold_directories {
            // The first entry inside that is not the set's (named by its path).
            if let Some(inner) = foreign_entry(&entry.path(), &path)? {
                return Ok(Some(inner));
            }
        } else if !(kind.is_file() && is_set_file(&text)) {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// Remove the temporary and replaced sets of killed runs into this `--out` (the lock is held,
/// so none of them is in use).
fn remove_stale(parent: &Path, name: &OsStr) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let bytes = file_name.as_encoded_bytes();
        for prefix in [TMP_PREFIX, OLD_PREFIX] {
            let Some(rest) = bytes.strip_prefix(prefix.as_bytes()) else {
                continue;
            };
            let is_ours = rest.len() > RUN_ID_LEN + 1
                && rest[..RUN_ID_LEN]
                    .iter()
                    .all(|b| b.is_ascii_hexdigit() || *b == b'-')
                && rest[RUN_ID_LEN] == b'.'
                && &rest[RUN_ID_LEN + 1..] == name.as_encoded_bytes();
            if is_ours {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

fn set_dir_name(prefix: &str, run_id: &str, name: &OsStr) -> OsString {
    let mut s = OsString::from(prefix);
    s.push(run_id);
    s.push(".");
    s.push(name);
    s
}

fn dotted(name: &OsStr, suffix: &str) -> OsString {
    let mut s = OsString::from(".");
    s.push(name);
    s.push(suffix);
    s
}

/// Files under `dir`, relative, with forward slashes, sorted; the marker left out.
fn list_files(dir: &Path) -> std::io::Result<Vec<String>> {
    fn go(dir: &Path, prefix: &str, out: &mut Vec<String>) -> std::io::Result<()> {
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = format!("{prefix}{name}");
            if entry.file_type()?.is_dir() {
                go(&entry.path(), &format!("{rel}/"), out)?;
            } else if rel != MARKER {
                out.push(rel);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    go(dir, "", &mut out)?;
    out.sort();
    Ok(out)
}

/// The exclusive lock on one `--out`: a lock file beside it, held for the run.
struct Lock {
    #[allow(dead_code)]
    file: File,
    path: PathBuf,
}

impl Lock {
    fn acquire(path: &Path, out: &Path) -> Result<Lock> {
        // A run that ends removes its lock file; one that opened it just before must lock the
        // file that is at the path now, not the removed one.
        for _ in 0..16 {
            let mut options = OpenOptions::new();
            options.read(true).write(true).create(true).truncate(false);
            // Never through a link: a link planted as the lock would have its target created.
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
            }
            let not_a_lock = |what: &str| {
                Error::usage(
                    out,
                    format!(
                        "its lock {} is {what}, not a lock file cardproof made; cardproof does not follow or open it (remove it if it is not yours)",
                        path.display()
                    ),
                )
            };
            if let Ok(m) = fs::symlink_metadata(path)
                && !m.is_file()
            {
                return Err(not_a_lock(crate::files::kind_name(&m)));
            }
            let file = options.open(path).map_err(|e| {
                #[cfg(unix)]
                if e.raw_os_error() == Some(libc::ELOOP) {
                    return not_a_lock("a symbolic link");
                }
                Error::write(out, e)
            })?;
            match file.metadata() {
                Ok(m) if m.is_file() => {}
                Ok(m) => return Err(not_a_lock(crate::files::kind_name(&m))),
                Err(e) => return Err(Error::write(out, e)),
            }
            match file.try_lock() {
                Ok(()) => {}
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(Error::usage(
                        out,
                        format!(
                            "another cardproof run is writing this --out (it holds the lock {}); \
                             wait for it to finish or choose another --out",
                            path.display()
                        ),
                    ));
                }
                Err(fs::TryLockError::Error(e)) => return Err(Error::write(out, e)),
            }
            if same_file(&file, path) {
                return Ok(Lock {
                    file,
                    path: path.to_owned(),
                });
            }
        }
        Err(Error::usage(
            out,
            format!("cannot take the lock {}: it keeps changing", path.display()),
        ))
    }
}

#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_: &File, _: &Path) -> bool {
    true
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Removed while still held (the file closes after this), so the next run's check above
        // sees either this file, locked, or none.
        #[cfg(unix)]
        let _ = fs::remove_file(&self.path);
    }
}

/// Every file under `dir` but the marker, with its SHA-256, sorted by path.
pub fn set_files(dir: &Path) -> Result<Vec<SetFile>> {
    let files = list_files(dir).map_err(|e| Error::io(dir, e))?;
    files
        .into_iter()
        .map(|rel| {
            let sha256 = crate::checkpoint::hash::hash_file(&dir.join(&rel))?;
            Ok(SetFile { path: rel, sha256 })
        })
        .collect()
}

/// For `sign`: the files of the set `document` sits in, to be bound with it. A document in a
/// complete set of its own run (the marker beside it names the document's run id) is signed
/// with every other file of the set; each must still have the digest the marker recorded, and
/// nothing but the set's files (and envelopes) may be beside it, else signing is refused: it
/// would vouch for files the run did not write. `None`: not in a set (no marker, or another
/// run's), the document is signed alone.
pub fn set_files_beside(document: &Path, doc: &Value) -> Result<Option<Vec<SetFile>>> {
    let dir = match document.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let marker_path = dir.join(MARKER);
    let mut unreadable = None;
    let Some(marker) = read_document(&marker_path, &mut |why| unreadable = Some(why))? else {
        return match unreadable {
            Some(why) => Err(Error::format(&marker_path, None, why)),
            None => Ok(None),
        };
    };
    let run_id = doc.get("run_id").and_then(Value::as_str);
    if run_id.is_none() || marker.get("run_id").and_then(Value::as_str) != run_id {
        return Ok(None);
    }
    let refuse = |why: String| Error::usage(document, why);
    if marker["complete"] != true {
        return Err(refuse(format!(
            "its set's marker {} says the run never completed; rerun it",
            marker_path.display()
        )));
    }
    let name = document
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let recorded: std::collections::BTreeMap<&str, &str> = marker["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| Some((f["path"].as_str()?, f["sha256"].as_str()?)))
        .collect();
    let mut files = Vec::new();
    for f in set_files(dir)? {
        if !f.path.contains('/') && f.path.ends_with(".dsse.json") {
            continue;
        }
        match recorded.get(f.path.as_str()) {
            None => {
                return Err(refuse(format!(
                    "{} is beside it but not a file of its run (the marker {} does not list it); sign refuses to vouch for it: remove it, or rerun",
                    dir.join(&f.path).display(),
                    marker_path.display()
                )));
            }
            Some(sha) if !sha.eq_ignore_ascii_case(&f.sha256) => {
                return Err(refuse(format!(
                    "{} changed after its run wrote it (sha256 {sha} recorded, {} now); sign refuses to vouch for it: rerun",
                    dir.join(&f.path).display(),
                    f.sha256
                )));
            }
            Some(_) if f.path == name => {}
            Some(_) => files.push(f),
        }
    }
    Ok(Some(files))
}

/// An interrupted study's incomplete set, read back for `study --resume`: its run id, checked
/// file by file against the digests its marker recorded (nothing unlisted, nothing missing).
#[derive(Debug, Clone)]
pub struct IncompleteSet {
    pub dir: PathBuf,
    pub run_id: String,
}

/// Read `out` as an incomplete study set ([`OutputSet::commit_incomplete`]): its marker says so,
/// and every file is the one the interrupted run wrote. Anything else is refused naming `out`.
pub fn read_incomplete(out: &Path) -> Result<IncompleteSet> {
    let marker_path = out.join(MARKER);
    let refuse = |why: String| Err(Error::usage(out, why));
    let mut unreadable = None;
    let Some(marker) = read_document(&marker_path, &mut |why| unreadable = Some(why))? else {
        return refuse(match unreadable {
            Some(why) => format!("--resume: {why}"),
            None => "--resume: holds no cardproof set (no .cardproof-set.json): there is nothing to resume; run the study without --resume".into(),
        });
    };
    if marker["kind"] != "study"
        || marker["complete"] != false
        || marker["incomplete"] != INCOMPLETE
    {
        return refuse(if marker["complete"] == true {
            "--resume: holds a complete set; there is nothing to resume".into()
        } else {
            "--resume: its marker is not an interrupted study's (kind study, complete false)".into()
        });
    }
    let run_id = marker["run_id"].as_str().unwrap_or_default().to_owned();
    if run_id.len() != RUN_ID_LEN || !run_id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return refuse(format!(
            "--resume: its marker's run id `{run_id}` is not a run id"
        ));
    }
    let recorded: std::collections::BTreeMap<String, String> = marker["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| {
            Some((
                f["path"].as_str()?.to_owned(),
                f["sha256"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let files = list_files(out).map_err(|e| Error::io(out, e))?;
    if files.len() > MAX_SET_ENTRIES {
        return refuse(format!("--resume: holds {} files, not a set", files.len()));
    }
    if let Some(missing) = recorded.keys().find(|k| !files.contains(k)) {
        return refuse(format!(
            "--resume: {missing}, which the interrupted run wrote, is missing"
        ));
    }
    for f in set_files(out)? {
        match recorded.get(&f.path) {
            None => {
                return refuse(format!(
                    "--resume: {} is not a file the interrupted run wrote",
                    f.path
                ));
            }
            Some(sha) if !sha.eq_ignore_ascii_case(&f.sha256) => {
                return refuse(format!(
                    "--resume: {} changed after the interrupted run wrote it (sha256 {sha} recorded, {} now)",
                    f.path, f.sha256
                ));
            }
            Some(_) => {}
        }
    }
    Ok(IncompleteSet {
        dir: out.to_owned(),
        run_id,
    })
}

/// A JSON document beside the envelope: `None` when absent; one that is not JSON or too large is
/// a set mismatch (reported through `set`) and `None`.
pub(crate) fn read_document(path: &Path, set: &mut impl FnMut(String)) -> Result<Option<Value>> {
    let meta = match fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
        Ok(m) => m,
    };
    if meta.len() > MAX_DOCUMENT {
        set(format!(
            "{} is {} bytes, over the {MAX_DOCUMENT}-byte limit",
            path.display(),
            meta.len()
        ));
        return Ok(None);
    }
    let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
    match serde_json::from_slice(&bytes) {
        Ok(v) => Ok(Some(v)),
        Err(e) => {
            set(format!("{} is not JSON: {e}", path.display()));
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_uuid_v4_and_differ() {
        let a = new_run_id(Path::new("x")).unwrap();
        let b = new_run_id(Path::new("x")).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), RUN_ID_LEN);
        assert_eq!(&a[14..15], "4");
        assert!("89ab".contains(&a[19..20]), "{a}");
    }

    #[test]
    fn with_run_id_puts_it_after_schema_version() {
        let doc = json!({"schema_version": 1, "run_id": "old", "a": 1});
        let v = with_run_id(&doc, "new");
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["schema_version", "run_id", "a"]);
        assert_eq!(v["run_id"], "new");
    }

    #[test]
    fn real_path_resolves_links_and_dot_dot_of_what_does_not_exist() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("cand")).unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(root.join("cand"), root.join("link")).unwrap();
            assert_eq!(
                real_path(&root.join("link/sub/deeper")).unwrap(),
                root.join("cand/sub/deeper")
            );
        }
        assert_eq!(
            real_path(&root.join("x/../cand/./out")).unwrap(),
            root.join("cand/out")
        );
        #[cfg(unix)]
        {
            assert_eq!(
                real_path(&root.join("x/y/../../link/sub")).unwrap(),
                root.join("cand/sub")
            );
            assert_eq!(
                real_path(&root.join("link/../link/./sub")).unwrap(),
                root.join("cand/sub"),
                "`..` after a link is the link target's parent"
            );
        }
        assert_eq!(real_path(&root.join("cand")).unwrap(), root.join("cand"));
    }

    #[test]
    fn a_study_set_and_a_sweep_are_recognized_as_sets_and_nothing_deeper() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        for f in [
            "study.json",
            "study.dsse.json",
            "study.md",
            "study.html",
            MARKER,
            "arms/w8/measurement.json",
            "arms/w8/positions.safetensors",
            "sweep.json",
            "sweep.html",
            "pair-1/measurement.json",
        ] {
            let path = out.join(f);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, b"{}").unwrap();
        }
        assert_eq!(foreign_entry(out, "").unwrap(), None);
        // Directories below an arm, or below a sweep's pair, are not a set's.
        fs::create_dir_all(out.join("arms/w8/deeper")).unwrap();
        assert_eq!(
            foreign_entry(out, "").unwrap().as_deref(),
            Some("arms/w8/deeper")
        );
        fs::remove_dir(out.join("arms/w8/deeper")).unwrap();
        fs::create_dir_all(out.join("pair-1/deeper")).unwrap();
        assert_eq!(
            foreign_entry(out, "").unwrap().as_deref(),
            Some("pair-1/deeper")
        );
    }

    #[test]
    fn an_interrupted_studys_set_reads_back_only_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let options = SetOptions {
            kind: Kind::Study,
            force: false,
            models: &[],
        };
        let incomplete = |why: &str| {
            let e = read_incomplete(&out).err().unwrap().to_string();
            assert!(e.contains(why), "{e}");
        };
        incomplete("nothing to resume");
        let set = OutputSet::create(&out, &options).unwrap();
        let run_id = set.run_id().to_owned();
        set.write(INCOMPLETE, b"{}").unwrap();
        set.write("arms/a/measurement.json", b"{}").unwrap();
        set.write("arms/a/carry.json", b"{}").unwrap();
        set.write("arms/a/carry-run0.safetensors", b"rows").unwrap();
        set.commit_incomplete().unwrap();
        let marker: Value = serde_json::from_slice(&fs::read(out.join(MARKER)).unwrap()).unwrap();
        assert_eq!(marker["complete"], false);
        assert_eq!(marker["incomplete"], INCOMPLETE);
        assert_eq!(read_incomplete(&out).unwrap().run_id, run_id);
        // Its files are a set's: the next run into --out replaces it without --force.
        assert_eq!(foreign_entry(&out, "").unwrap(), None);
        // A carried file changed, one added or one removed: refused, naming it.
        fs::write(out.join("arms/a/carry-run0.safetensors"), b"ROWS").unwrap();
        incomplete("arms/a/carry-run0.safetensors changed after the interrupted run");
        fs::write(out.join("arms/a/carry-run0.safetensors"), b"rows").unwrap();
        fs::write(out.join("arms/a/carry-run1.safetensors"), b"rows").unwrap();
        incomplete("carry-run1.safetensors is not a file the interrupted run wrote");
        fs::remove_file(out.join("arms/a/carry-run1.safetensors")).unwrap();
        fs::remove_file(out.join("arms/a/carry.json")).unwrap();
        incomplete("arms/a/carry.json, which the interrupted run wrote, is missing");
        // A complete set is not resumed.
        let set = OutputSet::create(&out, &options).unwrap();
        set.write("study.json", b"{}").unwrap();
        set.commit().unwrap();
        incomplete("holds a complete set; there is nothing to resume");
        assert!(is_set_file("carry-run12.safetensors"));
        assert!(!is_set_file("carry-run.safetensors"));
        assert!(!is_set_file("carry-runx.safetensors"));
    }

    #[test]
    fn a_set_moves_into_place_whole_and_replaces_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let options = SetOptions {
            kind: Kind::Measure,
            force: false,
            models: &[],
        };
        let set = OutputSet::create(&out, &options).unwrap();
        set.write("measurement.json", b"{}").unwrap();
        assert!(!out.exists(), "nothing in place before the commit");
        // A second run into the same --out is refused while the first holds it.
        let busy = OutputSet::create(&out, &options).err().unwrap();
        assert!(busy.to_string().contains("another cardproof run"), "{busy}");
        let first_id = set.run_id().to_owned();
        let files = set.commit().unwrap();
        assert_eq!(files, [out.join("measurement.json")]);
        let marker: Value =
            serde_json::from_slice(&std::fs::read(out.join(MARKER)).unwrap()).unwrap();
        assert_eq!(marker["run_id"], first_id.as_str());
        assert_eq!(marker["files"][0]["path"], "measurement.json");

        // Replaced as a unit; a dropped set leaves nothing.
        let set = OutputSet::create(&out, &options).unwrap();
        set.write("sweep.json", b"{}").unwrap();
        drop(set);
        assert!(out.join("measurement.json").exists());
        let set = OutputSet::create(&out, &options).unwrap();
        set.write("sweep.json", b"{}").unwrap();
        set.commit().unwrap();
        assert!(!out.join("measurement.json").exists());
        assert!(out.join("sweep.json").exists());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, [OsString::from("out")], "no temporary or lock left");

        // Foreign files are refused, and replaced only with force.
        std::fs::write(out.join("notes.txt"), b"mine").unwrap();
        let refused = OutputSet::create(&out, &options).err().unwrap();
        assert!(refused.to_string().contains("notes.txt"), "{refused}");
        let forced = OutputSet::create(
            &out,
            &SetOptions {
                force: true,
                ..options
            },
        )
        .unwrap();
        forced.commit().unwrap();
        assert!(!out.join("notes.txt").exists());
    }
}
