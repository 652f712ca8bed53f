//! Inline SVG plots for report.html: mean KLD along the window with top-1 flips marked, and a
//! histogram of per-row KLD on a log axis.
//!
//! The SVG is meant to be inlined into HTML (no `xmlns`, so no URL appears anywhere); every style
//! is a presentation attribute, so the plots look the same without the page's CSS. Every number
//! written into a coordinate is finite: empty runs, zero KLD, a single row and non-finite values
//! all give a drawable (if sparse) plot.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::RunRows;
use super::render::format_number;

pub(super) const WIDTH: f64 = 720.0;
pub(super) const HEIGHT: f64 = 300.0;
pub(super) const LEFT: f64 = 72.0;
pub(super) const RIGHT: f64 = 20.0;
pub(super) const TOP: f64 = 48.0;
pub(super) const BOTTOM: f64 = 48.0;

/// Above this many distinct positions, neighbouring positions are pooled into bins so a 131k-token
/// window stays a plot of at most this many points (and markers).
pub const MAX_POINTS: usize = 1000;
/// Histogram bins at most (log-spaced); decades beyond are clamped into the first bin.
const MAX_BINS: usize = 60;

pub(super) const LINE: &str = "#0969da";
pub(super) const FLIP: &str = "#cf222e";
pub(super) const AXIS: &str = "#57606a";
pub(super) const GRID: &str = "#d0d7de";
const BAR: &str = "#54aeff";
/// The position plot is taller: under the KLD panel, a panel of top-1 flip rates.
const POSITION_HEIGHT: f64 = 430.0;
const FLIP_TOP: f64 = 312.0;
const FLIP_BOTTOM: f64 = 392.0;
/// Bins of positions the flip panel has at most.
pub const FLIP_BINS: usize = 32;

/// Inline SVG: mean KLD at each position j (over windows) along the window, with axes, ticks and
/// labels, and under it the top-1 flip rate in at most [`FLIP_BINS`] equal bins of positions (a
/// bar per bin with rows: flips / rows). More than [`MAX_POINTS`] distinct positions are pooled
/// into equal-width bins for the KLD line.
pub fn svg_kld_along_position(run: &RunRows) -> String {
    let n = run.position.len().min(run.kld.len()).min(run.flip.len());
    let max_pos = run.position[..n].iter().copied().max().unwrap_or(0);
    let distinct = {
        let mut p: Vec<u64> = run.position[..n].to_vec();
        p.sort_unstable();
        p.dedup();
        p.len()
    };
    let bin_width = if distinct > MAX_POINTS {
        (max_pos / MAX_POINTS as u64 + 1).max(1)
    } else {
        1
    };
    let bins = kld_bins((0..n).map(|i| {
        let p = run.position[i];
        (p / bin_width, p, run.kld[i])
    }));

    let y_max = bins
        .values()
        .filter_map(KldBin::mean)
        .fold(0.0f64, f64::max);
    // The window's rows run from j = 0 to L - 2: the x axis spans exactly that.
    let x_end = (max_pos as f64)
        .max(run.context_length.saturating_sub(2) as f64)
        .max(1.0);
    let mut x_axis = Axis::linear(0.0, x_end, LEFT, WIDTH - RIGHT);
    x_axis.clip(x_end);
    let y_axis = Axis::linear(0.0, y_max, HEIGHT - BOTTOM, TOP);

    let mut s = open_two_panels(
        &format!(
            "Mean KLD and top-1 flip rate along the window at context length {}",
            run.context_length
        ),
        &format!(
            "context length {}: mean KLD by position j",
            run.context_length
        ),
    );
    draw_axes(
        &mut s,
        &x_axis,
        &y_axis,
        "position j in the window",
        "mean KLD (nats)",
    );
    if n == 0 {
        note(&mut s, "no scored rows");
        s.push_str("</svg>");
        return s;
    }

    // Each bin at the mean position of its rows.
    let coords: Vec<(f64, f64)> = bins
        .values()
        .filter_map(|b| {
            b.mean()
                .map(|m| (x_axis.map(b.x_sum / b.rows as f64), y_axis.map(m)))
        })
        .collect();
    draw_mean_line(&mut s, &coords);
    let flips = draw_flip_rates(&mut s, run, n, &x_axis, x_end);

    // Legend, on its own row under the title.
    legend_line(&mut s, LEFT, LINE, "mean over windows");
    legend_box(
        &mut s,
        LEFT + 140.0,
        FLIP,
        "0.6",
        &format!(
            "top-1 flip rate per bin of {} position{}: {} flip{} of {n} rows, in {} of {} bins",
            flips.width,
            if flips.width == 1 { "" } else { "s" },
            flips.total,
            if flips.total == 1 { "" } else { "s" },
            flips.flipped_bins,
            flips.bins,
        ),
    );
    if bin_width > 1 {
        let _ = write!(
            s,
            r##"<text x="{LEFT}" y="{}" font-size="10" fill="{AXIS}">mean KLD: positions pooled in bins of {bin_width}</text>"##,
            POSITION_HEIGHT - 4.0
        );
    }
    s.push_str("</svg>");
    s
}

