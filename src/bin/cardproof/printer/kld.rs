//! `kld`: the measurement of two logit files, as a document or as the protocol in words and the
//! metric table; `--llamacpp-compat`, llama.cpp's own statistics.

use std::io::{self, Write as _};

use cardproof::findings::Severity;
use cardproof::kld::Measurement;
use cardproof::kld::compat::CompatMeasurement;
use cardproof::output::kld::CompatProtocol;
use cardproof::output::{KldCompatDocument, KldDocument};

use super::{Printer, write_json, write_stdout};
use crate::commands::kld::Kld;

impl Printer {
    pub fn kld(&self, kld: &Kld) -> io::Result<()> {
        match kld {
            Kld::Measurement(m) => self.measurement(m),
            Kld::Compat(m) => self.compat(m),
        }
    }

    fn measurement(&self, m: &Measurement) -> io::Result<()> {
        if m.n_nonfinite > 0 && self.diagnostics() {
            writeln!(
                io::stderr().lock(),
                "{}: {} row{} with non-finite logits (NaN or +inf) excluded, not averaged in",
                self.style().severity(Severity::Warning),
                m.n_nonfinite,
                if m.n_nonfinite == 1 { "" } else { "s" }
            )?;
        }
        if self.json() {
            return write_json(&KldDocument::new(m));
        }
        write_stdout(&cardproof::output::text::kld_measurement(m))
    }

    fn compat(&self, m: &CompatMeasurement) -> io::Result<()> {
        if self.json() {
            return write_json(&KldCompatDocument::new(m));
        }
        let protocol = CompatProtocol::of(&m.protocol).expect("llama.cpp's protocol reads back");
        let header = format!(
            "llama.cpp-compatible KLD: forward KL(P_base || P_cand) in nats, reference terms with \
             log p <= -16 dropped, second half of each {}-token window, {} rows; i.i.d. standard \
             errors\nprotocol_sha256: {}\n\n",
            protocol.context_length, m.n_positions, m.protocol_sha256
        );
        write_stdout(&(header + &m.llamacpp.render()))
    }
}
