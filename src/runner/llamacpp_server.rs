//! llama.cpp's own greedy generation: the user's `llama-server` (the same build as their
//! `llama-perplexity`) generates every turn of a conversation from the token ids cardproof
//! rendered, so the llama.cpp lane's turns are llama.cpp's, not an emulation of them.
//!
//! One server per model, started with the lane's flags (threads, batch sizes, offloading, flash
//! attention, KV-cache types), one slot (`-np 1`), a window that holds the longest prompt and
//! its turn, on a free port of 127.0.0.1, without its web page. Each turn is one `/completion`
//! request: the prompt as token ids, `n_predict` the turn's budget, only the top-k sampler with
//! `top_k` 1 and temperature 0 (greedy), `cache_prompt` (the slot keeps the prefix a prompt
//! shares with the one before: one prefill serves a conversation's nested prompts), the
//! generated ids returned (`return_tokens`).
//!
//! llama.cpp stops at its own end-of-generation tokens, cardproof at the plan's stop ids: each
//! answer is cut at the first stop id (kept, as the native runner keeps it); an answer that ended
//! at a token llama.cpp alone counts as an end is continued with another request from where it
//! stopped, so a turn is what greedy decoding to a stop id or the budget gives.
//!
//! Like every child process (`runner::child`): its own process group, killed on every way out
//! (the [`Server`]'s drop); its log read into memory with a cap; a deadline to answer `/health`
//! ([`START_TIMEOUT_VAR`]) and one per request ([`REQUEST_TIMEOUT_VAR`]); every answer read
//! with a size cap and checked (each id inside the vocabulary, never more ids than asked).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::runner::child::{self, Child, Output, Watch};
use crate::runner::llamacpp::{LlamacppBuild, LlamacppObserved, LlamacppSettings};
use crate::runner::native::generate::{Generated, GenerationTiming, Greedy, Stop};

/// The environment variable that sets how long a server may take to load its model and answer
/// `/health`, in seconds.
pub const START_TIMEOUT_VAR: &str = "CARDPROOF_LLAMACPP_SERVER_START_SECS";
/// Loading a model from a slow disk; raise it for larger.
const START_TIMEOUT: Duration = Duration::from_secs(300);
/// The environment variable that sets how long one `/completion` request may take, in seconds.
pub const REQUEST_TIMEOUT_VAR: &str = "CARDPROOF_LLAMACPP_REQUEST_SECS";
/// One turn: its prompt's uncached part and up to `max_new_tokens` steps.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// The most a server may log (its load report and a few lines per request).
const MAX_LOG_BYTES: usize = 64 << 20;
/// The largest `/completion` answer read: the ids of a turn of at most 65,536 tokens (the
/// protocol's limit) and the timings, with room for a build that ignores `response_fields`.
pub const MAX_ANSWER_BYTES: u64 = 8 << 20;
/// The largest `/health` answer read.
const MAX_HEALTH_BYTES: u64 = 64 << 10;
/// How often `/health` is asked while the model loads.
const HEALTH_POLL: Duration = Duration::from_millis(100);
/// Attempts at starting a server, each on a fresh port (another program may take the free port
/// between cardproof finding it and the server binding it).
const START_ATTEMPTS: usize = 3;
/// The sampler seed (greedy decoding draws nothing that changes a token; fixed all the same).
pub const SEED: u32 = 0;

/// The `llama-server` to run: `given` (`--llamacpp-server`), else the one beside the
/// `llama-perplexity` the lane runs (the same build, so the same kernels).
pub fn find_server(given: Option<&Path>, perplexity: &Path) -> Result<PathBuf> {
    if let Some(p) = given {
        if p.is_file() {
            return Ok(p.to_owned());
        }
        return Err(Error::usage(
            p,
            "no such file: --llamacpp-server names llama.cpp's llama-server binary",
        ));
    }
    let beside = perplexity
        .parent()
        .unwrap_or(Path::new("."))
        .join("llama-server");
    if beside.is_file() {
        return Ok(beside);
    }
    Err(Error::usage(
        &beside,
        format!(
            "--turns in the llama.cpp runner generates with llama.cpp's llama-server, and there is none beside {}: build it from the same source (cmake --build build --target llama-server) or name it with --llamacpp-server PATH",
            perplexity.display()
        ),
    ))
}

