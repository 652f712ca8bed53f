//! The study's plots (issue #20), inline SVG like the report's: cumulative top-1 flips along
//! the text per arm (the seed study's headline figure), mean KLD against bits per weight (the
//! quant publisher's chart), and the interval forest (each arm's mean KLD with its 95%
//! interval, on a log axis). KLD along position per arm is [`super::svg_sweep`].

use std::fmt::Write as _;

use super::escape_xml;
use super::render::format_number;
use super::svg::{
    AXIS, Axis, BOTTOM, GRID, HEIGHT, LEFT, RIGHT, SERIES, TOP, WIDTH, c, draw_axes,
    open_svg_sized, polyline,
};

/// One arm's rows in the text's order: (where the row sits in the token stream, whether its
/// top-1 flipped).
pub struct FlipSeries {
    pub name: String,
    pub rows: Vec<(u64, bool)>,
}

/// Cumulative top-1 flips along the token stream, one line per arm.
pub fn svg_cumulative_flips(context_length: usize, series: &[FlipSeries]) -> String {
    let x_end = series
        .iter()
        .flat_map(|s| s.rows.iter().map(|r| r.0))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let most = series
        .iter()
        .map(|s| s.rows.iter().filter(|r| r.1).count())
        .max()
        .unwrap_or(0);
    let mut x_axis = Axis::linear(0.0, x_end, LEFT, WIDTH - RIGHT);
    x_axis.clip(x_end);
    let y_axis = Axis::counts(most.max(1), HEIGHT - BOTTOM, TOP + 16.0);
    let mut s = open_svg_sized(
        &format!(
            "Cumulative top-1 flips along the text for each arm at context length {context_length}"
        ),
        HEIGHT,
    );
    let _ = write!(
        s,
        r##"<text x="{LEFT}" y="18" font-size="14" font-weight="bold" fill="#24292f">context length {context_length}: top-1 flips so far, along the text</text>"##
    );
    draw_axes(
        &mut s,
        &x_axis,
        &y_axis,
        "token in the eval text",
        "cumulative top-1 flips",
    );
    let mut legend_x = LEFT;
    for (k, series) in series.iter().enumerate() {
        let colour = SERIES[k % SERIES.len()];
        let mut rows = series.rows.clone();
        rows.sort_by_key(|r| r.0);
        // At most ~600 points a line: one per step in x of a 600th of the range.
        let step = (x_end / 600.0).max(1.0);
        let mut points = vec![(x_axis.map(0.0), y_axis.map(0.0))];
        let mut flips = 0usize;
        let mut last_x = f64::NEG_INFINITY;
        for (i, (x, flip)) in rows.iter().enumerate() {
            flips += usize::from(*flip);
            let x = *x as f64;
            if x - last_x >= step || i + 1 == rows.len() {
                points.push((x_axis.map(x), y_axis.map(flips as f64)));
                last_x = x;
            }
        }
        let name = escape_xml(&series.name);
        polyline(&mut s, &points, colour, &format!("{name}: {flips} flips"));
        let entry = 40.0 + 7.0 * series.name.chars().count() as f64;
        if legend_x + entry <= WIDTH - RIGHT {
            let _ = write!(
                s,
                r##"<line x1="{legend_x}" y1="30" x2="{}" y2="30" stroke="{colour}" stroke-width="2"/><text x="{}" y="34" font-size="11" fill="{AXIS}">{name}</text>"##,
                legend_x + 16.0,
                legend_x + 20.0
            );
            legend_x += entry;
        }
    }
    s.push_str("</svg>");
    s
}

/// One arm as a point or bar: its name, mean KLD and interval, and bits per weight.
#[derive(Debug, Clone)]
pub struct ArmPoint {
    pub name: String,
    pub kld_mean: f64,
    pub ci: [f64; 2],
    pub bits_per_weight: Option<f64>,
}

/// The most decades a log axis spans: a control's 4e-12 beside arms at 1e-2 had stretched the
/// axis to 1e-12 and squeezed every arm into its last decades. What lies below is written, not
/// drawn.
const MAX_DECADES: f64 = 5.0;

