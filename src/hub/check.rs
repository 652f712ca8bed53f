//! `cardproof check hf:REPO[@REV]`: everything that can be checked about a Hub upload without
//! downloading its weights.
//!
//! 1. The model info at the revision: the commit it pins, every file's size and, for LFS files,
//!    SHA-256.
//! 2. The card (README.md) is linted, against a header-only inspection of the checkpoint
//!    ([`super::remote`]).
//! 3. The card's `fidelity.candidate` is compared with the Hub: `files_sha256` with the root
//!    digest `cardproof hash` would compute, from the Hub's digests (small non-LFS files are
//!    fetched and checked against their git blob ids to get theirs); `revision` with the head (if
//!    they differ, the files at the measured revision are compared with the head's: a weight
//!    changed after the measurement is an error, a card edit is not).
//! 4. A signed report in the repository (`report.dsse.json`) is checked against the Hub's
//!    digests: its subjects must be exactly the checkpoint's files with the same SHA-256, and the
//!    card's `fidelity` block must be the one it signed (`card.fidelity_sha256`); with a public
//!    key its signature and keyid are verified too.
//!
//! Bytes fetched are counted and reported beside the repository's size.
//!
//! [`check_local`] runs the same checks on a local directory before it is uploaded: the card
//! linted against the checkpoint's headers, `files_sha256` against the root digest of the files
//! `cardproof hash` lists (hashed only when the card claims one or a report is there), and a
//! `report.dsse.json` against the local digests and card. The revision cannot be checked before
//! there is one.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::cache::git_blob_id;
use super::client::{Client, RepoInfo, Sibling};
use super::{HfSource, HubError};
use crate::card::Card;
use crate::checkpoint::inspect::Inspection;
use crate::digest::hex;
use crate::error::Result;
use crate::findings::Severity;
use crate::lint::LintReport;

/// Cards over this are refused locally too.
const MAX_CARD_BYTES: u64 = 16 * 1024 * 1024;
/// Non-LFS files are fetched whole to learn their SHA-256; git hosts keep large files in LFS, so
/// anything bigger is refused rather than downloaded.
const MAX_PLAIN_FILE: u64 = 64 << 20;
/// A DSSE envelope's limit, as `verify-report`'s.
const MAX_ENVELOPE: u64 = 64 << 20;
/// A finding about the repository on the Hub (not about the card's text).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct HubFinding {
    pub code: &'static str,
    pub severity: Severity,
    pub message: String,
}

impl HubFinding {
    fn error(code: &'static str, message: String) -> Self {
        Self {
            code,
            severity: Severity::Error,
            message,
        }
    }
    fn warning(code: &'static str, message: String) -> Self {
        Self {
            code,
            severity: Severity::Warning,
            message,
        }
    }
}

/// What was found about a signed report in the repository.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ReportCheck {
    pub file: String,
    /// keyids the envelope's signatures name.
    pub keyids: Vec<String>,
    /// `verified` (signature by the given key), `not_checked` (no key given) or `failed`.
    pub signature: &'static str,
    pub subjects: usize,
    pub mismatches: Vec<crate::attest::Mismatch>,
}

/// The result of `check`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct CheckReport {
    /// The source as asked (`hf:ORG/NAME@REV`, or the local directory).
    pub source: String,
    /// The Hub repository (null for a local directory).
    pub repo: Option<String>,
    /// The revision asked for (null for a local directory).
    pub revision: Option<String>,
    /// The commit the revision resolved to: everything below is about it (null for a local
    /// directory).
    pub commit: Option<String>,
    pub files: usize,
    pub total_bytes: u64,
    /// Bytes read from the Hub (0 for a local directory).
    pub bytes_fetched: u64,
    /// The card's lint findings (with checkpoint cross-checks); absent without a README.md.
    pub card: Option<LintReport>,
    pub inspections: Vec<Inspection>,
    pub hub_findings: Vec<HubFinding>,
    /// The signed report nearest the top of the repository (`report.dsse.json`).
    pub report: Option<ReportCheck>,
    /// Every further report envelope, judged the same way: a card listing many files has one
    /// per file (`reports/<file>/report.dsse.json`), each about its file.
    pub other_reports: Vec<ReportCheck>,
    /// The card, for printing findings with their lines.
    #[serde(skip)]
    pub card_text: Option<Card>,
}