/// The request fields every turn sends (all but the prompt and `n_predict`): greedy decoding
/// as llama.cpp does it, recorded with the measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GreedyRequest {
    /// Only the top-k sampler (then llama.cpp's final draw over what is left: one token).
    pub samplers: Vec<String>,
    pub top_k: u32,
    pub temperature: f32,
    pub seed: u32,
    /// The slot keeps the prefix this prompt shares with the one before.
    pub cache_prompt: bool,
    /// The generated token ids in the answer.
    pub return_tokens: bool,
    pub stream: bool,
    pub n_probs: u32,
    /// llama.cpp's own samplers on the CPU, never a backend's (a GPU's top-k may break ties
    /// another way).
    pub backend_sampling: bool,
    /// The fields asked of each answer.
    pub response_fields: Vec<String>,
}

impl Default for GreedyRequest {
    fn default() -> Self {
        GreedyRequest {
            samplers: vec!["top_k".into()],
            top_k: 1,
            temperature: 0.0,
            seed: SEED,
            cache_prompt: true,
            return_tokens: true,
            stream: false,
            n_probs: 0,
            backend_sampling: false,
            response_fields: [
                "tokens",
                "stop_type",
                "truncated",
                "timings",
                "generation_settings/top_k",
            ]
            .map(str::to_owned)
            .to_vec(),
        }
    }
}

/// One `/completion` request.
#[derive(Serialize)]
struct CompletionRequest<'a> {
    prompt: &'a [u32],
    n_predict: usize,
    #[serde(flatten)]
    greedy: &'a GreedyRequest,
}

/// Why llama.cpp ended an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerStop {
    /// One of its end-of-generation tokens (the last id of the answer).
    Eos,
    /// `n_predict` reached.
    Limit,
    /// A stop word (cardproof sends none).
    Word,
}

/// llama.cpp's timings of one answer (`timings`), in its units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
pub struct AnswerTimings {
    /// Prompt tokens computed (the part not in the slot's cache).
    #[serde(default)]
    pub prompt_n: f64,
    #[serde(default)]
    pub prompt_ms: f64,
    /// Tokens generated.
    #[serde(default)]
    pub predicted_n: f64,
    #[serde(default)]
    pub predicted_ms: f64,
}

/// One `/completion` answer, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub tokens: Vec<u32>,
    pub stop: ServerStop,
    pub timings: Option<AnswerTimings>,
}

/// The fields of an answer cardproof reads (others are ignored: an older build sends more).
#[derive(Deserialize)]
struct Answer {
    tokens: Option<Vec<i64>>,
    stop_type: Option<String>,
    #[serde(default)]
    truncated: bool,
    timings: Option<AnswerTimings>,
    #[serde(rename = "generation_settings/top_k")]
    top_k: Option<i64>,
    generation_settings: Option<GenerationSettings>,
}

#[derive(Deserialize)]
struct GenerationSettings {
    top_k: Option<i64>,
}