/// A log axis over the decades holding every positive value of `values`, at most
/// [`MAX_DECADES`] below the largest.
fn log_axis(values: impl Iterator<Item = f64>, p0: f64, p1: f64) -> Axis {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (d_lo, d_hi) = if hi > 0.0 {
        let b = hi.log10().ceil();
        let a = lo.log10().floor().max(b - MAX_DECADES);
        (a, if b > a { b } else { a + 1.0 })
    } else {
        (-6.0, 0.0)
    };
    let decades: Vec<f64> = (d_lo as i32..=d_hi as i32).map(f64::from).collect();
    Axis {
        lo: d_lo,
        hi: d_hi,
        p0,
        p1,
        labels: decades.iter().map(|d| format!("1e{d}")).collect(),
        ticks: decades,
    }
}

/// Mean KLD (log) against bits per weight, one labelled point per arm that has both, with its
/// interval as a vertical bar. Arms without a positive KLD cannot sit on a log axis and are
/// named in a note.
pub fn svg_kld_vs_bits(context_length: usize, arms: &[ArmPoint]) -> String {
    let placed: Vec<&ArmPoint> = arms
        .iter()
        .filter(|a| a.bits_per_weight.is_some() && a.kld_mean > 0.0 && a.kld_mean.is_finite())
        .collect();
    let (b_lo, b_hi) = placed
        .iter()
        .filter_map(|a| a.bits_per_weight)
        .fold((f64::INFINITY, 0f64), |(lo, hi), b| (lo.min(b), hi.max(b)));
    let (b_lo, b_hi) = if b_hi > 0.0 {
        ((b_lo - 1.0).max(0.0).floor(), b_hi.ceil() + 1.0)
    } else {
        (0.0, 16.0)
    };
    let x_axis = Axis::linear(b_lo, b_hi, LEFT, WIDTH - RIGHT);
    let y_axis = log_axis(
        placed.iter().flat_map(|a| [a.kld_mean, a.ci[0], a.ci[1]]),
        HEIGHT - BOTTOM,
        TOP,
    );
    let mut s = open_svg_sized(
        &format!("Mean KLD against bits per weight at context length {context_length}"),
        HEIGHT,
    );
    let _ = write!(
        s,
        r##"<text x="{LEFT}" y="18" font-size="14" font-weight="bold" fill="#24292f">context length {context_length}: mean KLD against bits per weight</text>"##
    );
    draw_axes(
        &mut s,
        &x_axis,
        &y_axis,
        "bits per weight (linear layers)",
        "mean KLD (nats, log)",
    );
    let y = |v: f64| y_axis.map(v.max(10f64.powf(y_axis.lo)).log10());
    let mut labels: Vec<[f64; 4]> = Vec::new();
    for (k, a) in placed.iter().enumerate() {
        let colour = SERIES[k % SERIES.len()];
        let x = x_axis.map(a.bits_per_weight.unwrap_or(0.0));
        let name = escape_xml(&a.name);
        if a.ci.iter().all(|v| v.is_finite() && *v > 0.0) {
            let _ = write!(
                s,
                r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{colour}" stroke-width="1.5"/>"##,
                c(x),
                c(y(a.ci[0])),
                c(x),
                c(y(a.ci[1]))
            );
        }
        let (lx, ly) = label_spot(&mut labels, x, y(a.kld_mean), a.name.chars().count());
        let _ = write!(
            s,
            r##"<circle cx="{}" cy="{}" r="4" fill="{colour}"><title>{name}: {} bits per weight, mean KLD {}</title></circle><text x="{}" y="{}" font-size="11" fill="{AXIS}">{name}</text>"##,
            c(x),
            c(y(a.kld_mean)),
            format_number(a.bits_per_weight.unwrap_or(0.0), 3),
            format_number(a.kld_mean, 3),
            c(lx),
            c(ly)
        );
    }
    let left_out: Vec<String> = arms
        .iter()
        .filter(|a| !placed.iter().any(|p| p.name == a.name))
        .map(|a| escape_xml(&a.name))
        .collect();
    if !left_out.is_empty() {
        let _ = write!(
            s,
            r##"<text x="{LEFT}" y="{}" font-size="10" fill="{AXIS}">not drawn (no bits per weight, or KLD 0): {}</text>"##,
            HEIGHT - 4.0,
            left_out.join(", ")
        );
    }
    s.push_str("</svg>");
    s
}

