//! Child processes cardproof starts (the user's `llama-perplexity`, the transformers runner's
//! Python), run so that none can hang cardproof, flood it, or outlive it.
//!
//! - **A process group of its own.** Each child leads a new process group, so the program and
//!   everything it started are killed together (`kill(-pgid, SIGKILL)`): when its leader exits
//!   (whatever it left running goes with it), on every error, on a panic (the [`Child`]'s drop),
//!   and on Ctrl-C, `SIGTERM` or `SIGHUP` to cardproof (the groups are no longer in the
//!   terminal's foreground group, so a handler forwards the signal as a kill, then cardproof dies
//!   of the signal as before). The leader's exit is seen without reaping it (`waitid` with
//!   `WNOWAIT`), so its group id cannot be reused before the group is killed.
//! - **Output read with a cap.** A child's merged stdout and stderr go through a pipe into
//!   memory, up to a cap: past it the whole [`Watch`] fails and its groups are killed (a log
//!   that floods is an error, never a full disk or an abort). Programs whose output is a line
//!   protocol are read with [`read_lines_capped`], each line cut at a length.
//! - **A deadline or a stall timeout.** [`Watch::wait`] takes a deadline (a `--version` answers
//!   within a minute); [`Watch::stall_timeout`] fails the watch when no byte moved on the streams
//!   it watches ([`Watch::touch`], [`Progressing`]) for the limit, which unblocks every read and
//!   write of those streams, since their processes are killed.
//!
//! The first failure any watcher sees is kept ([`Watch::failure`]): it is the error to report,
//! not the broken pipe or short read it caused downstream.

use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How often a waiting loop looks at its children and its watch.
const POLL: Duration = Duration::from_millis(10);
/// How long a child's output may take to reach its end once the child's group is dead.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// The longest timeout an environment variable may set: a week.
const MAX_TIMEOUT_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// A duration from the environment variable `name` (seconds, fractions allowed), else `default`.
/// A value that is not a positive number of seconds up to a week is refused naming the variable,
/// never replaced by the default silently.
pub fn timeout_from_env(name: &str, default: Duration) -> Result<Duration> {
    match std::env::var_os(name) {
        None => Ok(default),
        Some(raw) => parse_timeout(name, &raw.to_string_lossy()),
    }
}

fn parse_timeout(name: &str, text: &str) -> Result<Duration> {
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= MAX_TIMEOUT_SECS => {
            Ok(Duration::from_secs_f64(s))
        }
        _ => Err(Error::usage(
            Path::new(name),
            format!(
                "`{text}` is not a timeout: give seconds, more than 0 and at most {MAX_TIMEOUT_SECS} (a week)"
            ),
        )),
    }
}

/// A duration as messages print it (`300 s`, `0.5 s`).
pub fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// Processes run together, and the first reason any watcher had to stop them.
#[derive(Clone)]
pub struct Watch {
    shared: Arc<Shared>,
}

struct Shared {
    /// The process groups of the watched children still running.
    groups: Mutex<Vec<i32>>,
    failure: Mutex<Option<String>>,
    start: Instant,
    /// Milliseconds from `start` to the last byte a watched stream moved.
    last_progress_ms: AtomicU64,
}

impl Default for Watch {
    fn default() -> Self {
        Self::new()
    }
}

impl Watch {
    pub fn new() -> Watch {
        Watch {
            shared: Arc::new(Shared {
                groups: Mutex::new(Vec::new()),
                failure: Mutex::new(None),
                start: Instant::now(),
                last_progress_ms: AtomicU64::new(0),
            }),
        }
    }

    /// Stops every watched process, for `why`; the first reason given is the one kept.
    pub fn fail(&self, why: impl Into<String>) {
        if let Ok(mut f) = self.shared.failure.lock()
            && f.is_none()
        {
            *f = Some(why.into());
        }
        // Killed under the lock: a child leaves the list (under it) before it is reaped, so no
        // group is killed after its leader's pid could be reused.
        if let Ok(groups) = self.shared.groups.lock() {
            for &g in groups.iter() {
                kill_group(g);
            }
        }
    }