/// A `/completion` answer read and checked: at most `n_predict` ids, each below `vocab` (the
/// tokenizer's entries), a known stop, no truncated window, greedy as asked (`top_k` 1 where
/// the answer says), finite non-negative timings. The reason otherwise.
pub fn parse_completion(
    body: &[u8],
    n_predict: usize,
    vocab: usize,
) -> std::result::Result<Completion, String> {
    let answer: Answer = serde_json::from_slice(body)
        .map_err(|e| format!("not a llama-server /completion answer: {e}"))?;
    let ids = answer.tokens.ok_or(
        "the answer holds no `tokens`: this llama-server does not return the generated ids (`return_tokens`; a newer build does)",
    )?;
    if ids.len() > n_predict {
        return Err(format!(
            "{} ids generated where at most {n_predict} were asked",
            ids.len()
        ));
    }
    let tokens = ids
        .iter()
        .map(|&id| {
            u32::try_from(id)
                .ok()
                .filter(|&t| (t as usize) < vocab)
                .ok_or_else(|| {
                    format!("generated id {id} is outside the tokenizer's {vocab} entries (a padding row of the output head, or not an id)")
                })
        })
        .collect::<std::result::Result<Vec<u32>, String>>()?;
    let stop = match answer.stop_type.as_deref() {
        Some("eos") => ServerStop::Eos,
        Some("limit") => ServerStop::Limit,
        Some("word") => ServerStop::Word,
        Some(other) => return Err(format!("unknown stop_type `{other}`")),
        None => return Err("the answer holds no `stop_type`".into()),
    };
    if answer.truncated {
        return Err(
            "llama.cpp truncated the window (the prompt and its turn did not fit its context)"
                .into(),
        );
    }
    let top_k = answer
        .top_k
        .or(answer.generation_settings.and_then(|g| g.top_k));
    if let Some(k) = top_k.filter(|&k| k != 1) {
        return Err(format!(
            "the server sampled with top_k {k}, not 1: not greedy"
        ));
    }
    if let Some(t) = &answer.timings {
        for (name, v) in [
            ("prompt_n", t.prompt_n),
            ("prompt_ms", t.prompt_ms),
            ("predicted_n", t.predicted_n),
            ("predicted_ms", t.predicted_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("timings.{name} {v} is not a finite count"));
            }
        }
    }
    Ok(Completion {
        tokens,
        stop,
        timings: answer.timings,
    })
}

/// One answer appended to a turn: its ids up to and including the first stop id. `Some`: the
/// turn is over (a stop id, or the budget); `None`: llama.cpp ended at a token of its own that
/// is no stop id here, and the turn goes on from there. The reason when the answer cannot be
/// part of a greedy turn.
pub fn extend_turn(
    turn: &mut Vec<u32>,
    answer: &Completion,
    g: &Greedy,
) -> std::result::Result<Option<Stop>, String> {
    for &id in &answer.tokens {
        turn.push(id);
        if g.stops.contains(&id) {
            return Ok(Some(Stop::StopToken));
        }
        if turn.len() >= g.max_new_tokens {
            return Ok(Some(Stop::MaxTokens));
        }
    }
    match answer.stop {
        ServerStop::Eos if !answer.tokens.is_empty() => Ok(None),
        ServerStop::Eos => Err("llama.cpp ended the turn without generating a token".into()),
        ServerStop::Limit => Err(format!(
            "llama.cpp stopped after {} tokens, before the {} asked (a time or context limit of the server)",
            answer.tokens.len(),
            g.max_new_tokens
        )),
        ServerStop::Word => Err("llama.cpp stopped at a stop word (cardproof sends none)".into()),
    }
}

/// How one server runs: its binary, model, flags and window.
pub struct ServerSpec<'a> {
    pub binary: &'a Path,
    pub model: &'a Path,
    pub settings: &'a LlamacppSettings,
    pub n_ctx: usize,
    /// `reference`, `candidate`: named in messages.
    pub role: &'a str,
}

/// What a model's server run records: its flags as given, its window, what its log says it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ServerRun {
    pub settings: LlamacppSettings,
    /// `-c`.
    pub n_ctx: u32,
    pub observed: LlamacppObserved,
    /// `/completion` requests made (a turn llama.cpp ended at a token of its own takes more
    /// than one).
    pub requests: usize,
}

/// How the turns ran in llama.cpp: the server binary, the request every turn sends, and each
/// model's server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LlamacppTurnsRecord {
    pub server: LlamacppBuild,
    pub request: GreedyRequest,
    pub reference: ServerRun,
    pub candidate: ServerRun,
}

/// A running `llama-server` with its model loaded; dropped, its process group is killed.
pub struct Server {
    child: Child,
    watch: Watch,
    url: String,
    agent: ureq::Agent,
    binary: PathBuf,
    role: String,
    requests: usize,
}

