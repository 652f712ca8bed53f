//! A pair run's two base streams read in parallel, ahead of scoring, with bounded memory.
//!
//! One thread per stream reads its rows into batches of a fixed number of rows and hands them
//! over through a bounded channel; the batches circulate in a fixed pool ([`POOL`] per stream),
//! so at most that many batches of each stream are ever held, whatever either side's pace. The
//! reference's reader also copies each row's bytes as read into a pool of buffers that a third
//! thread writes to llama.cpp's own KLD pass (the printout gate), so that the gate's pace holds
//! back the reference's stream only by what the pool holds, not row by row.
//!
//! The scoring thread takes the two streams' batches in lockstep ([`PairStreams::next`]) and
//! sees exactly what one thread reading both streams row by row would: the same rows in the same
//! order, and where a stream fails or ends early, the same error for the same row (the
//! reference's row before the candidate's). Every thread ends once its streams' processes are
//! gone: a read sees the end of its pipe, a write its broken pipe, a hand-over its receiver
//! dropped; [`PairStreams::abandon`] joins them within a deadline after the processes are killed.

use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::kld::llamacpp::{BaseRow, RowReader};

/// Batches of each stream in flight: one being scored, one handed over, one being read.
const POOL: usize = 3;
/// How long an abandoned run waits for its threads once its processes are killed.
const JOIN_GRACE: Duration = Duration::from_secs(5);

/// One stream's rows, read in order: `rows[..len]` are this batch's (the rest are buffers kept
/// for reuse).
#[derive(Default)]
pub(super) struct RowBatch {
    pub rows: Vec<BaseRow>,
    pub len: usize,
}

/// How a batch ends its stream: more follows (a full batch), the stream ended after these rows,
/// reading failed after them, or the gate's writer is gone (its error is the gate thread's).
enum End {
    More,
    Ended,
    Failed(Error),
    GateGone,
}

/// What a reader thread hands over: a batch, and how the stream stands after it.
struct Handed {
    batch: RowBatch,
    end: End,
}

/// What the reference's reader sends the gate's writer: row bytes as read, or the stream's end
/// with its last row's bytes (the padding repeats it).
enum ToGate {
    Rows(Vec<u8>),
    End(Vec<u8>),
}

/// The gate's side: its stream's writer, the header it starts with, and how many copies of the
/// last row follow the real rows.
pub(super) struct GateFeed<W> {
    pub writer: W,
    pub head: Vec<u8>,
    pub pad_rows: u64,
}

/// One stream's reader: its hand-overs, the pool its batches return to, and its thread.
struct Reader {
    full: Receiver<Handed>,
    free: SyncSender<RowBatch>,
    thread: Option<JoinHandle<()>>,
}

/// The two streams being read, and the gate being written.
pub(super) struct PairStreams {
    binary: std::path::PathBuf,
    a: Reader,
    b: Reader,
    gate: Option<JoinHandle<Result<()>>>,
    /// Rows handed out so far.
    rows: u64,
    ended: bool,
}

/// Two batches of the same rows, one from each stream.
pub(super) struct BatchPair {
    pub a: RowBatch,
    pub b: RowBatch,
}

impl BatchPair {
    pub fn len(&self) -> usize {
        self.a.len
    }
}

fn thread_error(binary: &Path, e: &std::io::Error) -> Error {
    Error::runner(
        binary,
        format!("cannot start a thread to read its streams: {e}"),
    )
}

/// Starts reading `a` (the reference's rows) and `b` (the candidate's) in batches of
/// `batch_rows`, and, with `gate`, writing the reference's stream to llama.cpp's KLD pass.
pub(super) fn start<R, W>(
    binary: &Path,
    a: RowReader<R>,
    b: RowReader<R>,
    gate: Option<GateFeed<W>>,
    batch_rows: usize,
) -> Result<PairStreams>
where
    R: std::io::Read + Send + 'static,
    W: Write + Send + 'static,
{
    let batch_rows = batch_rows.max(1);
    let (to_gate, gate) = match gate {
        Some(feed) => {
            let (tx, rx) = sync_channel::<ToGate>(POOL);
            let (free_tx, free_rx) = sync_channel::<Vec<u8>>(POOL);
            for _ in 0..POOL {
                let _ = free_tx.send(Vec::new());
            }
            let t = std::thread::Builder::new()
                .name("llamacpp-gate".into())
                .spawn(move || write_gate(feed, rx, free_tx))
                .map_err(|e| thread_error(binary, &e))?;
            (Some((tx, free_rx)), Some(t))
        }
        None => (None, None),
    };
    let a = reader("llamacpp-reference", a, batch_rows, to_gate)
        .map_err(|e| thread_error(binary, &e))?;
    let b = reader::<R>("llamacpp-candidate", b, batch_rows, None)
        .map_err(|e| thread_error(binary, &e))?;
    Ok(PairStreams {
        binary: binary.to_owned(),
        a,
        b,
        gate,
        rows: 0,
        ended: false,
    })
}