    /// Why the watch stopped its processes, if it did.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure.lock().ok().and_then(|f| f.clone())
    }

    /// A byte moved on a watched stream: the stall timeout starts again.
    pub fn touch(&self) {
        let ms = self.shared.start.elapsed().as_millis() as u64;
        self.shared.last_progress_ms.store(ms, Ordering::Relaxed);
    }

    /// Fails the watch, for `why`, once no byte moved for `limit`, counted from now and from
    /// each [`Watch::touch`]; stops when the guard is dropped. `Err`: its thread could not
    /// start (no run goes unwatched).
    pub fn stall_timeout(
        &self,
        limit: Duration,
        why: impl Into<String>,
    ) -> std::io::Result<StallGuard> {
        self.touch();
        let stop = Arc::new(AtomicBool::new(false));
        let (watch, flag, why) = (self.clone(), stop.clone(), why.into());
        let tick = (limit / 20).clamp(Duration::from_millis(1), Duration::from_millis(50));
        let thread = std::thread::Builder::new()
            .name("cardproof-stall".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    let last = watch.shared.last_progress_ms.load(Ordering::Relaxed);
                    let now = watch.shared.start.elapsed().as_millis() as u64;
                    if Duration::from_millis(now.saturating_sub(last)) >= limit {
                        watch.fail(why);
                        return;
                    }
                }
            })?;
        Ok(StallGuard {
            stop,
            thread: Some(thread),
        })
    }

    /// Starts `command` (consumed: it holds the pipe's write ends, which must close with the
    /// child for its output to end) as `name`, in a process group of its own, stdin empty.
    /// `output`: merged into memory up to a cap, or piped for the caller to read.
    pub fn spawn(
        &self,
        name: &str,
        mut command: Command,
        output: Output,
    ) -> std::io::Result<Child> {
        use std::os::unix::process::CommandExt;
        command.process_group(0).stdin(Stdio::null());
        let reader = match output {
            Output::Capture { cap } => {
                let (reader, writer) = std::io::pipe()?;
                command.stdout(writer.try_clone()?).stderr(writer);
                Some((reader, cap))
            }
            Output::Piped => {
                command.stdout(Stdio::piped()).stderr(Stdio::piped());
                None
            }
        };
        let process = command.spawn()?;
        drop(command);
        let pgid = process.id() as i32;
        let slot = forward::register(pgid);
        if let Ok(mut g) = self.shared.groups.lock() {
            g.push(pgid);
        }
        let mut child = Child {
            name: name.to_owned(),
            process,
            pgid,
            slot,
            capture: None,
            status: None,
            lost: None,
            watch: self.clone(),
        };
        if slot.is_none() {
            child.kill();
            return Err(std::io::Error::other(
                "more child processes at once than cardproof can stop on an interrupt",
            ));
        }
        if let Some((reader, cap)) = reader {
            // On an error the child is dropped, so killed.
            child.capture = Some(Capture::start(reader, cap, name, self.clone())?);
        }
        Ok(child)
    }

    /// Waits for `child` to exit, until `deadline` if one is given; `Err` is why it was stopped
    /// instead (this watch's failure, or the deadline).
    pub fn wait(
        &self,
        child: &mut Child,
        deadline: Option<(Instant, &str)>,
    ) -> std::result::Result<ExitStatus, String> {
        loop {
            if let Some(why) = self.failure() {
                child.kill();
                return Err(why);
            }
            if let Some(status) = child.exited() {
                return match &child.lost {
                    Some(e) => Err(format!("{}: its exit status was lost: {e}", child.name)),
                    None => Ok(status),
                };
            }
            if let Some((at, what)) = deadline
                && Instant::now() >= at
            {
                self.fail(what);
                child.kill();
                return Err(self.failure().unwrap_or_else(|| what.to_owned()));
            }
            std::thread::sleep(POLL);
        }
    }

    fn forget(&self, pgid: i32) {
        if let Ok(mut g) = self.shared.groups.lock() {
            g.retain(|&p| p != pgid);
        }
    }
}