impl Server {
    /// Starts the server of `spec` and waits until its model is loaded (`/health` answers 200),
    /// within [`START_TIMEOUT_VAR`]'s limit.
    pub fn start(spec: &ServerSpec) -> Result<Server> {
        let start_limit = child::timeout_from_env(START_TIMEOUT_VAR, START_TIMEOUT)?;
        let request_limit = child::timeout_from_env(REQUEST_TIMEOUT_VAR, REQUEST_TIMEOUT)?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port().map_err(|e| {
                Error::runner(spec.binary, format!("no free port on 127.0.0.1: {e}"))
            })?;
            let mut server = Server::spawn(spec, port, request_limit)?;
            match server.wait_healthy(start_limit) {
                Ok(()) => return Ok(server),
                Err(why) => {
                    let log = server.stop();
                    let lost_port = log.contains("couldn't bind");
                    last = Some(server.error(why, &log));
                    if !lost_port {
                        break;
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::internal(spec.binary, "no attempt at starting it")))
    }

    fn spawn(spec: &ServerSpec, port: u16, request_limit: Duration) -> Result<Server> {
        let mut c = Command::new(spec.binary);
        c.arg("-m").arg(spec.model).args([
            "-c",
            &spec.n_ctx.to_string(),
            "-np",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--no-webui",
            "--seed",
            &SEED.to_string(),
            "-lv",
            "4",
        ]);
        c.args(spec.settings.args());
        if !spec.settings.rotation {
            c.env("LLAMA_ATTN_ROT_DISABLE", "1");
        }
        if std::env::var_os("OMP_WAIT_POLICY").is_none() {
            c.env("OMP_WAIT_POLICY", "PASSIVE");
        }
        let watch = Watch::new();
        let name = format!("the {} server", spec.role);
        let child = watch
            .spawn(&name, c, Output::Capture { cap: MAX_LOG_BYTES })
            .map_err(|e| Error::runner(spec.binary, format!("cannot start it: {e}")))?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            // The server is on this machine: no proxy from the environment.
            .proxy(None)
            .timeout_global(Some(request_limit))
            .build()
            .into();
        Ok(Server {
            child,
            watch,
            url: format!("http://127.0.0.1:{port}"),
            agent,
            binary: spec.binary.to_owned(),
            role: spec.role.to_owned(),
            requests: 0,
        })
    }

    /// Polls `/health` until it answers 200, the server exits, or `limit` passes.
    fn wait_healthy(&mut self, limit: Duration) -> std::result::Result<(), String> {
        let deadline = Instant::now() + limit;
        let probe: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        loop {
            if let Some(why) = self.watch.failure() {
                return Err(why);
            }
            if let Some(status) = self.child.exited() {
                return Err(format!("it exited ({status}) before its model was loaded"));
            }
            if let Ok(mut r) = probe.get(format!("{}/health", self.url)).call() {
                let ok = r.status() == 200;
                // Read (and bound) the body so the connection ends cleanly.
                let _ = r
                    .body_mut()
                    .with_config()
                    .limit(MAX_HEALTH_BYTES)
                    .read_to_vec();
                if ok {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "its model was not loaded within {} ({START_TIMEOUT_VAR})",
                    child::seconds(limit)
                ));
            }
            std::thread::sleep(HEALTH_POLL);
        }
    }

    /// One `/completion` of `prompt`, at most `n_predict` ids, each checked below `vocab`.
    pub fn complete(
        &mut self,
        prompt: &[u32],
        n_predict: usize,
        vocab: usize,
    ) -> Result<Completion> {
        let body = serde_json::to_vec(&CompletionRequest {
            prompt,
            n_predict,
            greedy: &GreedyRequest::default(),
        })
        .map_err(|e| Error::internal(&self.binary, format!("a request: {e}")))?;
        self.requests += 1;
        let answered = self
            .agent
            .post(format!("{}/completion", self.url))
            .header("content-type", "application/json")
            .send(&body[..]);
        let mut response = match answered {
            Ok(r) => r,
            Err(ureq::Error::Timeout(_)) => {
                return Err(self.failed(format!(
                    "/completion did not answer within its deadline ({REQUEST_TIMEOUT_VAR}): stopped"
                )));
            }
            Err(e) => return Err(self.failed(format!("/completion: {e}"))),
        };
        let status = response.status();
        let bytes = response
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .read_to_vec();
        let bytes = match bytes {
            Ok(b) => b,
            Err(e) => return Err(self.failed(format!("reading its /completion answer: {e}"))),
        };
        if status != 200 {
            let text = String::from_utf8_lossy(&bytes);
            return Err(self.failed(format!(
                "/completion answered {status}: {}",
                clip(text.trim(), 300)
            )));
        }
        parse_completion(&bytes, n_predict, vocab)
            .map_err(|why| self.failed(format!("its /completion answer: {why}")))
    }