/// The gate's link as the reference's reader holds it: where row bytes go, and the buffers
/// that come back.
type GateLink = (SyncSender<ToGate>, Receiver<Vec<u8>>);

fn reader<R: std::io::Read + Send + 'static>(
    name: &str,
    rows: RowReader<R>,
    batch_rows: usize,
    gate: Option<GateLink>,
) -> std::io::Result<Reader> {
    let (full_tx, full) = sync_channel::<Handed>(POOL);
    let (free, free_rx) = sync_channel::<RowBatch>(POOL);
    for _ in 0..POOL {
        let _ = free.send(RowBatch::default());
    }
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || read_rows(rows, batch_rows, &free_rx, &full_tx, gate))?;
    Ok(Reader {
        full,
        free,
        thread: Some(thread),
    })
}

/// A reader thread: fills the pool's batches in order until its stream ends or fails (or the
/// scoring side is gone), each row's bytes also to the gate when it has one.
fn read_rows<R: std::io::Read>(
    mut rows: RowReader<R>,
    batch_rows: usize,
    free: &Receiver<RowBatch>,
    full: &SyncSender<Handed>,
    gate: Option<GateLink>,
) {
    loop {
        let Ok(mut batch) = free.recv() else { return };
        let mut raw = match &gate {
            Some((_, back)) => match back.recv() {
                Ok(mut buf) => {
                    buf.clear();
                    Some(buf)
                }
                // The gate's writer stopped (its error is its own).
                Err(_) => None,
            },
            None => None,
        };
        batch.len = 0;
        let mut end = if gate.is_some() && raw.is_none() {
            End::GateGone
        } else {
            End::More
        };
        while matches!(end, End::More) && batch.len < batch_rows {
            if batch.rows.len() == batch.len {
                batch.rows.push(BaseRow::default());
            }
            match rows.next_row(&mut batch.rows[batch.len]) {
                Ok(true) => {
                    if let Some(raw) = &mut raw {
                        raw.extend_from_slice(rows.last_row_bytes());
                    }
                    batch.len += 1;
                }
                Ok(false) => end = End::Ended,
                Err(e) => end = End::Failed(e),
            }
        }
        if let (Some((to_gate, _)), Some(raw)) = (&gate, raw)
            && to_gate.send(ToGate::Rows(raw)).is_err()
        {
            // The rows just read never reached the gate: its error is the one to report.
            end = End::GateGone;
        }
        if let (Some((to_gate, _)), End::Ended) = (&gate, &end)
            && to_gate
                .send(ToGate::End(rows.last_row_bytes().to_vec()))
                .is_err()
        {
            end = End::GateGone;
        }
        let last = !matches!(end, End::More);
        if full.send(Handed { batch, end }).is_err() || last {
            return;
        }
    }
}

/// The gate's writer thread: the header, every row as the reference's reader read it, then,
/// once the reference's stream ended whole, `pad_rows` copies of its last row. A stream that
/// failed gets no padding: the gate's pass then ends short, as it should.
fn write_gate<W: Write>(
    mut feed: GateFeed<W>,
    rows: Receiver<ToGate>,
    back: SyncSender<Vec<u8>>,
) -> Result<()> {
    let w = &mut feed.writer;
    w.write_all(&feed.head).map_err(|e| super::gate_error(&e))?;
    for msg in rows {
        match msg {
            ToGate::Rows(buf) => {
                w.write_all(&buf).map_err(|e| super::gate_error(&e))?;
                let _ = back.send(buf);
            }
            ToGate::End(last) => {
                for _ in 0..feed.pad_rows {
                    w.write_all(&last).map_err(|e| super::gate_error(&e))?;
                }
                w.flush().map_err(|e| super::gate_error(&e))?;
                return Ok(());
            }
        }
    }
    Ok(())
}