/// Where a point's label goes: above right of the point, else below right, above left or below
/// left, the first spot whose box (about 6.5 px a character, 12 px high) overlaps no label placed
/// before (two arms of the same bits per weight had printed their names over each other); the
/// first spot when all overlap. The chosen box is added to `placed`.
fn label_spot(placed: &mut Vec<[f64; 4]>, x: f64, y: f64, chars: usize) -> (f64, f64) {
    let w = 6.5 * chars as f64;
    let spots = [
        (x + 7.0, y - 6.0),
        (x + 7.0, y + 14.0),
        (x - 7.0 - w, y - 6.0),
        (x - 7.0 - w, y + 14.0),
    ];
    let boxed = |(lx, ly): (f64, f64)| [lx, ly - 11.0, lx + w, ly + 1.0];
    let free = |b: &[f64; 4]| {
        placed
            .iter()
            .all(|p| b[2] <= p[0] || b[0] >= p[2] || b[3] <= p[1] || b[1] >= p[3])
    };
    let spot = spots
        .into_iter()
        .find(|s| free(&boxed(*s)))
        .unwrap_or(spots[0]);
    placed.push(boxed(spot));
    spot
}

/// The interval forest: one row per arm, its mean KLD as a dot and its 95% interval as a bar,
/// on a shared log axis. An arm at 0 (a control) is written, not drawn.
pub fn svg_forest(context_length: usize, arms: &[ArmPoint]) -> String {
    let row = 22.0;
    let height = TOP + 24.0 + row * arms.len() as f64 + BOTTOM;
    let label_width = 150.0;
    let x_axis = log_axis(
        arms.iter().flat_map(|a| [a.kld_mean, a.ci[0], a.ci[1]]),
        LEFT + label_width,
        WIDTH - RIGHT,
    );
    let x = |v: f64| x_axis.map(v.max(10f64.powf(x_axis.lo)).log10());
    let mut s = open_svg_sized(
        &format!("Each arm's mean KLD with its 95% interval at context length {context_length}"),
        height,
    );
    let _ = write!(
        s,
        r##"<text x="{LEFT}" y="18" font-size="14" font-weight="bold" fill="#24292f">context length {context_length}: mean KLD and 95% interval per arm</text>"##
    );
    let bottom = height - BOTTOM;
    for (t, label) in x_axis.ticks.iter().zip(&x_axis.labels) {
        let px = c(x_axis.map(*t));
        let _ = write!(
            s,
            r##"<line x1="{px}" y1="{}" x2="{px}" y2="{}" stroke="{GRID}" stroke-width="0.6"/><text x="{px}" y="{}" font-size="11" text-anchor="middle" fill="{AXIS}">{label}</text>"##,
            c(TOP + 16.0),
            c(bottom),
            c(bottom + 16.0)
        );
    }
    let _ = write!(
        s,
        r##"<text x="{}" y="{}" font-size="12" text-anchor="middle" fill="{AXIS}">mean KLD (nats, log)</text>"##,
        c((LEFT + label_width + WIDTH - RIGHT) / 2.0),
        c(bottom + 34.0)
    );
    for (k, a) in arms.iter().enumerate() {
        let y = TOP + 24.0 + row * (k as f64 + 0.5);
        let colour = SERIES[k % SERIES.len()];
        let name = escape_xml(&a.name);
        let _ = write!(
            s,
            r##"<text x="{LEFT}" y="{}" font-size="12" fill="#24292f">{name}</text>"##,
            c(y + 4.0)
        );
        let floor = 10f64.powf(x_axis.lo);
        if !(a.kld_mean >= floor && a.kld_mean.is_finite()) {
            let why = if a.kld_mean > 0.0 && a.kld_mean.is_finite() {
                "below the axis"
            } else {
                "not on a log axis"
            };
            let _ = write!(
                s,
                r##"<text x="{}" y="{}" font-size="11" fill="{AXIS}">{} ({why})</text>"##,
                c(LEFT + label_width),
                c(y + 4.0),
                format_number(a.kld_mean, 3)
            );
            continue;
        }
        if a.ci.iter().all(|v| v.is_finite() && *v > 0.0) {
            // The bar, and a cap at each end: an interval narrower than the dot still shows
            // where it ends.
            let (x0, x1) = (c(x(a.ci[0])), c(x(a.ci[1])));
            let _ = write!(
                s,
                r##"<line x1="{x0}" y1="{}" x2="{x1}" y2="{}" stroke="{colour}" stroke-width="2"/><line x1="{x0}" y1="{}" x2="{x0}" y2="{}" stroke="{colour}" stroke-width="1.5"/><line x1="{x1}" y1="{}" x2="{x1}" y2="{}" stroke="{colour}" stroke-width="1.5"/>"##,
                c(y),
                c(y),
                c(y - 6.0),
                c(y + 6.0),
                c(y - 6.0),
                c(y + 6.0)
            );
        }
        let _ = write!(
            s,
            r##"<circle cx="{}" cy="{}" r="4" fill="{colour}"><title>{name}: {} [{}, {}]</title></circle>"##,
            c(x(a.kld_mean)),
            c(y),
            format_number(a.kld_mean, 3),
            format_number(a.ci[0], 3),
            format_number(a.ci[1], 3)
        );
    }
    s.push_str("</svg>");
    s
}

