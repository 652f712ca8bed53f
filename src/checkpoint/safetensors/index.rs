//! Checkpoints of several safetensors files: `model.safetensors.index.json` and the shards it
//! names, or a directory of files without an index.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

use rayon::prelude::*;

use super::json::{self, Json};
use super::{SafetensorsFile, TensorInfo, read_file, shown};
use crate::error::{Error, Result};

/// The index transformers writes next to sharded weights; preferred when a directory has several.
const INDEX_FILE_NAME: &str = "model.safetensors.index.json";
const INDEX_SUFFIX: &str = ".safetensors.index.json";

/// An index maps tensor names to file names; real ones are a few MiB at most, and this bounds
/// what a hostile one can make us read.
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// model.safetensors.index.json
#[derive(Debug, Clone)]
pub struct ShardIndex {
    pub path: PathBuf,
    /// `metadata.total_size`: by the transformers convention, the sum of the tensors' byte lengths.
    pub total_size: Option<u64>,
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// tensor name → shard file name (a plain name in the index's directory)
    pub weight_map: BTreeMap<String, String>,
}

/// Read and validate an index: a JSON object with a `weight_map` of tensor → shard file name and
/// an optional `metadata` object (whose `total_size`, if present, is a byte count). Duplicate keys
/// anywhere are refused; other top-level keys are ignored, as transformers ignores them.
pub fn read_index(path: &Path) -> Result<ShardIndex> {
    let bad = |subject: Option<&str>, rule: String| Error::format(path, subject, rule);
    let bytes = crate::files::read_capped(path, MAX_INDEX_BYTES, "an index")?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        bad(
            None,
            format!("index is not valid UTF-8 (byte {})", e.valid_up_to()),
        )
    })?;
    let root = json::parse(text).map_err(|e| bad(None, format!("index is not valid JSON: {e}")))?;
    if let Some((at, key)) = json::find_duplicate(&root) {
        let at = if at.is_empty() {
            "the top level".to_owned()
        } else {
            format!("`{}`", shown(&at))
        };
        return Err(bad(
            Some(&shown(&key)),
            format!("key appears twice in {at} (parsers disagree on which one counts)"),
        ));
    }
    let Json::Object(members) = root else {
        return Err(bad(
            None,
            format!("index must be a JSON object, found {}", root.describe()),
        ));
    };

    let mut weight_map = None;
    let mut metadata = serde_json::Map::new();
    let mut total_size = None;
    for (key, value) in members {
        match key.as_str() {
            "weight_map" => weight_map = Some(check_weight_map(path, value)?),
            "metadata" => {
                let Json::Object(fields) = value else {
                    return Err(bad(
                        Some("metadata"),
                        format!("must be an object, found {}", value.describe()),
                    ));
                };
                for (field, value) in fields {
                    if field == "total_size" {
                        total_size = Some(check_total_size(path, &value)?);
                    }
                    metadata.insert(field, json::into_value(value));
                }
            }
            _ => {}
        }
    }
    let Some(weight_map) = weight_map else {
        return Err(bad(None, "index has no `weight_map`".to_owned()));
    };
    Ok(ShardIndex {
        path: path.to_path_buf(),
        total_size,
        metadata,
        weight_map,
    })
}

fn check_weight_map(path: &Path, value: Json) -> Result<BTreeMap<String, String>> {
    let Json::Object(entries) = value else {
        return Err(Error::format(
            path,
            Some("weight_map"),
            format!(
                "must be an object of tensor name → shard file, found {}",
                value.describe()
            ),
        ));
    };
    let mut map = BTreeMap::new();
    for (tensor, shard) in entries {
        let Json::Str(shard) = shard else {
            return Err(Error::format(
                path,
                Some(&shown(&tensor)),
                format!(
                    "weight_map value must be a shard file name, found {}",
                    shard.describe()
                ),
            ));
        };
        if !is_plain_file_name(&shard) {
            return Err(Error::format(
                path,
                Some(&shown(&tensor)),
                format!(
                    "shard `{}` is not a plain file name in the index's directory (no paths, \
                     no `..`)",
                    shown(&shard)
                ),
            ));
        }
        map.insert(tensor, shard);
    }
    Ok(map)
}