/// The rows of one bin along a plot's x axis: the sum and count of their finite KLD values, all
/// rows, and the sum of their x (for the bin's mean position).
#[derive(Default)]
struct KldBin {
    sum: f64,
    finite: usize,
    rows: usize,
    x_sum: f64,
}

impl KldBin {
    /// The mean of the bin's finite KLD values, if it has any.
    fn mean(&self) -> Option<f64> {
        (self.finite > 0).then(|| self.sum / self.finite as f64)
    }
}

/// Rows `(bin, x, kld)` pooled into bins, each bin's sums taken in the rows' order.
fn kld_bins(rows: impl Iterator<Item = (u64, u64, f64)>) -> BTreeMap<u64, KldBin> {
    let mut bins: BTreeMap<u64, KldBin> = BTreeMap::new();
    for (bin, x, kld) in rows {
        let acc = bins.entry(bin).or_default();
        acc.rows += 1;
        acc.x_sum += x as f64;
        if kld.is_finite() {
            acc.sum += kld;
            acc.finite += 1;
        }
    }
    bins
}

/// The two-panel plots' opening (the taller canvas) and their bold heading.
fn open_two_panels(label: &str, heading: &str) -> String {
    let mut s = open_svg_sized(label, POSITION_HEIGHT);
    let _ = write!(
        s,
        r##"<text x="{LEFT}" y="18" font-size="14" font-weight="bold" fill="#24292f">{heading}</text>"##
    );
    s
}