/// Stops a [`Watch::stall_timeout`] when dropped.
pub struct StallGuard {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for StallGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where a child's stdout and stderr go.
#[derive(Debug, Clone, Copy)]
pub enum Output {
    /// Both into one pipe, read into memory; more than `cap` bytes fails the watch.
    Capture { cap: usize },
    /// Two pipes the caller reads ([`Child::take_stdout`], [`Child::take_stderr`]).
    Piped,
}

/// A child process leading its own group; dropping it kills the group and reaps the child.
pub struct Child {
    name: String,
    process: std::process::Child,
    pgid: i32,
    /// Its place in the interrupt handler's table.
    slot: Option<usize>,
    capture: Option<Capture>,
    status: Option<ExitStatus>,
    /// Why the status could not be read (it then reads as exit status 1).
    lost: Option<String>,
    watch: Watch,
}

impl Child {
    /// The name it was started as (`the reference process`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its exit status once it has exited (never blocks). When its leader has exited, whatever
    /// it left in its group is killed before the leader is reaped.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() && leader_exited(self.pgid) {
            self.finish();
        }
        self.status
    }

    /// Kills its whole group and reaps it (nothing when it was already reaped).
    pub fn kill(&mut self) {
        if self.status.is_none() {
            self.finish();
        }
    }

    /// Its output so far as text (lossy UTF-8), all of it once it has ended: waits briefly for
    /// the pipe to reach its end.
    pub fn output(&mut self) -> String {
        match &mut self.capture {
            Some(c) => c.text(),
            None => String::new(),
        }
    }

    /// The stdout pipe of an [`Output::Piped`] child, once.
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.process.stdout.take()
    }

    /// The stderr pipe of an [`Output::Piped`] child, once.
    pub fn take_stderr(&mut self) -> Option<std::process::ChildStderr> {
        self.process.stderr.take()
    }

    /// Kills the group, forgets it, then reaps the leader: until then the leader's pid, and so
    /// the group's id, cannot be reused, so no kill can reach another process.
    fn finish(&mut self) {
        kill_group(self.pgid);
        self.watch.forget(self.pgid);
        if let Some(slot) = self.slot.take() {
            forward::unregister(slot);
        }
        // SIGKILL cannot be caught: the wait ends (the status says killed when it was).
        self.status = Some(match self.process.wait() {
            Ok(status) => status,
            Err(e) => {
                use std::os::unix::process::ExitStatusExt;
                self.lost = Some(e.to_string());
                ExitStatus::from_raw(1 << 8)
            }
        });
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A child's merged output, read on a thread into memory up to a cap.
struct Capture {
    data: Arc<Mutex<Vec<u8>>>,
    ended: mpsc::Receiver<()>,
    done: bool,
}

impl Capture {
    fn start(
        mut reader: std::io::PipeReader,
        cap: usize,
        name: &str,
        watch: Watch,
    ) -> std::io::Result<Capture> {
        let data = Arc::new(Mutex::new(Vec::new()));
        let (tx, ended) = mpsc::channel();
        let (sink, name) = (data.clone(), name.to_owned());
        let read = move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                let Ok(mut d) = sink.lock() else { break };
                let room = cap.saturating_sub(d.len());
                d.extend_from_slice(&buf[..n.min(room)]);
                if n > room {
                    drop(d);
                    watch.fail(format!(
                        "{name} wrote more than {} of output: stopped",
                        bytes(cap as u64)
                    ));
                    break;
                }
            }
            let _ = tx.send(());
        };
        std::thread::Builder::new()
            .name("cardproof-child-output".into())
            .spawn(read)?;
        Ok(Capture {
            data,
            ended,
            done: false,
        })
    }

    fn text(&mut self) -> String {
        if !self.done {
            self.done = self.ended.recv_timeout(DRAIN_GRACE).is_ok();
        }
        self.data
            .lock()
            .map(|d| String::from_utf8_lossy(&d).into_owned())
            .unwrap_or_default()
    }
}