/// A shard must be a sibling of the index: an absolute path or `..` would let a downloaded index
/// point the reader anywhere on the machine.
fn is_plain_file_name(name: &str) -> bool {
    let mut components = Path::new(name).components();
    !name.contains(['/', '\\', '\0'])
        && matches!(components.next(), Some(Component::Normal(_)))
        && components.next().is_none()
}

/// An integer byte count. A float with an integral value is accepted too: Python writers
/// sometimes produce `1.5e10`, and it is still exact below 2^53.
fn check_total_size(path: &Path, value: &Json) -> Result<u64> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    match *value {
        Json::UInt(n) => Ok(n),
        Json::Float(f) if (0.0..=EXACT).contains(&f) && f.fract() == 0.0 => Ok(f as u64),
        _ => Err(Error::format(
            path,
            Some("total_size"),
            format!("must be a non-negative integer, found {}", value.describe()),
        )),
    }
}

/// A checkpoint's safetensors files, sorted by path.
#[derive(Debug, Clone)]
pub struct SafetensorsCheckpoint {
    pub index: Option<ShardIndex>,
    pub files: Vec<SafetensorsFile>,
}

impl SafetensorsCheckpoint {
    /// Every tensor with the file holding it, files in path order, tensors in offset order.
    pub fn tensors(&self) -> impl Iterator<Item = (&SafetensorsFile, &TensorInfo)> {
        self.files
            .iter()
            .flat_map(|file| file.tensors.iter().map(move |t| (file, t)))
    }

    /// Looks the shard up in the index first, so that looking up every tensor of a checkpoint with
    /// tens of thousands of tensors does not scan them all each time.
    pub fn tensor(&self, name: &str) -> Option<(&SafetensorsFile, &TensorInfo)> {
        if let Some(index) = &self.index
            && let Some(shard) = index.weight_map.get(name)
        {
            let target = index_dir(&index.path).join(shard);
            if let Ok(i) = self
                .files
                .binary_search_by(|f| f.path.as_path().cmp(&target))
                && let Some(file) = self.files.get(i)
                && let Some(tensor) = file.get(name)
            {
                return Some((file, tensor));
            }
        }
        self.files
            .iter()
            .find_map(|file| file.get(name).map(|t| (file, t)))
    }

    pub fn tensor_count(&self) -> usize {
        self.files.iter().map(|f| f.tensors.len()).sum()
    }
}

fn index_dir(index: &Path) -> &Path {
    index.parent().unwrap_or(Path::new(""))
}

/// A checkpoint's safetensors files: `dir` with `model.safetensors.index.json` (or a single other
/// `*.safetensors.index.json`), or with a single `*.safetensors` file, or several without an index
/// (then tensor names must still be unique across files). With an index, only the shards it names
/// are read (Mistral repositories also ship a `consolidated.safetensors` with other names).
pub fn open_dir(dir: &Path) -> Result<SafetensorsCheckpoint> {
    let mut indexes = Vec::new();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let is_index = name.ends_with(INDEX_SUFFIX);
        if !is_index && !name.ends_with(".safetensors")
            || crate::checkpoint::members::excluded(name)
        {
            continue;
        }
        // Follows links: Hub cache snapshots are links into the blob store.
        if !std::fs::metadata(&path)
            .map_err(|e| Error::io(&path, e))?
            .is_file()
        {
            continue;
        }
        if is_index {
            indexes.push(path)
        } else {
            files.push(path)
        }
    }
    indexes.sort();
    files.sort();

    let preferred = indexes
        .iter()
        .find(|p| p.file_name().is_some_and(|n| n == INDEX_FILE_NAME));
    let index = match (preferred, indexes.as_slice()) {
        (Some(index), _) | (None, [index]) => Some(index),
        (None, []) => None,
        (None, several) => {
            let names: Vec<String> = several
                .iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            return Err(Error::format(
                dir,
                None,
                format!(
                    "several index files ({}) and no {INDEX_FILE_NAME}; cannot tell which one \
                     describes the checkpoint",
                    names.join(", ")
                ),
            ));
        }
    };
    if let Some(index) = index {
        return open_indexed(index);
    }
    if files.is_empty() {
        return Err(Error::usage(
            dir,
            format!("no *.safetensors file and no {INDEX_FILE_NAME} in this directory"),
        ));
    }
    let files = read_all(&files)?;
    let mut seen: HashMap<&str, &Path> = HashMap::new();
    for file in &files {
        for tensor in &file.tensors {
            if let Some(other) = seen.insert(&tensor.name, &file.path) {
                return Err(Error::format(
                    &file.path,
                    Some(&shown(&tensor.name)),
                    format!(
                        "tensor is also in {}; without an index every tensor must be in exactly \
                         one file",
                        other.display()
                    ),
                ));
            }
        }
    }
    Ok(SafetensorsCheckpoint { index: None, files })
}