/// The position plot's mean-KLD line (a point alone is a dot).
fn draw_mean_line(s: &mut String, coords: &[(f64, f64)]) {
    if coords.len() > 1 {
        s.push_str(r##"<polyline fill="none" stroke=""##);
        s.push_str(LINE);
        s.push_str(r##"" stroke-width="1.2" points=""##);
        for (i, (x, y)) in coords.iter().enumerate() {
            if i > 0 {
                s.push(' ');
            }
            let _ = write!(s, "{},{}", c(*x), c(*y));
        }
        s.push_str(r##""/>"##);
    } else if let Some((x, y)) = coords.first() {
        let _ = write!(
            s,
            r##"<circle cx="{}" cy="{}" r="2.5" fill="{LINE}"/>"##,
            c(*x),
            c(*y)
        );
    }
}

/// What the flip-rate panel drew, for the legend: the bins' width in positions, their number,
/// how many have flips, and the flips in all.
struct FlipRates {
    width: u64,
    bins: usize,
    flipped_bins: usize,
    total: usize,
}

/// The position plot's lower panel: the top-1 flip rate of each bin of positions, a bar per bin
/// with flips, on its own axis.
fn draw_flip_rates(
    s: &mut String,
    run: &RunRows,
    n: usize,
    x_axis: &Axis,
    x_end: f64,
) -> FlipRates {
    // Top-1 flips, binned: a marker per flipped position says nothing once most positions flip
    // somewhere (a long eval text), so the lower panel shows the flip rate of each bin of
    // positions, on its own axis.
    let flip_width = (x_end as u64 + 1).div_ceil(FLIP_BINS as u64).max(1);
    let n_bins = (x_end as u64 / flip_width + 1) as usize;
    let mut rows_in = vec![0usize; n_bins];
    let mut flips_in = vec![0usize; n_bins];
    for i in 0..n {
        let b = ((run.position[i] / flip_width) as usize).min(n_bins - 1);
        rows_in[b] += 1;
        flips_in[b] += usize::from(run.flip[i]);
    }
    let rates: Vec<Option<f64>> = rows_in
        .iter()
        .zip(&flips_in)
        .map(|(&r, &f)| (r > 0).then(|| f as f64 / r as f64))
        .collect();
    let rate_max = rates.iter().flatten().fold(0.0f64, |a, &b| a.max(b));
    let flip_axis = Axis::linear(0.0, rate_max, FLIP_BOTTOM, FLIP_TOP);
    draw_flip_axes(s, x_axis, &flip_axis);
    let mut flipped_bins = 0usize;
    for (b, rate) in rates.iter().enumerate() {
        let Some(rate) = *rate else { continue };
        let lo = b as u64 * flip_width;
        let hi = (lo + flip_width - 1).min(x_end as u64);
        let (x0, x1) = x_axis.band(lo, hi);
        let y = flip_axis.map(rate);
        let label = if lo == hi {
            format!("j = {lo}")
        } else {
            format!("j = {lo}–{hi}")
        };
        // A bin without flips has no bar (its rate is 0, the baseline).
        if flips_in[b] == 0 {
            continue;
        }
        flipped_bins += 1;
        let _ = write!(
            s,
            r##"<rect class="flip" x="{}" y="{}" width="{}" height="{}" fill="{FLIP}" fill-opacity="0.6"><title>{label}: top-1 flip rate {} ({} of {} rows)</title></rect>"##,
            c(x0 + 0.5),
            c(y),
            c((x1 - x0 - 1.0).max(0.5)),
            c(FLIP_BOTTOM - y),
            format_number(rate, 3),
            flips_in[b],
            rows_in[b]
        );
    }
    FlipRates {
        width: flip_width,
        bins: n_bins,
        flipped_bins,
        total: flips_in.iter().sum(),
    }
}

/// A legend entry with a line swatch at `x` on the legend row.
fn legend_line(s: &mut String, x: f64, colour: &str, text: &str) {
    let _ = write!(
        s,
        r##"<line x1="{x}" y1="30" x2="{}" y2="30" stroke="{colour}" stroke-width="1.5"/><text x="{}" y="34" font-size="11" fill="{AXIS}">{text}</text>"##,
        x + 18.0,
        x + 22.0
    );
}

/// A legend entry with a square swatch of `colour` at `opacity` at `x` on the legend row.
fn legend_box(s: &mut String, x: f64, colour: &str, opacity: &str, text: &str) {
    let _ = write!(
        s,
        r##"<rect x="{x}" y="25" width="10" height="10" fill="{colour}" fill-opacity="{opacity}"/><text x="{}" y="34" font-size="11" fill="{AXIS}">{text}</text>"##,
        x + 14.0
    );
}

/// Shade of the tool-call spans behind the conversation plot.
const TOOL_CALL: &str = "#fb8f44";

/// Inline SVG for a conversation eval text (`None` for plain text): the mean KLD along the
/// token stream (bins of equal width, at most [`MAX_POINTS`]) over shaded tool-call spans, and
/// under it the cumulative count of top-1 flips along the conversation, in all and inside tool
/// calls (the seed study's figure: where do the flips pile up?).
pub fn svg_kld_along_conversation(run: &RunRows) -> Option<String> {
    use crate::kld::protocol::Segment;
    let stream = TokenStream::new(run)?;
    let (first, last, bin_width) = (stream.first, stream.last, stream.bin_width);

    // Mean KLD per bin of tokens.
    let bins = kld_bins(
        stream
            .order
            .iter()
            .map(|&i| (stream.bin_of(i), run.token[i], run.kld[i])),
    );
    let y_max = bins
        .values()
        .filter_map(KldBin::mean)
        .fold(0.0f64, f64::max);
    let x_end = last.max(first + 1) as f64;
    let mut x_axis = Axis::linear(first as f64, x_end, LEFT, WIDTH - RIGHT);
    x_axis.clip(x_end);
    let y_axis = Axis::linear(0.0, y_max, HEIGHT - BOTTOM, TOP);
    let n = stream.order.len();
    let total_flips = (0..n).filter(|&i| run.flip[i]).count();
    let call_flips = (0..n)
        .filter(|&i| run.flip[i] && run.segment[i] == Segment::ToolCall)
        .count();
    let flip_axis = Axis::counts(total_flips.max(1), FLIP_BOTTOM, FLIP_TOP);

    let mut s = open_two_panels(
        &format!(
            "Mean KLD along the conversation and cumulative top-1 flips at context length {}",
            run.context_length
        ),
        &format!(
            "context length {}: along the conversation",
            run.context_length
        ),
    );
    // Tool-call spans: runs of consecutive scored tool-call tokens, drawn first (behind).
    let spans = stream.tool_call_spans();
    for (a, b) in &spans {
        let (x0, x1) = x_axis.band(*a, *b);
        let _ = write!(
            s,
            r##"<rect class="tool-call" x="{}" y="{}" width="{}" height="{}" fill="{TOOL_CALL}" fill-opacity="0.18"><title>tool call: tokens {a}–{b}</title></rect>"##,
            c(x0),
            c(TOP),
            c((x1 - x0).max(0.8)),
            c(FLIP_BOTTOM - TOP)
        );
    }
    draw_axes(
        &mut s,
        &x_axis,
        &y_axis,
        "token in the conversation",
        "mean KLD (nats)",
    );
    let coords: Vec<(f64, f64)> = bins
        .iter()
        .filter_map(|(k, b)| {
            b.mean().map(|m| {
                let x = first as f64 + (*k as f64 + 0.5) * bin_width as f64;
                (x_axis.map(x.min(last as f64)), y_axis.map(m))
            })
        })
        .collect();
    polyline(
        &mut s,
        &coords,
        LINE,
        &format!("mean KLD per bin of {bin_width} token(s)"),
    );

    // Cumulative flips, all and inside tool calls.
    draw_y_grid(&mut s, &x_axis, &flip_axis, 10);
    flip_baseline(&mut s, &x_axis, FLIP_BOTTOM);
    panel_label(&mut s, (FLIP_BOTTOM + FLIP_TOP) / 2.0, "flips");
    polyline(
        &mut s,
        &stream.cumulative_flips(&x_axis, &flip_axis, &|_| true),
        FLIP,
        &format!("cumulative top-1 flips: {total_flips}"),
    );
    polyline(
        &mut s,
        &stream.cumulative_flips(&x_axis, &flip_axis, &|i| {
            run.segment[i] == Segment::ToolCall
        }),
        TOOL_CALL,
        &format!("cumulative top-1 flips inside tool calls: {call_flips}"),
    );
    legend_line(&mut s, LEFT, LINE, "mean KLD");
    legend_box(
        &mut s,
        LEFT + 90.0,
        TOOL_CALL,
        "0.35",
        &format!("tool calls ({} spans)", spans.len()),
    );
    legend_line(
        &mut s,
        LEFT + 250.0,
        FLIP,
        &format!("flips: {total_flips} ({call_flips} in tool calls)"),
    );
    s.push_str("</svg>");
    Some(s)
}

/// A conversation's scored rows in token order, with the bins of equal width (at most
/// [`MAX_POINTS`]) that both of its panels share.
struct TokenStream<'r> {
    run: &'r RunRows,
    /// Row indices sorted by token (stable).
    order: Vec<usize>,
    first: u64,
    last: u64,
    bin_width: u64,
}

impl<'r> TokenStream<'r> {
    /// `None` when the run has no conversation rows.
    fn new(run: &'r RunRows) -> Option<Self> {
        let n = run
            .token
            .len()
            .min(run.segment.len())
            .min(run.kld.len())
            .min(run.flip.len());
        if n == 0 {
            return None;
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| run.token[i]);
        let first = run.token[order[0]];
        let last = run.token[order[n - 1]];
        let span = (last - first + 1).max(1);
        let bin_width = span.div_ceil(MAX_POINTS as u64).max(1);
        Some(TokenStream {
            run,
            order,
            first,
            last,
            bin_width,
        })
    }

    fn bin_of(&self, i: usize) -> u64 {
        (self.run.token[i] - self.first) / self.bin_width
    }

    /// Runs of consecutive scored tool-call tokens, `(first, last)`.
    fn tool_call_spans(&self) -> Vec<(u64, u64)> {
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for &i in &self.order {
            if self.run.segment[i] != crate::kld::protocol::Segment::ToolCall {
                continue;
            }
            let t = self.run.token[i];
            match spans.last_mut() {
                Some((_, end)) if t <= *end + 1 => *end = t,
                _ => spans.push((t, t)),
            }
        }
        spans
    }

    /// The cumulative count of the flips that `keep` keeps along the stream: one point per bin
    /// (its last row), from 0 at the first token.
    fn cumulative_flips(
        &self,
        x_axis: &Axis,
        flip_axis: &Axis,
        keep: &dyn Fn(usize) -> bool,
    ) -> Vec<(f64, f64)> {
        let run = self.run;
        let mut count = 0usize;
        let mut points = vec![(x_axis.map(self.first as f64), flip_axis.map(0.0))];
        let mut last_bin = None;
        for &i in &self.order {
            if run.flip[i] && keep(i) {
                count += 1;
            }
            let b = self.bin_of(i);
            let point = (x_axis.map(run.token[i] as f64), flip_axis.map(count as f64));
            if last_bin == Some(b) {
                if let Some(p) = points.last_mut() {
                    *p = point;
                }
            } else {
                points.push(point);
                last_bin = Some(b);
            }
        }
        points
    }
}

/// Inline SVG histogram of per-row KLD over all runs: log-spaced bins (up to 10 per decade);
/// rows with KLD = 0 (or below, from rounding) cannot sit on a log axis and are counted in a note
/// on the plot, as are non-finite values.
pub fn svg_histogram(rows: &[RunRows]) -> String {
    let mut positive = Vec::new();
    let mut zero = 0usize;
    let mut nonfinite = 0usize;
    for run in rows {
        for &k in &run.kld {
            if !k.is_finite() {
                nonfinite += 1;
            } else if k <= 0.0 {
                zero += 1;
            } else {
                positive.push(k);
            }
        }
    }
    let total = positive.len() + zero + nonfinite;
    let mut s = open_svg("Histogram of per-row KLD (log-spaced bins)");
    let _ = write!(
        s,
        r##"<text x="{LEFT}" y="18" font-size="14" font-weight="bold" fill="#24292f">per-row KLD, all context lengths ({total} rows)</text>"##
    );
    let mut notes = vec![if zero == 0 {
        "no rows with KLD = 0".to_owned()
    } else {
        format!(
            "{zero} row{} with KLD = 0, not on the log axis",
            if zero == 1 { "" } else { "s" }
        )
    }];
    if nonfinite > 0 {
        notes.push(format!("{nonfinite} non-finite, not shown"));
    }

    let (lo_dec, hi_dec, per_decade, counts) = if positive.is_empty() {
        (-4i32, 0i32, 1usize, vec![0usize; 4])
    } else {
        let min = positive.iter().copied().fold(f64::INFINITY, f64::min);
        let max = positive.iter().copied().fold(0.0f64, f64::max);
        let mut lo = min.log10().floor() as i32;
        let mut hi = max.log10().ceil() as i32;
        if hi <= lo {
            hi = lo + 1;
        }
        if (hi - lo) as usize > MAX_BINS {
            lo = hi - MAX_BINS as i32;
        }
        let decades = (hi - lo) as usize;
        let per_decade = (MAX_BINS / decades).clamp(1, 10);
        let nb = decades * per_decade;
        let mut counts = vec![0usize; nb];
        for &k in &positive {
            let i = ((k.log10() - lo as f64) * per_decade as f64).floor();
            let i = if i.is_finite() {
                i.max(0.0) as usize
            } else {
                0
            };
            counts[i.min(nb - 1)] += 1;
        }
        (lo, hi, per_decade, counts)
    };
    let max_count = counts.iter().copied().max().unwrap_or(0);
    let x_axis = Axis {
        lo: lo_dec as f64,
        hi: hi_dec as f64,
        p0: LEFT,
        p1: WIDTH - RIGHT,
        ticks: (lo_dec..=hi_dec).map(|d| d as f64).collect(),
        labels: (lo_dec..=hi_dec).map(|d| format!("1e{d}")).collect(),
    };
    let y_axis = Axis::counts(max_count, HEIGHT - BOTTOM, TOP);
    draw_axes(
        &mut s,
        &x_axis,
        &y_axis,
        "KLD per row (nats, log scale)",
        "rows",
    );
    for (i, &count) in counts.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let a = lo_dec as f64 + i as f64 / per_decade as f64;
        let b = lo_dec as f64 + (i + 1) as f64 / per_decade as f64;
        let (x0, x1) = (x_axis.map(a), x_axis.map(b));
        let (y0, y1) = (y_axis.map(count as f64), y_axis.map(0.0));
        let _ = write!(
            s,
            r##"<rect class="bar" x="{}" y="{}" width="{}" height="{}" fill="{BAR}" stroke="#ffffff" stroke-width="0.5"><title>[{}, {}): {count} rows</title></rect>"##,
            c(x0),
            c(y0),
            c((x1 - x0).max(0.0)),
            c((y1 - y0).max(0.0)),
            format_number(10f64.powf(a), 2),
            format_number(10f64.powf(b), 2),
        );
    }
    if positive.is_empty() {
        note(&mut s, "no row with KLD > 0");
    }
    let _ = write!(
        s,
        r##"<text class="zero-note" x="{}" y="32" font-size="11" text-anchor="end" fill="{AXIS}">{}</text>"##,
        WIDTH - RIGHT,
        notes.join("; ")
    );
    s.push_str("</svg>");
    s
}

fn open_svg(label: &str) -> String {
    open_svg_sized(label, HEIGHT)
}

pub(super) fn open_svg_sized(label: &str, height: f64) -> String {
    format!(
        r##"<svg class="plot" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" aria-label="{label}" font-family="system-ui, sans-serif">"##
    )
}

/// Horizontal grid lines at `y`'s ticks across `x`'s span, labelled on the left.
pub(super) fn draw_y_grid(s: &mut String, x: &Axis, y: &Axis, font_size: u32) {
    let (x0, x1) = (c(x.p0), c(x.p1));
    for (t, label) in y.ticks.iter().zip(&y.labels) {
        let py = c(y.map(*t));
        let _ = write!(
            s,
            r##"<line x1="{x0}" y1="{py}" x2="{x1}" y2="{py}" stroke="{GRID}" stroke-width="0.6"/><text x="{}" y="{py}" dy="4" font-size="{font_size}" text-anchor="end" fill="{AXIS}">{label}</text>"##,
            c(x.p0 - 6.0)
        );
    }
}

/// The flip panel's axes: rate ticks on the left, the position axis shared with the KLD panel
/// (its ticks repeated without labels).
fn draw_flip_axes(s: &mut String, x: &Axis, y: &Axis) {
    let x0 = c(x.p0);
    draw_y_grid(s, x, y, 10);
    for t in &x.ticks {
        let px = c(x.map(*t));
        let _ = write!(
            s,
            r##"<line x1="{px}" y1="{}" x2="{px}" y2="{}" stroke="{AXIS}" stroke-width="1"/>"##,
            c(y.p0),
            c(y.p0 + 4.0)
        );
    }
    flip_baseline(s, x, y.p0);
    let _ = write!(
        s,
        r##"<line x1="{x0}" y1="{}" x2="{x0}" y2="{}" stroke="{AXIS}" stroke-width="1"/>"##,
        c(y.p0),
        c(y.p1)
    );
    panel_label(s, (y.p0 + y.p1) / 2.0, "flip rate");
}

/// The lower panel's baseline at `y` across `x`'s span.
fn flip_baseline(s: &mut String, x: &Axis, y: f64) {
    let _ = write!(
        s,
        r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{AXIS}" stroke-width="1"/>"##,
        c(x.p0),
        c(y),
        c(x.p1),
        c(y)
    );
}

/// The lower panel's axis label, rotated, centred on `y`.
fn panel_label(s: &mut String, y: f64, text: &str) {
    let ym = c(y);
    let _ = write!(
        s,
        r##"<text x="16" y="{ym}" font-size="11" text-anchor="middle" fill="{AXIS}" transform="rotate(-90 16 {ym})">{text}</text>"##
    );
}

pub(super) fn note(s: &mut String, text: &str) {
    let _ = write!(
        s,
        r##"<text x="{}" y="{}" font-size="13" text-anchor="middle" fill="{AXIS}">{text}</text>"##,
        c((LEFT + WIDTH - RIGHT) / 2.0),
        c((TOP + HEIGHT - BOTTOM) / 2.0)
    );
}

/// A coordinate, rounded for size; never NaN or infinite (those would break the SVG).
pub(super) fn c(v: f64) -> String {
    let v = if v.is_finite() { v } else { 0.0 };
    let r = (v * 10.0).round() / 10.0;
    if r == 0.0 {
        "0".to_owned()
    } else {
        format!("{r}")
    }
}

/// A linear mapping from data to pixels with its ticks.
pub(super) struct Axis {
    pub(super) lo: f64,
    pub(super) hi: f64,
    pub(super) p0: f64,
    pub(super) p1: f64,
    pub(super) ticks: Vec<f64>,
    pub(super) labels: Vec<String>,
}

impl Axis {
    /// From `lo` to at least `hi`, extended to a round tick; a degenerate range becomes [lo, lo+1].
    pub(super) fn linear(lo: f64, hi: f64, p0: f64, p1: f64) -> Axis {
        let lo = if lo.is_finite() { lo } else { 0.0 };
        let mut hi = if hi.is_finite() { hi } else { lo };
        if hi <= lo {
            hi = lo + if lo == 0.0 { 1.0 } else { lo.abs() };
        }
        let step = nice_step((hi - lo) / 5.0);
        let top = (hi / step).ceil() * step;
        let mut ticks = Vec::new();
        let mut k = (lo / step).ceil();
        while k * step <= top + step * 1e-9 && ticks.len() < 20 {
            ticks.push(k * step);
            k += 1.0;
        }
        let labels = ticks.iter().map(|&t| tick_label(t, step)).collect();
        Axis {
            lo,
            hi: top,
            p0,
            p1,
            ticks,
            labels,
        }
    }

    /// End the axis at `hi` exactly, dropping ticks beyond it.
    pub(super) fn clip(&mut self, hi: f64) {
        if hi > self.lo {
            self.hi = hi;
            let keep = self
                .ticks
                .iter()
                .take_while(|&&t| t <= hi * (1.0 + 1e-9))
                .count();
            self.ticks.truncate(keep);
            self.labels.truncate(keep);
        }
    }

    /// Counts from 0: integer ticks only.
    pub(super) fn counts(max: usize, p0: f64, p1: f64) -> Axis {
        let hi = (max as f64).max(1.0);
        let step = nice_step(hi / 5.0).max(1.0);
        let top = (hi / step).ceil() * step;
        let ticks: Vec<f64> = (0..=((top / step) as usize))
            .map(|i| i as f64 * step)
            .collect();
        let labels = ticks.iter().map(|&t| format!("{}", t as u64)).collect();
        Axis {
            lo: 0.0,
            hi: top,
            p0,
            p1,
            ticks,
            labels,
        }
    }

    /// The pixels from half a unit before `lo` to half a unit after `hi`, inside the axis.
    fn band(&self, lo: u64, hi: u64) -> (f64, f64) {
        let x0 = self.map(lo as f64 - 0.5).max(self.p0);
        let x1 = self.map(hi as f64 + 0.5).min(self.p1);
        (x0, x1)
    }

    pub(super) fn map(&self, v: f64) -> f64 {
        let span = self.hi - self.lo;
        if span.is_nan() || span <= 0.0 || !v.is_finite() {
            return self.p0;
        }
        self.p0 + (v - self.lo) / span * (self.p1 - self.p0)
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !raw.is_finite() || raw <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn tick_label(t: f64, step: f64) -> String {
    if t.abs() < step * 1e-6 {
        return "0".to_owned();
    }
    if (1.0..1e6).contains(&step) {
        return format!("{}", t.round() as i64);
    }
    format_number(t, 3)
}

pub(super) fn draw_axes(s: &mut String, x: &Axis, y: &Axis, x_label: &str, y_label: &str) {
    let (x0, x1) = (c(x.p0), c(x.p1));
    let (y0, y1) = (c(y.p0), c(y.p1));
    draw_y_grid(s, x, y, 11);
    for (t, label) in x.ticks.iter().zip(&x.labels) {
        let px = c(x.map(*t));
        let _ = write!(
            s,
            r##"<line x1="{px}" y1="{y0}" x2="{px}" y2="{}" stroke="{AXIS}" stroke-width="1"/><text x="{px}" y="{}" font-size="11" text-anchor="middle" fill="{AXIS}">{label}</text>"##,
            c(y.p0 + 5.0),
            c(y.p0 + 18.0)
        );
    }
    let _ = write!(
        s,
        r##"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="{AXIS}" stroke-width="1"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="{AXIS}" stroke-width="1"/>"##
    );
    let _ = write!(
        s,
        r##"<text x="{}" y="{}" font-size="12" text-anchor="middle" fill="{AXIS}">{x_label}</text>"##,
        c((x.p0 + x.p1) / 2.0),
        c(y.p0 + 36.0)
    );
    let ym = c((y.p0 + y.p1) / 2.0);
    let _ = write!(
        s,
        r##"<text x="16" y="{ym}" font-size="12" text-anchor="middle" fill="{AXIS}" transform="rotate(-90 16 {ym})">{y_label}</text>"##
    );
}

/// Colours of a sweep plot's settings, in order (the baseline has no line: it is the reference).
/// Ten distinguishable colours (a study's eight arms had shared six).
pub(super) const SERIES: [&str; 10] = [
    "#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#57606a", "#e16f24", "#1b7c83",
    "#bf3989", "#0a3069",
];
/// Bins of positions a sweep plot pools rows into.
pub const SWEEP_BINS: usize = 48;

/// Inline SVG for a sweep at one context length: for each setting measured against the
/// baseline, the mean KLD in each of [`SWEEP_BINS`] equal bins of positions on a log axis (the
/// settings differ by decades: int8 close, int4 far), and under it each setting's top-1 flip
/// rate per bin. A bin whose mean KLD is 0 has no point on the log axis (the line breaks).
pub fn svg_sweep(context_length: usize, baseline: &str, series: &[(String, RunRows)]) -> String {
    let x_end = series
        .iter()
        .flat_map(|(_, r)| r.position.iter().copied())
        .max()
        .map_or(0.0, |p| p as f64)
        .max(context_length.saturating_sub(2) as f64)
        .max(1.0);
    let width = (x_end as u64 + 1).div_ceil(SWEEP_BINS as u64).max(1);
    let n_bins = (x_end as u64 / width + 1) as usize;
    // Per series and bin: (mean KLD, flip rate), `None` for a bin without rows.
    let binned: Vec<Vec<Option<(f64, f64)>>> = series
        .iter()
        .map(|(_, run)| {
            let n = run.position.len().min(run.kld.len()).min(run.flip.len());
            let mut acc = vec![(0.0f64, 0usize, 0usize, 0usize); n_bins];
            for i in 0..n {
                let b = ((run.position[i] / width) as usize).min(n_bins - 1);
                let a = &mut acc[b];
                if run.kld[i].is_finite() {
                    a.0 += run.kld[i];
                    a.1 += 1;
                }
                a.2 += usize::from(run.flip[i]);
                a.3 += 1;
            }
            acc.iter()
                .map(|&(sum, finite, flips, rows)| {
                    (rows > 0 && finite > 0)
                        .then(|| (sum / finite as f64, flips as f64 / rows as f64))
                })
                .collect()
        })
        .collect();
    let positive = binned
        .iter()
        .flatten()
        .flatten()
        .map(|p| p.0)
        .filter(|&m| m > 0.0);
    let (lo, hi) = positive.fold((f64::INFINITY, 0f64), |(lo, hi), m| (lo.min(m), hi.max(m)));
    let (d_lo, d_hi) = if hi > 0.0 {
        let (a, b) = (lo.log10().floor(), hi.log10().ceil());
        (a, if b > a { b } else { a + 1.0 })
    } else {
        (-6.0, 0.0)
    };
    let decades: Vec<f64> = (d_lo as i32..=d_hi as i32).map(f64::from).collect();
    let y_axis = Axis {
        lo: d_lo,
        hi: d_hi,
        p0: HEIGHT - BOTTOM,
        p1: TOP + 16.0,
        labels: decades.iter().map(|d| format!("1e{d}")).collect(),
        ticks: decades,
    };
    let mut x_axis = Axis::linear(0.0, x_end, LEFT, WIDTH - RIGHT);
    x_axis.clip(x_end);
    let mut s = open_svg_sized(
        &format!(
            "Mean KLD and top-1 flip rate along the window for each setting against {baseline} at context length {context_length}"
        ),
        POSITION_HEIGHT,
    );
    let _ = write!(
        s,
        r##"<text x="{LEFT}" y="18" font-size="14" font-weight="bold" fill="#24292f">context length {context_length}: mean KLD against {} by position (bins of {width})</text>"##,
        escape_xml(baseline)
    );
    draw_axes(
        &mut s,
        &x_axis,
        &y_axis,
        "position j in the window",
        "mean KLD (nats, log)",
    );
    let rate_max = binned
        .iter()
        .flatten()
        .flatten()
        .map(|p| p.1)
        .fold(0.0f64, f64::max);
    let flip_axis = Axis::linear(0.0, rate_max, FLIP_BOTTOM, FLIP_TOP);
    draw_flip_axes(&mut s, &x_axis, &flip_axis);
    let centre = |b: usize| {
        let lo = (b as u64 * width) as f64;
        (lo + (lo + width as f64 - 1.0).min(x_end)) / 2.0
    };
    let (mut legend_x, mut legend_y) = (LEFT, 30.0);
    for (k, ((name, _), bins)) in series.iter().zip(&binned).enumerate() {
        let colour = SERIES[k % SERIES.len()];
        // Runs of consecutive drawable bins, each its own polyline.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        let mut flips: Vec<(f64, f64)> = Vec::new();
        for (b, p) in bins.iter().enumerate() {
            match p {
                Some((m, rate)) => {
                    flips.push((x_axis.map(centre(b)), flip_axis.map(*rate)));
                    if *m > 0.0 {
                        runs.last_mut()
                            .expect("one run at least")
                            .push((x_axis.map(centre(b)), y_axis.map(m.log10())));
                        continue;
                    }
                    runs.push(Vec::new());
                }
                None => runs.push(Vec::new()),
            }
        }
        let name = escape_xml(name);
        for points in runs.iter().filter(|r| !r.is_empty()) {
            polyline(&mut s, points, colour, &format!("{name}: mean KLD"));
        }
        if !flips.is_empty() {
            polyline(&mut s, &flips, colour, &format!("{name}: top-1 flip rate"));
        }
        // Legend entries one after another, each as wide as its name (about 7 px a character
        // at 11 px), wrapping to the next row past the plot's right edge.
        let entry = 30.0 + 7.0 * series[k].0.chars().count() as f64;
        if legend_x > LEFT && legend_x + entry > WIDTH - RIGHT {
            (legend_x, legend_y) = (LEFT, legend_y + 14.0);
        }
        let (lx, ly) = (legend_x, legend_y);
        legend_x += entry;
        let _ = write!(
            s,
            r##"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2"/><text x="{}" y="{}" font-size="11" fill="{AXIS}">{name}</text>"##,
            lx + 16.0,
            lx + 20.0,
            ly + 4.0
        );
    }
    s.push_str("</svg>");
    s
}

/// One line through `points` (a point alone is a dot), titled for the hover text.
pub(super) fn polyline(s: &mut String, points: &[(f64, f64)], colour: &str, title: &str) {
    if let [(x, y)] = points {
        let _ = write!(
            s,
            r##"<circle cx="{}" cy="{}" r="2.5" fill="{colour}"><title>{title}</title></circle>"##,
            c(*x),
            c(*y)
        );
        return;
    }
    let _ = write!(
        s,
        r##"<polyline class="series" fill="none" stroke="{colour}" stroke-width="1.5" points=""##
    );
    for (i, (x, y)) in points.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        let _ = write!(s, "{},{}", c(*x), c(*y));
    }
    let _ = write!(s, r##""><title>{title}</title></polyline>"##);
}

/// Text for an SVG or HTML text node or attribute.
pub fn escape_xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(ch),
        }
    }
    out
}