/// `n` bytes as messages print it (`64 MiB`, `65536 bytes`).
pub fn bytes(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

/// Reads `reader` line by line to its end, handing each line to `each` (lossy UTF-8, without its
/// newline), a line longer than `max_line` bytes cut there (the rest of it is read and dropped):
/// a program that never prints a newline cannot grow cardproof's memory.
pub fn read_lines_capped(reader: impl Read, max_line: usize, mut each: impl FnMut(String)) {
    let mut r = std::io::BufReader::with_capacity(64 << 10, reader);
    let mut line = Vec::new();
    loop {
        let (consumed, ended) = match r.fill_buf() {
            Ok([]) => break,
            Ok(buf) => {
                let (part, ended) = match buf.iter().position(|&b| b == b'\n') {
                    Some(i) => (&buf[..i], Some(i + 1)),
                    None => (buf, None),
                };
                let room = max_line.saturating_sub(line.len());
                line.extend_from_slice(&part[..part.len().min(room)]);
                (ended.unwrap_or(buf.len()), ended.is_some())
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        r.consume(consumed);
        if ended {
            let text = String::from_utf8_lossy(&line);
            each(text.trim_end_matches('\r').to_owned());
            line.clear();
        }
    }
    if !line.is_empty() {
        each(String::from_utf8_lossy(&line).into_owned());
    }
}

/// A stream whose every byte moved counts as progress of a [`Watch`].
pub struct Progressing<S> {
    inner: S,
    watch: Watch,
}

impl<S> Progressing<S> {
    pub fn new(inner: S, watch: &Watch) -> Self {
        Progressing {
            inner,
            watch: watch.clone(),
        }
    }
}

impl<S: Read> Read for Progressing<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 {
            self.watch.touch();
        }
        Ok(n)
    }
}

impl<S: Write> Write for Progressing<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        if n > 0 {
            self.watch.touch();
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `kill(-pgid, SIGKILL)`: the group and everything in it. A group already gone is no error.
#[allow(unsafe_code)]
fn kill_group(pgid: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) reads no memory of ours; the group is one this module created.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// Whether the process `pid` (our child) has exited, leaving it unreaped: while it is a zombie
/// its pid, and so its group id, cannot be reused. A child already gone (`ECHILD`: SIGCHLD
/// ignored by whoever started cardproof reaps children unasked) has exited too.
#[allow(unsafe_code)]
fn leader_exited(pid: i32) -> bool {
    // SAFETY: waitid(2) writes only into `info`, a zeroed siginfo_t we own; WNOWAIT leaves the
    // child waitable for `Child::wait`, WNOHANG keeps it from blocking.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let r = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        if r != 0 {
            return std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
        }
        info.si_signo == libc::SIGCHLD
    }
}

/// Called before the process exits on its own: if an interrupt's handler is killing the
/// children, wait for the signal it raised again to end the process. Other threads see the
/// children die before the handler returns, and a failure they report must not end the process
/// first with an exit code of its own (an interrupted run dies of its signal, as it would have
/// without the handler). Returns at once when no signal came.
pub fn wait_if_interrupted() {
    if forward::INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_secs(30));
    }
}

/// The interrupt handler: on SIGINT, SIGTERM or SIGHUP it kills every registered group, then
/// the signal ends cardproof as it would have without the handler. Installed with the first
/// child, only for signals whose action is the default (an ignored SIGHUP stays ignored).
mod forward {
    use std::sync::Once;
    use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

    /// Set first thing by the handler: the signal will end the process once the handler
    /// returns.
    pub(super) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

    /// Process groups alive now (0: a free slot). A fixed table: the handler may not allocate
    /// or lock.
    static GROUPS: [AtomicI32; 64] = [const { AtomicI32::new(0) }; 64];
    static INSTALL: Once = Once::new();