impl CheckReport {
    pub fn errors(&self) -> usize {
        self.card.as_ref().map_or(0, |c| c.errors())
            + self
                .hub_findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .count()
    }
}

/// Run the check. `public_key` verifies a report's signature when given.
pub fn check(
    client: &Client,
    source: &HfSource,
    public_key: Option<&ed25519_dalek::VerifyingKey>,
) -> Result<CheckReport> {
    let info = client.repo_info(source)?;
    let pinned = source.at(&info.sha);
    let mut hub_findings = Vec::new();

    let (remote, layouts) = if super::remote::has_checkpoint(&info) {
        let r = super::remote::inspect_remote(client, &pinned, &info)?;
        (r.inspections, r.layouts)
    } else {
        (Vec::new(), Vec::new())
    };
    hub_findings.extend(layout_findings(layouts));

    let card = match info.sibling("README.md") {
        Some(s) => Some(fetch_card(client, &pinned, s)?),
        None => {
            hub_findings.push(HubFinding::error(
                "hub-no-card",
                format!(
                    "`{}` has no README.md at {}: there is no card to check",
                    source.repo, info.sha
                ),
            ));
            None
        }
    };
    let lint = card
        .as_ref()
        .map(|c| crate::lint::lint_with_checkpoint(c, &remote));
    let metadata = card
        .as_ref()
        .and_then(Card::metadata)
        .map(|m| m.to_json())
        .unwrap_or(Value::Null);
    let candidate = &metadata["fidelity"]["candidate"];
    let claimed = claimed_digests(&metadata["fidelity"]);

    let report_files = report_files(info.siblings.iter().map(|s| s.rfilename.as_str()));
    // The checkpoint's files as `cardproof hash` sees them, with their SHA-256 from the Hub.
    let needs_digests = !claimed.is_empty() || !report_files.is_empty();
    let digests = if needs_digests {
        Some(file_digests(client, &pinned, &info)?)
    } else {
        None
    };

    if let Some(repo) = candidate.get("repo").and_then(Value::as_str)
        && repo != source.repo
    {
        hub_findings.push(HubFinding::warning(
            "hub-candidate-repo",
            format!(
                "the card's `fidelity.candidate.repo` is `{repo}`, but it is published in `{}`",
                source.repo
            ),
        ));
    }
    if let Some(digests) = &digests {
        let place = format!(
            "the files at {} (from the Hub's per-file SHA-256)",
            info.sha
        );
        hub_findings.extend(digest_findings(&claimed, digests, &place, "published"));
    }
    if let Some(measured) = candidate.get("revision").and_then(Value::as_str)
        && measured != info.sha
    {
        let described = described_files(&metadata["fidelity"]);
        hub_findings.extend(stale_revision(
            client,
            source,
            &info,
            measured,
            described.as_deref(),
        )?);
    }

    let (report, other_reports) = judge_reports(
        &report_files,
        digests.as_ref(),
        "repository",
        &mut hub_findings,
        |file, digests| {
            check_report(
                client,
                &pinned,
                &info,
                file,
                digests,
                public_key,
                card.as_ref(),
            )
        },
    )?;

    Ok(CheckReport {
        source: source.to_string(),
        repo: Some(source.repo.clone()),
        revision: Some(source.revision.clone()),
        commit: Some(info.sha.clone()),
        files: info.siblings.len(),
        total_bytes: info.total_size(),
        bytes_fetched: client.bytes_fetched(),
        card: lint,
        inspections: remote,
        hub_findings,
        report,
        other_reports,
        card_text: card,
    })
}

/// Most report envelopes one check judges (a card lists at most 256 files).
const MAX_REPORTS: usize = 256;

/// The paths named `report.dsse.json` among `names`, nearest the top first (then by name), at
/// most [`MAX_REPORTS`].
fn report_files<'n>(names: impl Iterator<Item = &'n str>) -> Vec<String> {
    let mut found: Vec<&str> = names
        .filter(|n| n.rsplit('/').next() == Some("report.dsse.json"))
        .collect();
    found.sort_by_key(|n| (n.matches('/').count(), *n));
    found
        .into_iter()
        .take(MAX_REPORTS)
        .map(str::to_owned)
        .collect()
}

