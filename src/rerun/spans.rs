//! Statistics by span for a conversation eval text: the scored rows split by what their
//! predicted token is (its segment, its message's role, inside or outside a tool call), each
//! part summarized exactly as a whole run is ([`stats::summarize`]: the same metrics, the same
//! seeded block bootstrap over the same windows). The seed study's failures were tool calls, and
//! a corpus mean hides them: these say whether the damage sits inside tool calls or elsewhere.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::options::MeasureOptions;
use crate::conversation::eval::TokenLabel;
use crate::kld::protocol::{Role, Segment};
use crate::kld::stats::{self, Scored, Uncertainty};

/// One part of a run's scored rows.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SpanSummary {
    /// What splits the rows: `segment`, `role`, or `tool_call` (its parts `inside` and
    /// `outside`).
    pub by: String,
    /// The part: a segment (`content`, `reasoning`, `tool_call`, `tool_result`,
    /// `scaffolding`), a role (`system`, ..., `none` for the generation prompt), or
    /// `inside`/`outside`.
    pub name: String,
    pub n_positions: usize,
    /// Rows whose reference and candidate top-1 tokens differ.
    pub top1_flips: usize,
    /// The metrics of these rows, named as a run's (`kld_mean`, `top1_agreement`, ...).
    #[serde(deserialize_with = "crate::json_f64::map")]
    #[schemars(with = "BTreeMap<String, Option<f64>>")]
    pub metrics: BTreeMap<String, f64>,
    pub uncertainty: BTreeMap<String, Uncertainty>,
}

/// The parts of a run's rows by segment, by role, and inside/outside tool calls (empty when the
/// rows carry no labels: plain text). Parts with no rows are left out.
pub fn summarize(rows: &[Scored], labels: &[TokenLabel], o: &MeasureOptions) -> Vec<SpanSummary> {
    if labels.is_empty() || labels.len() != rows.len() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut part = |by: &str, name: &str, keep: &dyn Fn(&TokenLabel) -> bool| {
        let subset: Vec<Scored> = rows
            .iter()
            .zip(labels)
            .filter(|(_, l)| keep(l))
            .map(|(r, _)| *r)
            .collect();
        if subset.is_empty() {
            return;
        }
        let s = stats::summarize(
            &subset,
            o.direction.forward(),
            o.direction.reverse(),
            o.bootstrap.resamples,
            o.bootstrap.seed,
            o.bootstrap.level,
        );
        out.push(SpanSummary {
            by: by.into(),
            name: name.into(),
            n_positions: subset.len(),
            top1_flips: subset
                .iter()
                .filter(|r| r.record.ref_top1 != r.record.cand_top1)
                .count(),
            metrics: s.metrics,
            uncertainty: s.uncertainty,
        });
    };
    for segment in Segment::ALL {
        part("segment", segment.as_str(), &|l| l.segment == segment);
    }
    for role in Role::ALL.into_iter().map(Some).chain([None]) {
        part("role", role.map_or("none", Role::as_str), &|l| {
            l.role == role
        });
    }
    part("tool_call", "inside", &|l| l.segment == Segment::ToolCall);
    part("tool_call", "outside", &|l| l.segment != Segment::ToolCall);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kld::row::RowRecord;

    fn row(forward: f64, flip: bool, block: u32) -> Scored {
        Scored {
            record: RowRecord {
                forward,
                reverse: forward,
                ref_top1: 1,
                cand_top1: if flip { 2 } else { 1 },
                ref_top1_prob: 0.5,
                nll_ref: Some(1.0),
                nll_cand: Some(1.0),
            },
            block,
            position: 0,
            window_len: 8,
        }
    }

    #[test]
    fn each_part_is_summarized_as_a_run_and_parts_without_rows_are_left_out() {
        let label = |segment, role| TokenLabel {
            conversation: 0,
            message: Some(0),
            role,
            segment,
        };
        let rows = vec![row(0.1, false, 0), row(0.3, true, 0), row(0.5, true, 1)];
        let labels = vec![
            label(Segment::Content, Some(Role::User)),
            label(Segment::ToolCall, Some(Role::Assistant)),
            label(Segment::ToolCall, Some(Role::Assistant)),
        ];
        let o = crate::rerun::options::ProtocolFlags::default()
            .options(&[8], crate::kld::protocol::Bos::None)
            .unwrap();
        let parts = summarize(&rows, &labels, &o);
        let get = |by: &str, name: &str| {
            parts
                .iter()
                .find(|p| p.by == by && p.name == name)
                .unwrap_or_else(|| panic!("{by}/{name}"))
        };
        let calls = get("segment", "tool_call");
        assert_eq!((calls.n_positions, calls.top1_flips), (2, 2));
        assert!((calls.metrics["kld_mean"] - 0.4).abs() < 1e-12);
        assert_eq!(calls.metrics["top1_agreement"], 0.0);
        assert_eq!(get("tool_call", "inside").n_positions, 2);
        let outside = get("tool_call", "outside");
        assert!((outside.metrics["kld_mean"] - 0.1).abs() < 1e-12);
        assert_eq!(get("role", "assistant").n_positions, 2);
        assert!(
            parts
                .iter()
                .all(|p| p.name != "reasoning" && p.name != "none")
        );
        assert!(summarize(&rows, &[], &o).is_empty());
    }
}