/// Each arm's turns in conversation order, one strip of cells per arm: same tokens as the
/// reference's (grey), different tokens but the turn holds (amber), the turn fails (red).
pub fn svg_turn_strip(arms: &[(String, Vec<crate::kld::turns::TurnOutcome>)]) -> String {
    use crate::kld::turns::TurnOutcome;
    const ROW: f64 = 18.0;
    const NAME: f64 = 150.0;
    let n = arms.iter().map(|(_, o)| o.len()).max().unwrap_or(0).max(1);
    let height = TOP + 40.0 + ROW * arms.len() as f64 + 24.0;
    let mut s = open_svg_sized(
        "Each arm's generated turns in conversation order: same as the reference's, different \
         but holding, or failing",
        height,
    );
    let _ = write!(
        s,
        r##"<text x="{LEFT}" y="18" font-size="14" font-weight="bold" fill="#24292f">turns along the conversations, per arm</text>"##
    );
    let (x0, x1) = (NAME, WIDTH - RIGHT);
    let cell = (x1 - x0) / n as f64;
    let colour = |o: TurnOutcome| match o {
        TurnOutcome::Same => "#d0d7de",
        TurnOutcome::Holds => "#d4a72c",
        TurnOutcome::Fails => "#cf222e",
    };
    let mut legend_x = LEFT;
    for (o, label) in [
        (TurnOutcome::Same, "same tokens"),
        (TurnOutcome::Holds, "differs, holds"),
        (TurnOutcome::Fails, "fails"),
    ] {
        let _ = write!(
            s,
            r##"<rect x="{legend_x}" y="26" width="10" height="10" fill="{}"/><text x="{}" y="35" font-size="11" fill="{AXIS}">{label}</text>"##,
            colour(o),
            legend_x + 14.0
        );
        legend_x += 24.0 + 7.0 * label.len() as f64;
    }
    for (k, (name, outcomes)) in arms.iter().enumerate() {
        let y = TOP + 40.0 + ROW * k as f64;
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" font-size="11" text-anchor="end" fill="{AXIS}">{}</text>"##,
            x0 - 6.0,
            c(y + ROW * 0.7),
            escape_xml(name)
        );
        for (i, &o) in outcomes.iter().enumerate() {
            let _ = write!(
                s,
                r##"<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>turn {}: {}</title></rect>"##,
                c(x0 + cell * i as f64),
                c(y + 2.0),
                c((cell - 1.0).max(0.5)),
                c(ROW - 4.0),
                colour(o),
                i + 1,
                match o {
                    TurnOutcome::Same => "same tokens",
                    TurnOutcome::Holds => "differs, holds",
                    TurnOutcome::Fails => "fails",
                }
            );
        }
    }
    let _ = write!(
        s,
        r##"<text x="{}" y="{}" font-size="11" text-anchor="middle" fill="{AXIS}">turn, in conversation order (1 to {n})</text>"##,
        c((x0 + x1) / 2.0),
        c(height - 8.0)
    );
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_of_points_at_one_place_do_not_overlap() {
        let mut placed = Vec::new();
        let a = label_spot(&mut placed, 100.0, 100.0, 10);
        let b = label_spot(&mut placed, 100.0, 100.0, 10);
        let c = label_spot(&mut placed, 102.0, 101.0, 10);
        assert_eq!(a, (107.0, 94.0));
        assert_eq!(b, (107.0, 114.0));
        assert!(c.0 < 100.0, "{c:?}");
    }

    #[test]
    fn a_log_axis_spans_at_most_five_decades_below_its_largest_value() {
        let axis = log_axis([4e-12, 2.5e-4, 0.03].into_iter(), 0.0, 100.0);
        assert_eq!((axis.lo, axis.hi), (-6.0, -1.0));
        let axis = log_axis([2.5e-4, 0.03].into_iter(), 0.0, 100.0);
        assert_eq!((axis.lo, axis.hi), (-4.0, -1.0));
    }
}
