//! `study --resume`: a study whose arm failed after others completed, finished without running
//! those again.
//!
//! When a study in the transformers runner is interrupted (an arm's error, an out-of-memory, the
//! runner killed by a signal), its completed arms are written into `--out` as an incomplete set
//! ([`write_incomplete`]): each arm's measurement as `measure` writes it, what the runner needs
//! to take the arm back (`arms/<name>/carry.json` and `carry-run<N>.safetensors`, see
//! [`crate::runner::transformers_carry`]) and [`crate::outset::INCOMPLETE`], naming the study
//! file, the arms done and not done and the failure. No study.json, nothing signed: the set's
//! marker says `complete: false`, so nothing in it looks like a result.
//!
//! `--resume` reads that set back ([`read`]: every file against the marker's digests, the study
//! file the same bytes, the completed arms the plan's first ones), runs the reference and the
//! remaining arms, and replays the carried arms' rows through the same scoring. Each replayed
//! measurement must equal what the interrupted run recorded ([`check_replay`]: the models'
//! digests, the eval text, the protocol and every run's statistics), the reference's pass must
//! reproduce bit for bit (checked by the runner), and the signed study.json names the run the
//! carried arms came from (`resumed`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::document::StudyFileRecord;
use super::file::Study;
use super::plan::Plan;
use crate::error::{Error, Result};
use crate::outset::INCOMPLETE;
use crate::rerun::Measurement;
use crate::rerun::study::ArmOutcome;
use crate::runner::exchange::RecordArm;
use crate::runner::transformers_carry::{CarriedArm, Carry, run_file_name};

/// [`INCOMPLETE`]'s content.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IncompleteRecord {
    pub schema_version: crate::schema::SchemaVersion,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// `study_incomplete`.
    pub kind: String,
    pub study_file: StudyFileRecord,
    /// The failure that stopped the study.
    pub error: String,
    /// The arms completed (the study's first ones, in order) and the ones not run.
    pub completed: Vec<String>,
    pub remaining: Vec<String>,
    /// The runner's environment and the reference's turns when the arms ran.
    pub carry: Carry,
}

/// The signed study's note of a resumed run: the interrupted run the carried arms come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Resumed {
    /// The interrupted run's id (its incomplete set's).
    pub run_id: String,
    /// The arms measured in that run, replayed here from its rows.
    pub arms: Vec<String>,
}

/// An incomplete set read back for `--resume`.
pub struct Resume {
    pub resumed: Resumed,
    pub carry: Carry,
    /// The carried arms' measurements as the interrupted run recorded them.
    measurements: Vec<Measurement>,
}

/// The largest carried file read back (a run's per-row records: 64 bytes a row).
const MAX_CARRY_FILE: u64 = 1 << 30;
/// The most carried bytes read back over every arm (held in memory until the runner takes them).
const MAX_CARRIED_BYTES: u64 = 2 << 30;

/// Write the completed arms' carry and [`INCOMPLETE`] into `out` (the set's directory; their
/// measurements are written beside as for a finished study).
pub fn write_incomplete(
    out: &Path,
    study: &Study,
    plan: &Plan,
    carry: &Carry,
    error: &Error,
    run_id: Option<&str>,
) -> Result<()> {
    if carry.arms.len() >= plan.arms.len() {
        return Err(Error::internal(
            &study.path,
            "an interrupted study with every arm done",
        ));
    }
    for (arm, carried) in plan.arms.iter().zip(&carry.arms) {
        let dir = out.join("arms").join(&arm.name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::write(&dir, e))?;
        for (name, bytes) in &carried.runs {
            crate::files::write_atomically(&dir.join(name), bytes)?;
        }
        write_json(
            &dir.join("carry.json"),
            &serde_json::to_value(&carried.record),
        )?;
    }
    let names = |arms: &[super::plan::PlannedArm]| arms.iter().map(|a| a.name.clone()).collect();
    let record = IncompleteRecord {
        schema_version: crate::schema::SchemaVersion,
        run_id: run_id.map(str::to_owned),
        kind: "study_incomplete".into(),
        study_file: StudyFileRecord {
            path: study.path.display().to_string(),
            sha256: study.sha256.clone(),
        },
        error: error.to_string(),
        completed: names(&plan.arms[..carry.arms.len()]),
        remaining: names(&plan.arms[carry.arms.len()..]),
        carry: carry.clone(),
    };
    write_json(&out.join(INCOMPLETE), &serde_json::to_value(&record))
}

fn write_json(path: &Path, value: &serde_json::Result<Value>) -> Result<()> {
    let value = value
        .as_ref()
        .map_err(|e| Error::internal(path, format!("cannot encode: {e}")))?;
    let mut text = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::internal(path, format!("cannot encode: {e}")))?;
    text.push(b'\n');
    crate::files::write_atomically(path, &text)
}