    pub(super) fn register(pgid: i32) -> Option<usize> {
        INSTALL.call_once(install);
        GROUPS.iter().position(|g| {
            g.compare_exchange(0, pgid, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        })
    }

    pub(super) fn unregister(slot: usize) {
        if let Some(g) = GROUPS.get(slot) {
            g.store(0, Ordering::SeqCst);
        }
    }

    #[allow(unsafe_code)]
    extern "C" fn on_signal(sig: libc::c_int) {
        INTERRUPTED.store(true, Ordering::SeqCst);
        for g in &GROUPS {
            let pgid = g.load(Ordering::SeqCst);
            if pgid > 1 {
                // SAFETY: kill(2) is async-signal-safe.
                unsafe {
                    libc::kill(-pgid, libc::SIGKILL);
                }
            }
        }
        // SA_RESETHAND put the default action back: the signal, raised again, is delivered
        // when the handler returns and ends the process as it would have.
        // SAFETY: raise(3) is async-signal-safe.
        unsafe {
            libc::raise(sig);
        }
    }

    #[allow(unsafe_code)]
    fn install() {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: sigaction(2) reads and writes only the structs we own; the handler only
            // calls async-signal-safe functions and reads atomics.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                    || old.sa_sigaction != libc::SIG_DFL
                {
                    continue;
                }
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                new.sa_flags = libc::SA_RESETHAND;
                libc::sigemptyset(&mut new.sa_mask);
                libc::sigaction(sig, &new, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("/bin/sh");
        c.args(["-c", script]);
        c
    }

    /// Whether a process with `pid` is alive (a zombie is not).
    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().chars().next())
            })
            .flatten()
            .is_some_and(|state| state != 'Z' && state != 'X')
    }

    fn gone_soon(pid: u32) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if !alive(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_deadline_kills_the_child_and_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        let watch = Watch::new();
        let mut child = watch
            .spawn(
                "the sleeper",
                sh(&format!("sleep 1000 & echo $! > {}; wait", pids.display())),
                Output::Capture { cap: 1024 },
            )
            .unwrap();
        let started = Instant::now();
        let r = watch.wait(
            &mut child,
            Some((started + Duration::from_millis(300), "it ran out of time")),
        );
        assert_eq!(r.unwrap_err(), "it ran out of time");
        assert!(started.elapsed() < Duration::from_secs(5));
        let grandchild: u32 = std::fs::read_to_string(&pids)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            gone_soon(grandchild),
            "the group's other process was killed"
        );
    }

    #[test]
    fn output_over_the_cap_fails_the_watch_and_stops_the_child() {
        let watch = Watch::new();
        let mut child = watch
            .spawn(
                "the flood",
                sh("yes flood"),
                Output::Capture { cap: 1 << 16 },
            )
            .unwrap();
        let r = watch.wait(
            &mut child,
            Some((Instant::now() + Duration::from_secs(20), "late")),
        );
        let why = r.unwrap_err();
        assert!(why.contains("the flood wrote more than 64 KiB"), "{why}");
        assert_eq!(child.output().len(), 1 << 16);
    }

    #[test]
    fn a_stream_without_bytes_for_the_limit_is_a_stall() {
        let watch = Watch::new();
        let mut child = watch
            .spawn("the mute", sh("sleep 1000"), Output::Capture { cap: 1024 })
            .unwrap();
        let started = Instant::now();
        let _guard = watch
            .stall_timeout(Duration::from_millis(200), "stalled")
            .unwrap();
        assert_eq!(watch.wait(&mut child, None).unwrap_err(), "stalled");
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_finished_child_gives_its_status_and_all_its_output() {
        let watch = Watch::new();
        let mut child = watch
            .spawn(
                "the talker",
                sh("echo out; echo err >&2; exit 3"),
                Output::Capture { cap: 1024 },
            )
            .unwrap();
        let status = watch.wait(&mut child, None).unwrap();
        assert_eq!(status.code(), Some(3));
        let text = child.output();
        assert!(text.contains("out\n") && text.contains("err\n"), "{text}");
    }

    #[test]
    fn lines_are_cut_at_their_cap_and_the_rest_still_read() {
        let long = "x".repeat(100_000);
        let input = format!("short\r\n{long}\nafter\nlast");
        let mut lines = Vec::new();
        read_lines_capped(input.as_bytes(), 10, |l| lines.push(l));
        assert_eq!(lines, ["short", "xxxxxxxxxx", "after", "last"]);
    }

    #[test]
    fn a_timeout_variable_that_is_not_seconds_is_refused_naming_it() {
        for bad in ["0", "-1", "nan", "soon", "1e9", ""] {
            let e = parse_timeout("CARDPROOF_X_SECS", bad).unwrap_err();
            assert!(e.to_string().contains("CARDPROOF_X_SECS"), "{e}");
        }
        assert_eq!(
            parse_timeout("CARDPROOF_X_SECS", " 0.5 ").unwrap(),
            Duration::from_millis(500)
        );
    }
}