    /// Stops the server (its whole group) and returns its log.
    fn stop(&mut self) -> String {
        self.child.kill();
        self.child.output()
    }

    /// Stops the server; returns what its log says it did and how many requests it answered.
    pub fn finish(mut self) -> (LlamacppObserved, usize) {
        let log = self.stop();
        (crate::runner::llamacpp::observe(&log), self.requests)
    }

    /// The server stopped for `why`, with the last lines of its log (the watch's own failure,
    /// a flood of output, is the reason where there is one).
    fn failed(&mut self, why: String) -> Error {
        let log = self.stop();
        self.error(why, &log)
    }

    fn error(&self, why: String, log: &str) -> Error {
        let why = self.watch.failure().unwrap_or(why);
        let lines: Vec<&str> = log.lines().collect();
        let tail: Vec<String> = lines[lines.len().saturating_sub(6)..]
            .iter()
            .map(|l| clip(l, 300))
            .collect();
        let said = if tail.is_empty() {
            String::new()
        } else {
            format!("; it said:\n    {}", tail.join("\n    "))
        };
        Error::runner(
            &self.binary,
            format!("the {} llama-server: {why}{said}", self.role),
        )
    }
}

/// A port of 127.0.0.1 no program listens on now.
fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// `text` cut at `chars` characters, marked when cut.
fn clip(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Every prompt of `prompts` generated greedily by `server`, in order (the slot's cache keeps
/// what consecutive prompts share), each turn cut at its first stop id and continued past an
/// end of llama.cpp's own; `progress(done)` after each turn. Returns the turns and where the
/// time went, in llama.cpp's own timings.
pub fn generate_turns(
    server: &mut Server,
    prompts: &[&[u32]],
    g: &Greedy,
    progress: &dyn Fn(usize),
) -> Result<(Vec<Generated>, GenerationTiming)> {
    let mut out = Vec::with_capacity(prompts.len());
    let mut timing = GenerationTiming::default();
    for (i, prompt) in prompts.iter().enumerate() {
        let mut turn = Vec::new();
        let stop = loop {
            let mut asked = prompt.to_vec();
            asked.extend_from_slice(&turn);
            let answer = server.complete(&asked, g.max_new_tokens - turn.len(), g.used)?;
            if let Some(t) = &answer.timings {
                timing.prefill_tokens += t.prompt_n as usize;
                timing.prefill_seconds += t.prompt_ms / 1e3;
                timing.generated_tokens += t.predicted_n as usize;
                timing.decode_seconds += t.predicted_ms / 1e3;
            }
            match extend_turn(&mut turn, &answer, g) {
                Ok(Some(stop)) => break stop,
                Ok(None) => {}
                Err(why) => {
                    return Err(server.failed(format!(
                        "turn {} of {}: {why}",
                        i + 1,
                        prompts.len()
                    )));
                }
            }
        };
        out.push(Generated { tokens: turn, stop });
        progress(i + 1);
    }
    Ok((out, timing))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greedy(max: usize, stops: &[u32]) -> Greedy {
        Greedy {
            max_new_tokens: max,
            stops: stops.to_vec(),
            used: 100,
        }
    }

    fn answer(tokens: &[u32], stop: ServerStop) -> Completion {
        Completion {
            tokens: tokens.to_vec(),
            stop,
            timings: None,
        }
    }

    #[test]
    fn a_well_formed_answer_is_read() {
        let body = br#"{"tokens":[5,7,9],"stop_type":"eos","truncated":false,
            "timings":{"prompt_n":12,"prompt_ms":3.5,"predicted_n":3,"predicted_ms":1.25},
            "generation_settings/top_k":1,"content":"ignored"}"#;
        let c = parse_completion(body, 4, 100).unwrap();
        assert_eq!(c.tokens, vec![5, 7, 9]);
        assert_eq!(c.stop, ServerStop::Eos);
        assert_eq!(c.timings.unwrap().predicted_ms, 1.25);
        // An older build's full answer (no response_fields): the nested settings are read.
        let body = br#"{"tokens":[1],"stop_type":"limit","generation_settings":{"top_k":1}}"#;
        assert_eq!(
            parse_completion(body, 1, 100).unwrap().stop,
            ServerStop::Limit
        );
    }

    /// Every malformed or untrustworthy answer is refused with its reason, never read as a turn.
    #[test]
    fn malformed_answers_are_refused() {
        let cases: [(&[u8], &str); 11] = [
            (b"not json", "not a llama-server"),
            (b"[1,2]", "not a llama-server"),
            (br#"{"stop_type":"eos"}"#, "no `tokens`"),
            (
                br#"{"tokens":[1,2,3,4,5],"stop_type":"limit"}"#,
                "at most 4",
            ),
            (
                br#"{"tokens":[100],"stop_type":"eos"}"#,
                "outside the tokenizer's 100",
            ),
            (br#"{"tokens":[-1],"stop_type":"eos"}"#, "generated id -1"),
            (
                br#"{"tokens":[1.5],"stop_type":"eos"}"#,
                "not a llama-server",
            ),
            (br#"{"tokens":[1]}"#, "no `stop_type`"),
            (
                br#"{"tokens":[1],"stop_type":"tired"}"#,
                "unknown stop_type",
            ),
            (
                br#"{"tokens":[1],"stop_type":"limit","truncated":true}"#,
                "truncated",
            ),
            (
                br#"{"tokens":[1],"stop_type":"eos","generation_settings/top_k":40}"#,
                "top_k 40",
            ),
        ];
        for (body, why) in cases {
            let e = parse_completion(body, 4, 100).unwrap_err();
            assert!(e.contains(why), "{}: {e}", String::from_utf8_lossy(body));
        }
        let e = parse_completion(
            br#"{"tokens":[1],"stop_type":"eos","timings":{"prompt_ms":-1}}"#,
            4,
            100,
        )
        .unwrap_err();
        assert!(e.contains("timings.prompt_ms"), "{e}");
    }

    /// A turn is cut at its first stop id (kept), ends at the budget, and goes on past an end of
    /// llama.cpp's own that is no stop id here; anything else is an error.
    #[test]
    fn answers_make_turns_as_the_native_runner_makes_them() {
        let g = greedy(6, &[9]);
        let mut turn = Vec::new();
        // llama.cpp generated past the stop id (not one of its own ends): cut there, kept.
        let stop = extend_turn(&mut turn, &answer(&[1, 9, 3], ServerStop::Limit), &g);
        assert_eq!((stop, &turn[..]), (Ok(Some(Stop::StopToken)), &[1, 9][..]));

        let mut turn = Vec::new();
        // llama.cpp ended at its own end token 4: the turn goes on, 4 in it.
        assert_eq!(
            extend_turn(&mut turn, &answer(&[1, 4], ServerStop::Eos), &g),
            Ok(None)
        );
        let stop = extend_turn(&mut turn, &answer(&[2, 3, 5, 6], ServerStop::Limit), &g);
        assert_eq!(
            (stop, &turn[..]),
            (Ok(Some(Stop::MaxTokens)), &[1, 4, 2, 3, 5, 6][..])
        );

        let mut turn = Vec::new();
        assert!(extend_turn(&mut turn, &answer(&[1], ServerStop::Limit), &g).is_err());
        assert!(extend_turn(&mut Vec::new(), &answer(&[], ServerStop::Eos), &g).is_err());
        assert!(extend_turn(&mut Vec::new(), &answer(&[1], ServerStop::Word), &g).is_err());
    }

    #[test]
    fn the_server_is_found_beside_llama_perplexity_or_named() {
        let dir = tempfile::tempdir().unwrap();
        let perplexity = dir.path().join("llama-perplexity");
        std::fs::write(&perplexity, b"").unwrap();
        let e = find_server(None, &perplexity).unwrap_err();
        assert!(e.to_string().contains("--llamacpp-server"), "{e}");
        std::fs::write(dir.path().join("llama-server"), b"").unwrap();
        assert_eq!(
            find_server(None, &perplexity).unwrap(),
            dir.path().join("llama-server")
        );
        let e = find_server(Some(&dir.path().join("nope")), &perplexity).unwrap_err();
        assert!(e.to_string().contains("no such file"), "{e}");
    }
}