/// One safetensors file as a checkpoint; a `*.safetensors.index.json` path opens the sharded
/// checkpoint it describes.
pub fn open_file(path: &Path) -> Result<SafetensorsCheckpoint> {
    let is_index = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(INDEX_SUFFIX));
    if is_index {
        return open_indexed(path);
    }
    Ok(SafetensorsCheckpoint {
        index: None,
        files: vec![read_file(path)?],
    })
}

/// Reads files in parallel; on failure reports the first failing file in the given order, so
/// the error does not depend on scheduling.
fn read_all(paths: &[PathBuf]) -> Result<Vec<SafetensorsFile>> {
    let read: Vec<Result<SafetensorsFile>> = paths.par_iter().map(|p| read_file(p)).collect();
    read.into_iter().collect()
}

/// Every shard the index names exists and is valid; every tensor is in exactly one shard, the
/// one the index says; every tensor the index lists exists.
fn open_indexed(index_path: &Path) -> Result<SafetensorsCheckpoint> {
    let index = read_index(index_path)?;
    let bad = |subject: &str, rule: String| Error::format(index_path, Some(&shown(subject)), rule);
    if index.weight_map.is_empty() {
        return Err(bad(
            "weight_map",
            "is empty: the index names no tensors".to_owned(),
        ));
    }
    let dir = index_dir(index_path);

    // shard → (tensors the index puts there, the first of them)
    let mut shards: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for (tensor, shard) in &index.weight_map {
        shards
            .entry(shard.as_str())
            .or_insert((0, tensor.as_str()))
            .0 += 1;
    }
    let mut paths = Vec::with_capacity(shards.len());
    for (&shard, &(count, first)) in &shards {
        let path = dir.join(shard);
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => {
                return Err(bad(
                    shard,
                    "shard named in weight_map is not a file".to_owned(),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(bad(
                    shard,
                    format!(
                        "shard named in weight_map (for {count} tensor(s), e.g. `{}`) does not \
                         exist",
                        shown(first)
                    ),
                ));
            }
            Err(e) => return Err(Error::io(&path, e)),
        }
        paths.push(path);
    }
    let files = read_all(&paths)?;
    let names: Vec<&str> = shards.keys().copied().collect();

    // First where each tensor really is, so that a tensor in two shards is reported as that.
    let mut found: HashMap<&str, &str> = HashMap::new();
    for (&shard, file) in names.iter().zip(&files) {
        for tensor in &file.tensors {
            if let Some(other) = found.insert(&tensor.name, shard) {
                return Err(Error::format(
                    &file.path,
                    Some(&shown(&tensor.name)),
                    format!(
                        "tensor is in two shards, `{}` and `{}`",
                        shown(other),
                        shown(shard)
                    ),
                ));
            }
        }
    }
    for (&shard, file) in names.iter().zip(&files) {
        for tensor in &file.tensors {
            match index.weight_map.get(&tensor.name) {
                None => {
                    return Err(bad(
                        &tensor.name,
                        format!(
                            "tensor is in shard `{}` but not in weight_map",
                            shown(shard)
                        ),
                    ));
                }
                Some(listed) if listed != shard => {
                    return Err(bad(
                        &tensor.name,
                        format!(
                            "weight_map puts it in `{}`, but it is in `{}`",
                            shown(listed),
                            shown(shard)
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
    }
    for (tensor, shard) in &index.weight_map {
        if !found.contains_key(tensor.as_str()) {
            return Err(bad(
                tensor,
                format!(
                    "weight_map puts it in `{}`, but no shard holds it",
                    shown(shard)
                ),
            ));
        }
    }
    // `total_size` is not checked: real indexes disagree with their shards often enough (some
    // count header bytes, some a different dtype) that refusing them would refuse real models.
    let mut files = files;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(SafetensorsCheckpoint {
        index: Some(index),
        files,
    })
}