/// Every report envelope judged by `judge` against `digests` (none without them), a
/// `hub-report-mismatch` about `what` for each that does not match: the first (nearest the top)
/// and the rest.
fn judge_reports(
    files: &[String],
    digests: Option<&BTreeMap<String, (String, u64)>>,
    what: &str,
    findings: &mut Vec<HubFinding>,
    judge: impl Fn(&str, &BTreeMap<String, (String, u64)>) -> Result<ReportCheck>,
) -> Result<(Option<ReportCheck>, Vec<ReportCheck>)> {
    let Some(digests) = digests else {
        return Ok((None, Vec::new()));
    };
    let mut reports = Vec::new();
    for file in files {
        let r = judge(file, digests)?;
        findings.extend(report_mismatch(Some(&r), what));
        reports.push(r);
    }
    let first = (!reports.is_empty()).then(|| reports.remove(0));
    Ok((first, reports))
}

/// One digest a card claims: where (for messages), the digest, and the one file it is of (a
/// card's `candidate.file`, or an entry of `files`), `None` for every file of the checkpoint.
struct ClaimedDigest {
    field: String,
    digest: String,
    file: Option<String>,
}

/// The digests a `fidelity` block claims for its files.
fn claimed_digests(fidelity: &Value) -> Vec<ClaimedDigest> {
    if let Some(entries) = fidelity.get("files").and_then(Value::as_array) {
        return entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                Some(ClaimedDigest {
                    field: format!("fidelity.files[{i}].files_sha256"),
                    digest: e.get("files_sha256")?.as_str()?.to_owned(),
                    file: Some(e.get("file")?.as_str()?.to_owned()),
                })
            })
            .collect();
    }
    let candidate = &fidelity["candidate"];
    candidate
        .get("files_sha256")
        .and_then(Value::as_str)
        .map(|d| ClaimedDigest {
            field: "fidelity.candidate.files_sha256".into(),
            digest: d.to_owned(),
            file: candidate
                .get("file")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
        .into_iter()
        .collect()
}

/// `hub-files-digest-mismatch` for each claimed digest that is not the root digest of the files
/// it claims (all of `digests`, or the one file), as `cardproof hash` computes it.
fn digest_findings(
    claimed: &[ClaimedDigest],
    digests: &BTreeMap<String, (String, u64)>,
    place: &str,
    which: &str,
) -> Vec<HubFinding> {
    use crate::checkpoint::hash::{ManifestEntry, manifest_text};
    let mut out = Vec::new();
    for c in claimed {
        let entries: Vec<ManifestEntry> = digests
            .iter()
            .filter(|(path, _)| c.file.as_deref().is_none_or(|f| *path == f))
            .map(|(path, (sha, size))| ManifestEntry {
                path: path.clone(),
                size: *size,
                sha256: sha.clone(),
                link: None,
            })
            .collect();
        if let Some(file) = &c.file
            && entries.is_empty()
        {
            out.push(HubFinding::error(
                "hub-files-digest-mismatch",
                format!(
                    "the card's `{}` is for `{file}`, which is not among {place}",
                    c.field
                ),
            ));
            continue;
        }
        let root = {
            use sha2::Digest as _;
            hex(&sha2::Sha256::digest(manifest_text(&entries).as_bytes()))
        };
        if !c.digest.eq_ignore_ascii_case(&root) {
            let what = c
                .file
                .as_ref()
                .map_or("the files".to_owned(), |f| format!("`{f}`"));
            out.push(HubFinding::error(
                "hub-files-digest-mismatch",
                format!(
                    "the card's `{}` is {}, but {what} among {place} has root digest {root}: the \
                     measured files are not the {which} ones",
                    c.field, c.digest
                ),
            ));
        }
    }
    out
}

/// The card, read from the cache when present (else fetched and cached), named by its Hub path.
pub fn fetch_card(client: &Client, pinned: &HfSource, s: &Sibling) -> Result<Card> {
    if s.file_size() > MAX_CARD_BYTES {
        return Err(pinned.error(
            Some("README.md"),
            HubError::TooLarge {
                what: "the card".into(),
                size: s.file_size(),
                limit: MAX_CARD_BYTES,
            },
        ));
    }
    let info_one = RepoInfo {
        sha: pinned.revision.clone(),
        siblings: vec![s.clone()],
    };
    super::snapshot::ensure_files(client, pinned, &info_one, &[s], &|_, _| {})?;
    let cache = super::cache::RepoCache::new(&client.config().cache_dir, &pinned.repo);
    let path = cache.snapshot_dir(&pinned.revision).join("README.md");
    let bytes = crate::files::read_capped(&path, MAX_CARD_BYTES, "a card")?;
    Card::from_bytes(pinned.display_path(Some("README.md")), bytes)
}

/// Whether `hash` leaves `path` out: the one rule of every checkpoint reader
/// ([`crate::checkpoint::members::excluded`]), report sets wherever they sit included.
fn excluded(path: &str) -> bool {
    crate::checkpoint::members::excluded(path)
}

/// path -> (SHA-256, size) of every file `cardproof hash` would list. LFS files take the Hub's
/// SHA-256; small plain files are fetched (from the cache when there) and checked against their
/// git blob id first.
fn file_digests(
    client: &Client,
    pinned: &HfSource,
    info: &RepoInfo,
) -> Result<BTreeMap<String, (String, u64)>> {
    let cache = super::cache::RepoCache::new(&client.config().cache_dir, &pinned.repo);
    let mut out = BTreeMap::new();
    for s in &info.siblings {
        if excluded(&s.rfilename) {
            continue;
        }
        let sha = match s.sha256() {
            Some(sha) => sha.to_ascii_lowercase(),
            None => {
                let bytes = plain_file(client, &cache, pinned, info, s)?;
                use sha2::Digest as _;
                hex(&sha2::Sha256::digest(&bytes))
            }
        };
        out.insert(s.rfilename.clone(), (sha, s.file_size()));
    }
    Ok(out)
}

fn plain_file(
    client: &Client,
    cache: &super::cache::RepoCache,
    pinned: &HfSource,
    info: &RepoInfo,
    s: &Sibling,
) -> Result<Vec<u8>> {
    let name = s.rfilename.as_str();
    let size = s.file_size();
    if size > MAX_PLAIN_FILE {
        return Err(pinned.error(
            Some(name),
            HubError::TooLarge {
                what: format!("`{name}` (not in LFS, so without a Hub SHA-256)"),
                size,
                limit: MAX_PLAIN_FILE,
            },
        ));
    }
    if let Some(p) = cache.cached_file(&info.sha, name)
        && let Ok(bytes) = crate::files::read_capped(&p, size, "a cached file")
        && bytes.len() as u64 == size
    {
        return Ok(bytes);
    }
    let bytes = client.read_range(pinned, name, 0, size, size)?;
    let id = git_blob_id(&bytes);
    let want = s.blob_id.as_deref().unwrap_or_default();
    if !id.eq_ignore_ascii_case(want) {
        return Err(pinned.error(
            Some(name),
            HubError::DigestMismatch {
                algorithm: "git blob id",
                expected: want.to_owned(),
                actual: id,
            },
        ));
    }
    Ok(bytes)
}

/// The files a card describes by name: the entries of `fidelity.files`, or `candidate.file`;
/// `None` for a card about the whole checkpoint.
fn described_files(fidelity: &Value) -> Option<Vec<String>> {
    if let Some(entries) = fidelity.get("files").and_then(Value::as_array) {
        return Some(
            entries
                .iter()
                .filter_map(|e| e.get("file").and_then(Value::as_str).map(str::to_owned))
                .collect(),
        );
    }
    fidelity
        .pointer("/candidate/file")
        .and_then(Value::as_str)
        .map(|f| vec![f.to_owned()])
}

/// The card measured `measured`, the head is `info.sha`: did the checkpoint's files change
/// (those of `described`, when the card names its files: a file uploaded beside them is not
/// theirs)? The card and the report bundle are not the checkpoint (publishing them makes new
/// commits).
fn stale_revision(
    client: &Client,
    source: &HfSource,
    head: &RepoInfo,
    measured: &str,
    described: Option<&[String]>,
) -> Result<Vec<HubFinding>> {
    let then = match client.repo_info(&source.at(measured)) {
        Ok(info) => info,
        Err(e)
            if matches!(&e.kind, crate::ErrorKind::Hub(h)
                if matches!(**h, HubError::RevisionNotFound { .. })) =>
        {
            return Ok(vec![HubFinding::error(
                "hub-candidate-revision-unknown",
                format!(
                    "the card's `fidelity.candidate.revision` {measured} is not a revision of `{}`: \
                     the measured files cannot be compared with the published ones",
                    source.repo
                ),
            )]);
        }
        Err(e) => return Err(e),
    };
    let key = |s: &Sibling| (s.blob_name().to_owned(), s.file_size());
    let files = |info: &RepoInfo| -> BTreeMap<String, (String, u64)> {
        info.siblings
            .iter()
            .filter(|s| !excluded(&s.rfilename))
            .filter(|s| described.is_none_or(|names| names.contains(&s.rfilename)))
            .map(|s| (s.rfilename.clone(), key(s)))
            .collect()
    };
    let (before, now) = (files(&then), files(head));
    let mut changed: Vec<String> = Vec::new();
    for (name, k) in &now {
        match before.get(name) {
            None => changed.push(format!("`{name}` added")),
            Some(b) if b != k => changed.push(format!("`{name}` changed")),
            Some(_) => {}
        }
    }
    for name in before.keys().filter(|n| !now.contains_key(*n)) {
        changed.push(format!("`{name}` removed"));
    }
    if changed.is_empty() {
        return Ok(Vec::new());
    }
    let shown = changed.len().min(8);
    Ok(vec![HubFinding::error(
        "hub-candidate-revision-stale",
        format!(
            "the card was measured at {measured} but the head is {}, and the files changed after \
             the measurement: {}{}",
            head.sha,
            changed[..shown].join(", "),
            if changed.len() > shown {
                format!(" and {} more", changed.len() - shown)
            } else {
                String::new()
            }
        ),
    )])
}

fn check_report(
    client: &Client,
    pinned: &HfSource,
    info: &RepoInfo,
    file: &str,
    digests: &BTreeMap<String, (String, u64)>,
    public_key: Option<&ed25519_dalek::VerifyingKey>,
    card: Option<&Card>,
) -> Result<ReportCheck> {
    let s = info.sibling(file).expect("listed");
    if s.file_size() > MAX_ENVELOPE {
        return Err(pinned.error(
            Some(file),
            HubError::TooLarge {
                what: "the report envelope".into(),
                size: s.file_size(),
                limit: MAX_ENVELOPE,
            },
        ));
    }
    let bytes = match s.sha256() {
        Some(_) => client.read_range(pinned, file, 0, s.file_size(), s.file_size())?,
        None => {
            let cache = super::cache::RepoCache::new(&client.config().cache_dir, &pinned.repo);
            plain_file(client, &cache, pinned, info, s)?
        }
    };
    let display = pinned.display_path(Some(file));
    let tmp = tempfile::Builder::new()
        .prefix("cardproof-report-")
        .suffix(".json")
        .tempfile()
        .map_err(|e| super::cache::cache_err(pinned, Some(file), &std::env::temp_dir(), e))?;
    std::fs::write(tmp.path(), &bytes)
        .map_err(|e| super::cache::cache_err(pinned, Some(file), tmp.path(), e))?;
    let rename = |mut e: crate::Error| {
        if e.file == tmp.path() {
            e.file = display.clone();
        }
        e
    };
    judge_envelope(
        file,
        &bytes,
        tmp.path(),
        &display,
        digests,
        public_key,
        card,
        &pinned.display_path(Some("README.md")).display().to_string(),
    )
    .map_err(rename)
}

/// Judges a signed report's envelope, read into `bytes` from `read_from` (shown as `display`):
/// its signature with `public_key` when one is given, its subjects against `digests` (the files
/// as they are) and its card digest against `card` (shown as `card_name`). The card is not a
/// subject: its claims are bound by the signed digest of its `fidelity` block.
#[allow(clippy::too_many_arguments)]
fn judge_envelope(
    file: &str,
    bytes: &[u8],
    read_from: &std::path::Path,
    display: &std::path::Path,
    digests: &BTreeMap<String, (String, u64)>,
    public_key: Option<&ed25519_dalek::VerifyingKey>,
    card: Option<&Card>,
    card_name: &str,
) -> Result<ReportCheck> {
    let envelope: Value = serde_json::from_slice(bytes).map_err(|e| {
        crate::Error::format(
            display,
            None,
            format!("not JSON, so not a DSSE envelope: {e}"),
        )
    })?;
    let parts = crate::attest::dsse::EnvelopeParts::from_value(display, &envelope)?;
    let keyids = parts.signatures.iter().map(|s| s.keyid.clone()).collect();
    let (signature, statement, mut mismatches) = match public_key {
        Some(key) => match crate::attest::verify_envelope(read_from, key)? {
            crate::attest::Outcome::Verified(v) => ("verified", Some(v.statement), Vec::new()),
            crate::attest::Outcome::Failed(m) => ("failed", None, m),
        },
        None => (
            "not_checked",
            Some(crate::attest::statement::parse_statement(
                display,
                &parts.payload,
            )?),
            Vec::new(),
        ),
    };
    if let Some(statement) = &statement {
        // A report about one file of the checkpoint (a listed file, `candidate.file`) has
        // that file as its subject: the files beside it are not its business.
        let one_file = statement
            .predicate()
            .pointer("/card/disclosure/candidate/file")
            .and_then(Value::as_str);
        let as_they_are: BTreeMap<&str, &str> = digests
            .iter()
            .filter(|(p, _)| one_file.is_none_or(|f| p.as_str() == f))
            .map(|(p, (sha, _))| (p.as_str(), sha.as_str()))
            .collect();
        mismatches.extend(crate::attest::verify::compare_subjects(
            statement,
            as_they_are,
        ));
        mismatches.extend(crate::attest::compare_card(statement, card, card_name));
    }
    let subjects = statement.as_ref().map_or(0, |s| s.subject.len());
    Ok(ReportCheck {
        file: file.to_owned(),
        keyids,
        signature,
        subjects,
        mismatches,
    })
}

/// The `hub-report-mismatch` finding of a report that does not match `what` (the repository or
/// the directory), if it does not.
fn report_mismatch(report: Option<&ReportCheck>, what: &str) -> Option<HubFinding> {
    let r = report.filter(|r| !r.mismatches.is_empty())?;
    Some(HubFinding::error(
        "hub-report-mismatch",
        format!(
            "the signed report `{}` does not match the {what}: {}",
            r.file,
            r.mismatches
                .iter()
                .map(|m| m.detail.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        ),
    ))
}

/// `cardproof check DIR`: the checks of [`check`] on a local directory about to be uploaded. The
/// findings keep their codes (`hub-no-card`, `hub-files-digest-mismatch`, `hub-report-mismatch`);
/// the revision and repository are not checked (there is none yet). `progress` receives byte
/// counts while files are hashed.
pub fn check_local(
    dir: &std::path::Path,
    public_key: Option<&ed25519_dalek::VerifyingKey>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<CheckReport> {
    use crate::checkpoint::hash::{self, HashOptions};
    let meta = std::fs::metadata(dir).map_err(|e| crate::Error::io(dir, e))?;
    if !meta.is_dir() {
        return Err(crate::Error::usage(
            dir,
            "`check` takes a model directory (the upload: card, config and checkpoint) or \
             hf:ORG/NAME[@REV]",
        ));
    }
    let options = HashOptions::default();
    let listed = hash::list_files(dir, &options)?;
    let has_checkpoint = crate::checkpoint::has_checkpoint(dir);
    let inspections = if has_checkpoint {
        crate::checkpoint::inspect::inspect_path(dir)?
    } else {
        Vec::new()
    };
    let mut hub_findings = Vec::new();
    if !has_checkpoint {
        // A card-only directory: nothing to hash or inspect, so no digest to compare (the empty
        // directory's root digest is not a mismatch worth reporting).
        hub_findings.push(HubFinding::error(
            "hub-no-checkpoint",
            format!(
                "{} holds no checkpoint (no .safetensors or .gguf weights beside the card): \
                 check the directory you upload, the card with its weights",
                dir.display()
            ),
        ));
    }
    let card = if dir.join("README.md").is_file() {
        Some(Card::open(dir)?)
    } else {
        hub_findings.push(HubFinding::error(
            "hub-no-card",
            format!(
                "{} has no README.md: there is no card to check",
                dir.display()
            ),
        ));
        None
    };
    hub_findings.extend(layout_findings(crate::checkpoint::layout::check_dir(dir)?));
    let lint = card
        .as_ref()
        .map(|c| crate::lint::lint_with_checkpoint(c, &inspections));
    let metadata = card
        .as_ref()
        .and_then(Card::metadata)
        .map(|m| m.to_json())
        .unwrap_or(Value::Null);
    let claimed = claimed_digests(&metadata["fidelity"]);
    // The report sets are not the checkpoint's: look for them among every file of the directory.
    let every = hash::list_files(
        dir,
        &HashOptions {
            include_all: true,
            ..HashOptions::default()
        },
    )?;
    let report_files = report_files(every.iter().map(|(name, _)| name.as_str()).filter(|name| {
        !name
            .split('/')
            .any(crate::checkpoint::members::excluded_dir)
    }));
    let needs_digests = has_checkpoint && (!claimed.is_empty() || !report_files.is_empty());
    let digests: Option<BTreeMap<String, (String, u64)>> = if needs_digests {
        let manifest = hash::hash_path(dir, &options, progress)?;
        Some(
            manifest
                .files
                .into_iter()
                .filter(|f| !excluded(&f.path))
                .map(|f| (f.path, (f.sha256, f.size)))
                .collect(),
        )
    } else {
        None
    };
    if let Some(digests) = &digests {
        let place = format!("the files in {}", dir.display());
        hub_findings.extend(digest_findings(&claimed, digests, &place, "to upload"));
    }
    let (report, other_reports) = judge_reports(
        &report_files,
        digests.as_ref(),
        "directory",
        &mut hub_findings,
        |file, digests| check_local_report(dir, file, digests, public_key, card.as_ref()),
    )?;
    Ok(CheckReport {
        source: dir.display().to_string(),
        repo: None,
        revision: None,
        commit: None,
        files: listed.len(),
        total_bytes: listed.iter().map(|(_, size)| size).sum(),
        bytes_fetched: 0,
        card: lint,
        inspections,
        hub_findings,
        report,
        other_reports,
        card_text: card,
    })
}

/// A published layout (`layouts/<file>.tensor-types.txt`) against each GGUF's header in `dir`:
/// a `hub-layout-mismatch` per layout that does not describe its file.
fn layout_findings(checks: Vec<crate::checkpoint::layout::LayoutCheck>) -> Vec<HubFinding> {
    let mut out = Vec::new();
    for l in checks {
        if l.mismatches.is_empty() {
            continue;
        }
        let shown = l.mismatches.len().min(8);
        out.push(HubFinding::error(
            "hub-layout-mismatch",
            format!(
                "{} does not describe {}: {} of the {} tensors it types differ ({}{})",
                l.layout,
                l.gguf,
                l.mismatches.len(),
                l.checked,
                l.mismatches[..shown].join("; "),
                if l.mismatches.len() > shown {
                    "; ..."
                } else {
                    ""
                }
            ),
        ));
    }
    out
}

/// A local `report.dsse.json` against the directory's digests and card (as [`check_report`]).
fn check_local_report(
    dir: &std::path::Path,
    file: &str,
    digests: &BTreeMap<String, (String, u64)>,
    public_key: Option<&ed25519_dalek::VerifyingKey>,
    card: Option<&Card>,
) -> Result<ReportCheck> {
    let path = dir.join(file);
    let bytes = crate::files::read_capped(&path, MAX_ENVELOPE, "a DSSE envelope")?;
    judge_envelope(
        file,
        &bytes,
        &path,
        &path,
        digests,
        public_key,
        card,
        &dir.join("README.md").display().to_string(),
    )
}