impl PairStreams {
    /// The next rows of both streams, the same rows of each (`None` once both ended together).
    /// A stream that fails, or ends while the other goes on, is the error a row-by-row reading
    /// of the reference's stream, then the candidate's, would meet first.
    pub fn next(&mut self) -> Result<Option<BatchPair>> {
        if self.ended {
            return Ok(None);
        }
        let a = self.take(true)?;
        let b = self.take(false)?;
        let at = a.batch.len.min(b.batch.len);
        let row = self.rows + at as u64;
        // The reference's state at row `at`, then the candidate's.
        let more_a = a.batch.len > at || self.settle(a.end)?;
        let more_b = b.batch.len > at || self.settle(b.end)?;
        if more_a != more_b {
            return Err(Error::runner(
                &self.binary,
                format!(
                    "the {} base stream ended at row {row} while the other went on",
                    if more_a { "candidate's" } else { "reference's" },
                ),
            ));
        }
        self.ended = !more_a;
        self.rows = row;
        if at == 0 && self.ended {
            return Ok(None);
        }
        Ok(Some(BatchPair {
            a: a.batch,
            b: b.batch,
        }))
    }

    /// Gives a pair's batches back to their readers' pools.
    pub fn recycle(&self, pair: BatchPair) {
        let _ = self.a.free.send(pair.a);
        let _ = self.b.free.send(pair.b);
    }

    fn take(&self, reference: bool) -> Result<Handed> {
        let r = if reference { &self.a } else { &self.b };
        r.full.recv().map_err(|_| {
            Error::internal(
                &self.binary,
                format!(
                    "the thread reading the {} base stream stopped",
                    if reference {
                        "reference's"
                    } else {
                        "candidate's"
                    }
                ),
            )
        })
    }

    /// Whether a stream goes on past the rows of a batch: `Ok(false)` if it ended there, its
    /// error if it failed (a gate that is gone: the gate's).
    fn settle(&mut self, end: End) -> Result<bool> {
        match end {
            // A full batch: its stream goes on.
            End::More => Ok(true),
            End::Ended => Ok(false),
            End::Failed(e) => Err(e),
            End::GateGone => Err(self.gate_result().err().unwrap_or_else(|| {
                Error::internal(&self.binary, "the gate's writer stopped without an error")
            })),
        }
    }