/// Read `out` as the incomplete set of `study` for `plan`: the set intact, the same study file,
/// its completed arms the plan's first ones, each with its carry and measurement.
pub fn read(out: &Path, study: &Study, plan: &Plan) -> Result<Resume> {
    let set = crate::outset::read_incomplete(out)?;
    let path = out.join(INCOMPLETE);
    let bytes = crate::files::read_capped(&path, 64 << 20, "an interrupted study's record")?;
    let record: IncompleteRecord =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&bytes))
            .map_err(|e| {
                Error::format(&path, Some(&e.path().to_string()), e.inner().to_string())
            })?;
    let refuse = |why: String| Err(Error::usage(out, format!("--resume: {why}")));
    if record.run_id.as_deref() != Some(set.run_id.as_str()) {
        return refuse(format!("{INCOMPLETE} belongs to another run than its set"));
    }
    if !record.study_file.sha256.eq_ignore_ascii_case(&study.sha256) {
        return refuse(format!(
            "the study file {} changed since the interrupted run (sha256 {} then, {} now); run the study again without --resume",
            study.path.display(),
            record.study_file.sha256,
            study.sha256
        ));
    }
    let planned: Vec<&str> = plan.arms.iter().map(|a| a.name.as_str()).collect();
    let done = record.completed.len();
    if done == 0
        || done >= planned.len()
        || planned[..done]
            != record
                .completed
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()[..]
        || planned[done..]
            != record
                .remaining
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()[..]
    {
        return refuse(format!(
            "the interrupted run completed {:?} and left {:?}; this study's arms are {planned:?}",
            record.completed, record.remaining
        ));
    }
    let mut carry = record.carry.clone();
    let mut measurements = Vec::with_capacity(done);
    let mut carried = 0u64;
    for name in &record.completed {
        let dir = out.join("arms").join(name);
        let carry_path = dir.join("carry.json");
        let bytes = crate::files::read_capped(&carry_path, 64 << 20, "a carried arm")?;
        let arm: RecordArm = serde_json::from_slice(&bytes)
            .map_err(|e| Error::format(&carry_path, None, e.to_string()))?;
        let lengths = plan.options.context_lengths.len();
        if arm.runs.len() != lengths {
            return Err(Error::format(
                &carry_path,
                Some("runs"),
                format!(
                    "{} runs; the study has {lengths} context lengths",
                    arm.runs.len()
                ),
            ));
        }
        let mut runs = Vec::with_capacity(arm.runs.len());
        for (i, run) in arm.runs.iter().enumerate() {
            let file = run_file_name(i);
            if run.path.as_deref() != Some(file.as_str()) {
                return Err(Error::format(
                    &carry_path,
                    Some(&format!("runs[{i}].path")),
                    format!("is not `{file}`"),
                ));
            }
            let path = dir.join(&file);
            carried += std::fs::metadata(&path)
                .map_err(|e| Error::io(&path, e))?
                .len();
            if carried > MAX_CARRIED_BYTES {
                return Err(Error::format(
                    &path,
                    None,
                    format!("the carried rows exceed {MAX_CARRIED_BYTES} bytes in all"),
                ));
            }
            let bytes = crate::files::read_capped(&path, MAX_CARRY_FILE, "a carried run")?;
            runs.push((file, bytes));
        }
        carry.arms.push(CarriedArm { record: arm, runs });
        measurements.push(Measurement::read(&dir.join("measurement.json"))?);
    }
    Ok(Resume {
        resumed: Resumed {
            run_id: set.run_id,
            arms: record.completed,
        },
        carry,
        measurements,
    })
}

/// Each carried arm, replayed, is the measurement the interrupted run recorded: the same
/// models, eval text, protocol and statistics of every run. (Its environment is this run's,
/// which the runner checked is the same software and GPU.)
pub fn check_replay(resume: &Resume, arms: &[ArmOutcome]) -> Result<()> {
    for ((name, before), arm) in resume
        .resumed
        .arms
        .iter()
        .zip(&resume.measurements)
        .zip(arms)
    {
        let now = &arm.rerun.measurement;
        let fields: [(&str, Value, Value); 5] = [
            (
                "candidate",
                json(&before.candidate.manifest_sha256),
                json(&now.candidate.manifest_sha256),
            ),
            (
                "reference",
                json(&before.reference.manifest_sha256),
                json(&now.reference.manifest_sha256),
            ),
            ("eval", json(&before.eval), json(&now.eval)),
            (
                "protocol_sha256",
                json(&before.protocol_sha256),
                json(&now.protocol_sha256),
            ),
            ("runs", json(&before.runs), json(&now.runs)),
        ];
        if let Some((what, a, b)) = fields.into_iter().find(|(_, a, b)| a != b) {
            let short = |v: &Value| {
                let s = v.to_string();
                if s.len() > 160 {
                    format!("{}…", &s[..s.floor_char_boundary(160)])
                } else {
                    s
                }
            };
            return Err(Error::mismatch(
                Path::new(name),
                Some(what),
                format!(
                    "--resume: the carried arm `{name}` replays to another measurement than the interrupted run recorded ({} then, {} now); run the study again without --resume",
                    short(&a),
                    short(&b)
                ),
            ));
        }
    }
    Ok(())
}

fn json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}
