//! The study's table of arms under a card's claims (`card --study study.json --arm NAME`).

use crate::error::Result;

/// For `card --study study.json --arm NAME`: the arm's measurement.json (beside study.json) and
/// the Markdown table of the study's arms at each context length, this arm's row in bold, that
/// the card's fidelity section shows under its claims.
pub fn card_comparison(study: &std::path::Path, arm: &str) -> Result<(std::path::PathBuf, String)> {
    use crate::error::Error;
    let bytes = crate::files::read_capped(
        study,
        crate::rerun::document::MAX_MEASUREMENT_BYTES,
        "a study.json",
    )?;
    let d: crate::study::document::StudyDocument =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&bytes))
            .map_err(|e| {
                Error::format(
                    study,
                    Some(&e.path().to_string()),
                    e.into_inner().to_string(),
                )
            })?;
    let found = d.arms.iter().find(|a| a.name == arm).ok_or_else(|| {
        Error::usage(
            study,
            format!(
                "--arm {arm}: the study has no such arm (it has: {})",
                d.arms
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    // Arm names are checked when the study is read ([`super::file`]): a path below arms/.
    let dir = study.parent().unwrap_or(std::path::Path::new("."));
    let measurement = dir.join("arms").join(&found.name).join("measurement.json");
    let esc = |t: &str| super::markdown(t);
    let mut table = format!(
        "**Among the study's arms** (study {}: the same reference, text and rows; each arm changes one variable; `cardproof study`):\n",
        esc(&d.name)
    );
    for (run_index, &length) in d.protocol.context_lengths.iter().enumerate() {
        table.push_str(&format!(
            "\n| arm (context {length}) | changes | bits/weight | kld_mean | 95% interval | top-1 agreement |\n|---|---|---|---|---|---|\n"
        ));
        for a in &d.arms {
            let Some(r) = a.runs.get(run_index) else {
                continue;
            };
            let num = |v: Option<f64>| {
                v.filter(|x| x.is_finite()).map_or("–".to_owned(), |x| {
                    if x != 0.0 && x.abs() < 1e-4 {
                        format!("{x:.3e}")
                    } else {
                        format!("{}", crate::disclosure::precision::round_sig(x, 4))
                    }
                })
            };
            let ci = r
                .uncertainty
                .get("kld_mean")
                .map(|u| u.ci95)
                .filter(|c| c.iter().all(|v| v.is_finite()))
                .map_or("–".to_owned(), |c| {
                    format!("[{}, {}]", num(Some(c[0])), num(Some(c[1])))
                });
            let name = if a.name == arm {
                format!("**{}**", esc(&a.name))
            } else {
                esc(&a.name)
            };
            table.push_str(&format!(
                "| {name} | {} | {} | {} | {ci} | {} |\n",
                esc(a.changes.as_str()),
                num(a.bits_per_weight),
                num(r.metrics.get("kld_mean").copied()),
                num(r.metrics.get("top1_agreement").copied()),
            ));
        }
    }
    Ok((measurement, table))
}