    fn gate_result(&mut self) -> Result<()> {
        match self.gate.take() {
            None => Ok(()),
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(Error::internal(&self.binary, "the gate's writer panicked"))
            }),
        }
    }

    /// After the last rows: the gate's stream written whole (its error, if writing it failed)
    /// and every thread joined.
    pub fn finish(mut self) -> Result<()> {
        let gate = self.gate_result();
        for r in [&mut self.a, &mut self.b] {
            if let Some(t) = r.thread.take()
                && t.join().is_err()
            {
                return Err(Error::internal(
                    &self.binary,
                    "a base stream's reader panicked",
                ));
            }
        }
        gate
    }

    /// After a failed run whose processes are killed: every thread joined that ends within
    /// [`JOIN_GRACE`] (each does once its pipe is closed); any other is left to end by itself.
    pub fn abandon(mut self) {
        let threads: Vec<JoinHandle<()>> = [&mut self.a, &mut self.b]
            .into_iter()
            .filter_map(|r| r.thread.take())
            .collect();
        let gate = self.gate.take();
        // The receivers go first, so a reader blocked handing over a batch stops.
        drop(self);
        let until = Instant::now() + JOIN_GRACE;
        while Instant::now() < until
            && !(threads.iter().all(JoinHandle::is_finished)
                && gate.as_ref().is_none_or(JoinHandle::is_finished))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        for t in threads.into_iter().filter(|t| t.is_finished()) {
            let _ = t.join();
        }
        if let Some(t) = gate.filter(|t| t.is_finished()) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kld::llamacpp::{BaseStream, MAGIC};
    use std::io::Cursor;

    const N_CTX: u32 = 8;
    const N_VOCAB: u32 = 5;
    const N_CHUNK: u32 = 7;

    /// A base stream of `N_CHUNK` chunks whose row `r` has scale `r + 1` (and `seed` in its
    /// codes), cut after `keep` bytes of rows when given.
    fn stream(seed: u16, keep: Option<usize>) -> Vec<u8> {
        let mut s = MAGIC.to_vec();
        for v in [N_CTX, N_VOCAB, N_CHUNK] {
            s.extend_from_slice(&v.to_le_bytes());
        }
        for t in 0..N_CTX * N_CHUNK {
            s.extend_from_slice(&(t as i32 % N_VOCAB as i32).to_le_bytes());
        }
        let head = s.len();
        let rows = u64::from(N_CHUNK * (N_CTX - 1 - N_CTX / 2));
        for r in 0..rows {
            s.extend_from_slice(&(r as f32 + 1.0).to_le_bytes());
            s.extend_from_slice(&(-1f32).to_le_bytes());
            for i in 0..N_VOCAB.div_ceil(2) * 2 {
                s.extend_from_slice(&(seed + r as u16 + i as u16).to_le_bytes());
            }
        }
        if let Some(k) = keep {
            s.truncate(head + k);
        }
        s
    }

    fn open(name: &str, bytes: Vec<u8>) -> BaseStream<Cursor<Vec<u8>>> {
        BaseStream::open(Path::new(name), Cursor::new(bytes)).unwrap()
    }

    /// Every pair of rows `next` hands out, in order, as (reference scale, candidate scale), or
    /// the error it ends with; and what the gate was written.
    fn read_all(
        a: Vec<u8>,
        b: Vec<u8>,
        batch_rows: usize,
    ) -> (Vec<(f32, f32)>, Option<String>, Vec<u8>) {
        let (a, b) = (open("ref.pipe", a), open("cand.pipe", b));
        let gate_out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let feed = GateFeed {
            writer: Shared(gate_out.clone()),
            head: b"HEAD".to_vec(),
            pad_rows: 2,
        };
        let mut p = start(Path::new("bin"), a.rows, b.rows, Some(feed), batch_rows).unwrap();
        let mut seen = Vec::new();
        let err = loop {
            match p.next() {
                Ok(Some(batch)) => {
                    for i in 0..batch.len() {
                        seen.push((batch.a.rows[i].scale, batch.b.rows[i].scale));
                    }
                    p.recycle(batch);
                }
                Ok(None) => break p.finish().err().map(|e| e.to_string()),
                Err(e) => {
                    p.abandon();
                    break Some(e.to_string());
                }
            }
        };
        let gate = gate_out.lock().unwrap().clone();
        (seen, err, gate)
    }

    #[test]
    fn the_rows_come_in_order_whatever_the_batch_and_the_gate_gets_every_byte_then_padding() {
        let rows = (N_CHUNK * (N_CTX - 1 - N_CTX / 2)) as usize;
        let a = stream(0, None);
        let head = 20 + 4 * (N_CTX * N_CHUNK) as usize;
        let row_bytes = (a.len() - head) / rows;
        for batch in [1, 2, 3, rows - 1, rows, rows + 5] {
            let (seen, err, gate) = read_all(a.clone(), stream(7, None), batch);
            assert_eq!(err, None, "batch {batch}");
            let want: Vec<(f32, f32)> = (0..rows)
                .map(|r| (r as f32 + 1.0, r as f32 + 1.0))
                .collect();
            assert_eq!(seen, want, "batch {batch}");
            let mut expected = b"HEAD".to_vec();
            expected.extend_from_slice(&a[head..]);
            for _ in 0..2 {
                expected.extend_from_slice(&a[a.len() - row_bytes..]);
            }
            assert!(gate == expected, "batch {batch}: the gate's bytes differ");
        }
    }

    #[test]
    fn a_stream_that_ends_early_is_the_error_a_row_by_row_reading_meets_first() {
        let row_bytes = 8 + 2 * N_VOCAB.div_ceil(2) as usize * 2;
        let full = stream(0, None);
        for batch in [1, 3, 64] {
            // The candidate's stream ends inside row 5: its error, at row 5, and no row after.
            let (seen, err, _) = read_all(full.clone(), stream(0, Some(5 * row_bytes + 3)), batch);
            let err = err.unwrap();
            assert!(err.contains("cand.pipe") && err.contains("row 5 "), "{err}");
            assert!(seen.len() <= 5, "{}", seen.len());
            // Both end early: the one ending first is the error; at the same row, the
            // reference's.
            for (a_rows, b_rows, named) in
                [(6, 4, "cand.pipe"), (4, 6, "ref.pipe"), (4, 4, "ref.pipe")]
            {
                let (_, err, gate) = read_all(
                    stream(0, Some(a_rows * row_bytes + 1)),
                    stream(0, Some(b_rows * row_bytes + 1)),
                    batch,
                );
                let err = err.unwrap();
                let row = a_rows.min(b_rows);
                assert!(
                    err.contains(named) && err.contains(&format!("row {row} ")),
                    "batch {batch}, {a_rows}/{b_rows}: {err}"
                );
                // The gate never gets padding after a reference that failed: at most the rows
                // read whole.
                assert!(gate.len() <= 4 + a_rows * row_bytes, "{}", gate.len());
            }
        }
    }
}
