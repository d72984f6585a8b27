//! The report's timeline as one inline SVG, sans-IO: the bars of decisions per interval
//! stacked by outcome (Okabe–Ito colours), a round y-axis, a time axis in the `--tz` zone with
//! ticks at round times, a legend, and the markers drawn generically over the bars (a band
//! for a marker with an end, a tick for one without). Model in, `String` out.

use std::fmt::Write as _;

use super::{Marker, MarkerKind, Timeline, align_down, escape_html};
use crate::model::Outcome;
use crate::timefmt::Zone;

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 360.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 276.0;

/// Outcomes bottom to top, with their colour: the Okabe–Ito palette (colour-blind safe), the
/// quarantining outcomes in its strongest colours.
pub const PALETTE: [(Outcome, &str); 9] = [
    (Outcome::Applied, "#0072B2"),
    (Outcome::AppliedLate, "#56B4E9"),
    (Outcome::Released, "#F0E442"),
    (Outcome::Duplicate, "#009E73"),
    (Outcome::Conflict, "#D55E00"),
    (Outcome::Stale, "#E69F00"),
    (Outcome::Malformed, "#CC79A7"),
    (Outcome::Discarded, "#000000"),
    (Outcome::Relay, "#999999"),
];

/// Tick steps of the time axis, shortest first.
const TICK_STEPS_MS: [u64; 24] = [
    10,
    20,
    50,
    100,
    200,
    500,
    1_000,
    5_000,
    10_000,
    15_000,
    30_000,
    60_000,
    300_000,
    600_000,
    900_000,
    1_800_000,
    3_600_000,
    7_200_000,
    10_800_000,
    21_600_000,
    43_200_000,
    86_400_000,
    172_800_000,
    604_800_000,
];
const MAX_TICKS: u64 = 8;

/// The smallest of 1, 2, 5 × 10^k at or above `m` (1 for 0).
pub fn round_max(m: u64) -> u64 {
    let mut p: u64 = 1;
    loop {
        for f in [1, 2, 5] {
            if let Some(v) = p.checked_mul(f)
                && v >= m
            {
                return v;
            }
        }
        match p.checked_mul(10) {
            Some(n) => p = n,
            None => return u64::MAX,
        }
    }
}

/// The y-axis gridline step for a `round_max` value: 4 or 5 steps where they are whole.
fn y_step(max: u64) -> u64 {
    [5, 4, 2, 1]
        .into_iter()
        .find(|d| max.is_multiple_of(*d))
        .map_or(max, |d| max / d)
        .max(1)
}

/// The time-axis tick step for a span: the shortest giving at most `MAX_TICKS` ticks.
pub fn tick_step(span_ms: u64) -> u64 {
    TICK_STEPS_MS
        .iter()
        .copied()
        .find(|s| span_ms / s <= MAX_TICKS)
        .unwrap_or_else(|| (span_ms / MAX_TICKS / 86_400_000 + 1) * 86_400_000)
}

/// The SVG of `timeline` with `markers`, times shown in `zone`.
pub fn timeline(tl: &Timeline, markers: &[Marker], zone: &Zone) -> String {
    let mut s = String::new();
    let start = tl.origin_ms;
    let end = tl.end_ms().max(start + 1);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = BOTTOM - TOP;
    let x = |t: u64| LEFT + (t.clamp(start, end) - start) as f64 / (end - start) as f64 * plot_w;
    let tallest = tl.bars.iter().map(|b| b.total()).max().unwrap_or(0);
    let y_max = round_max(tallest);
    let y = |n: u64| BOTTOM - n as f64 / y_max as f64 * plot_h;
    let _ = write!(
        s,
        "<svg class=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} \
         {HEIGHT}\" role=\"img\" aria-labelledby=\"timeline-title\" data-interval-ms=\"{}\" \
         data-bars=\"{}\" data-y-max=\"{y_max}\"><title id=\"timeline-title\">Decisions per {} \
         by outcome</title>",
        tl.interval_ms,
        tl.bars.len(),
        interval_words(tl.interval_ms)
    );
    s.push_str(
        "<style>text{font:11px sans-serif;fill:#222}.axis{stroke:#444;stroke-width:1}\
         .grid{stroke:#ddd;stroke-width:1}.burst text{font-weight:bold}</style>",
    );
    // Y gridlines and labels.
    let step = y_step(y_max);
    let mut v = 0;
    while v <= y_max {
        let yy = y(v);
        let _ = write!(
            s,
            "<line class=\"grid\" x1=\"{LEFT}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v}</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            yy + 4.0
        );
        v += step;
    }
    let _ = write!(
        s,
        "<text x=\"14\" y=\"{:.1}\" transform=\"rotate(-90 14 {:.1})\" \
         text-anchor=\"middle\">decisions per {}</text>",
        (TOP + BOTTOM) / 2.0,
        (TOP + BOTTOM) / 2.0,
        interval_words(tl.interval_ms)
    );
    // Bars, stacked bottom to top in palette order.
    let bar_w = plot_w / tl.bars.len().max(1) as f64;
    let pad = if bar_w > 4.0 { bar_w * 0.12 } else { 0.0 };
    s.push_str("<g class=\"bars\">");
    for (i, bar) in tl.bars.iter().enumerate() {
        if bar.total() == 0 {
            continue;
        }
        let bx = LEFT + i as f64 * bar_w + pad;
        let mut below = 0;
        for (o, colour) in PALETTE {
            let n = bar.get(o);
            if n == 0 {
                continue;
            }
            let (y1, y0) = (y(below + n), y(below));
            let _ = write!(
                s,
                "<rect x=\"{bx:.2}\" y=\"{y1:.2}\" width=\"{:.2}\" height=\"{:.2}\" \
                 fill=\"{colour}\"><title>{} {o}</title></rect>",
                (bar_w - 2.0 * pad).max(0.5),
                (y0 - y1).max(0.5),
                n
            );
            below += n;
        }
    }
    s.push_str("</g>");
    // Markers over the bars.
    let mut band = 0usize;
    for m in markers {
        let label = escape_html(&m.label);
        let class = m.kind.as_str();
        match m.until_ms {
            Some(until) => {
                let x0 = x(m.at_ms);
                let w = (x(until) - x0).max(3.0);
                let ly = 14.0 + (band % 2) as f64 * 14.0;
                band += 1;
                let (anchor, lx) = if x0 > LEFT + plot_w / 2.0 {
                    ("end", x0 + w)
                } else {
                    ("start", x0)
                };
                let _ = write!(
                    s,
                    "<g class=\"{class}\"><title>{label}</title><rect x=\"{x0:.2}\" y=\"{TOP}\" \
                     width=\"{w:.2}\" height=\"{plot_h}\" fill=\"#000000\" fill-opacity=\"0.10\" \
                     stroke=\"#333333\" stroke-dasharray=\"4 3\"/><line x1=\"{x0:.2}\" \
                     y1=\"{:.1}\" x2=\"{x0:.2}\" y2=\"{TOP}\" stroke=\"#333333\"/><text \
                     x=\"{lx:.2}\" y=\"{ly:.1}\" text-anchor=\"{anchor}\">{label}</text></g>",
                    ly + 3.0
                );
            }
            None => {
                let xx = x(m.at_ms);
                let colour = if m.kind == MarkerKind::Gap {
                    "#D55E00"
                } else {
                    "#333333"
                };
                let _ = write!(
                    s,
                    "<g class=\"{class}\"><title>{label}</title><line x1=\"{xx:.2}\" \
                     y1=\"{TOP}\" x2=\"{xx:.2}\" y2=\"{BOTTOM}\" stroke=\"{colour}\" \
                     stroke-dasharray=\"2 2\"/><path d=\"M{:.2} {:.1} L{:.2} {:.1} L{xx:.2} \
                     {TOP} Z\" fill=\"{colour}\"/></g>",
                    xx - 4.0,
                    TOP - 7.0,
                    xx + 4.0,
                    TOP - 7.0
                );
            }
        }
    }
    // Axes and time ticks.
    let _ = write!(
        s,
        "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{BOTTOM}\" x2=\"{:.1}\" y2=\"{BOTTOM}\"/>\
         <line class=\"axis\" x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{BOTTOM}\"/>",
        WIDTH - RIGHT
    );
    let span = end - start;
    let tick = tick_step(span);
    let offset = zone.offset_ms_at(start);
    let mut t = align_down(start, tick, offset);
    if t < start {
        t += tick;
    }
    let mut last_day = String::new();
    while t <= end {
        let shown = zone.show_ms(t);
        let day = shown.get(5..10).unwrap_or("").to_string();
        let clock = if tick < 1_000 {
            shown.get(11..23)
        } else if tick < 60_000 {
            shown.get(11..19)
        } else {
            shown.get(11..16)
        }
        .unwrap_or("")
        .to_string();
        let label = if tick >= 86_400_000 {
            day.clone()
        } else if day != last_day {
            format!("{day} {clock}")
        } else {
            clock
        };
        last_day = day;
        let xx = x(t);
        let _ = write!(
            s,
            "<line class=\"axis\" x1=\"{xx:.2}\" y1=\"{BOTTOM}\" x2=\"{xx:.2}\" y2=\"{:.1}\"/>\
             <text class=\"tick\" x=\"{xx:.2}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            BOTTOM + 5.0,
            BOTTOM + 18.0,
            escape_html(&label)
        );
        t += tick;
    }
    let zone_name = zone_label(&zone.show_ms(start));
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">time ({})</text>",
        LEFT + plot_w / 2.0,
        BOTTOM + 36.0,
        escape_html(&zone_name)
    );
    // Legend: the outcomes that occur, then the marker kinds.
    let mut totals = crate::model::OutcomeCounts::default();
    for b in &tl.bars {
        totals.merge(b);
    }
    let mut lx = LEFT;
    let ly = HEIGHT - 14.0;
    s.push_str("<g class=\"legend\">");
    for (o, colour) in PALETTE {
        if totals.get(o) == 0 {
            continue;
        }
        let _ = write!(
            s,
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"11\" height=\"11\" fill=\"{colour}\"/>\
             <text x=\"{:.1}\" y=\"{ly:.1}\">{o}</text>",
            ly - 9.0,
            lx + 15.0
        );
        lx += 22.0 + 7.0 * o.as_str().len() as f64;
    }
    if markers.iter().any(|m| m.kind == MarkerKind::Burst) {
        let _ = write!(
            s,
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"11\" height=\"11\" fill=\"#000000\" \
             fill-opacity=\"0.10\" stroke=\"#333333\" stroke-dasharray=\"2 2\"/><text \
             x=\"{:.1}\" y=\"{ly:.1}\">replay burst</text>",
            ly - 9.0,
            lx + 15.0
        );
        lx += 110.0;
    }
    if markers.iter().any(|m| m.kind == MarkerKind::Gap) {
        let _ = write!(
            s,
            "<path d=\"M{lx:.1} {:.1} L{:.1} {:.1} L{:.1} {:.1} Z\" fill=\"#D55E00\"/><text \
             x=\"{:.1}\" y=\"{ly:.1}\">upstream gap</text>",
            ly - 9.0,
            lx + 10.0,
            ly - 9.0,
            lx + 5.0,
            ly + 1.0,
            lx + 15.0
        );
    }
    if totals.total() == 0 {
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">no decisions in range</text>",
            LEFT + plot_w / 2.0,
            (TOP + BOTTOM) / 2.0
        );
    }
    s.push_str("</g></svg>");
    s
}

/// "second", "5 s", "minute", "6 h", "day", "2 days".
pub(super) fn interval_words(ms: u64) -> String {
    match ms {
        1_000 => "second".into(),
        60_000 => "minute".into(),
        3_600_000 => "hour".into(),
        86_400_000 => "day".into(),
        ms if ms.is_multiple_of(86_400_000) => format!("{} days", ms / 86_400_000),
        ms if ms.is_multiple_of(3_600_000) => format!("{} h", ms / 3_600_000),
        ms if ms.is_multiple_of(60_000) => format!("{} min", ms / 60_000),
        ms if ms.is_multiple_of(1_000) => format!("{} s", ms / 1000),
        ms => format!("{ms} ms"),
    }
}

/// "UTC" for a `Z` time, else "UTC+01:00" from the time's offset.
fn zone_label(shown: &str) -> String {
    if shown.ends_with('Z') {
        return "UTC".into();
    }
    let offset = shown.get(shown.len().saturating_sub(6)..).unwrap_or("");
    format!("UTC{offset}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_796_007_134_123; // 2026-11-30T02:52:14.123Z

    fn tl_with(counts: &[(usize, Outcome, u64)]) -> Timeline {
        let mut tl = Timeline::new(T, T + 3_600_000, 0);
        for &(i, o, n) in counts {
            for _ in 0..n {
                tl.bars[i].add(o);
            }
        }
        tl
    }

    fn count(s: &str, needle: &str) -> usize {
        s.matches(needle).count()
    }

    #[test]
    fn y_axis_maxima_are_round() {
        assert_eq!(round_max(0), 1);
        assert_eq!(round_max(1), 1);
        assert_eq!(round_max(3), 5);
        assert_eq!(round_max(7), 10);
        assert_eq!(round_max(101), 200);
        assert_eq!(round_max(300), 500);
        assert_eq!(round_max(u64::MAX), u64::MAX);
        assert_eq!(y_step(500), 100);
        assert_eq!(y_step(200), 40);
        assert_eq!(y_step(1), 1);
    }

    #[test]
    fn bars_stack_one_rect_per_outcome_present() {
        let tl = tl_with(&[
            (0, Outcome::Applied, 40),
            (0, Outcome::Duplicate, 10),
            (3, Outcome::Conflict, 2),
        ]);
        let svg = timeline(&tl, &[], &Zone::utc());
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(count(&svg, "fill=\"#0072B2\"><title>40 applied"), 1);
        assert_eq!(count(&svg, "<title>10 duplicate"), 1);
        assert_eq!(count(&svg, "fill=\"#D55E00\"><title>2 conflict"), 1);
        assert!(svg.contains("data-y-max=\"50\""), "{svg}");
        // The legend names only what occurs.
        assert!(svg.contains(">conflict</text>") && !svg.contains(">stale</text>"));
    }

    #[test]
    fn each_marker_is_one_group_bands_for_spans_ticks_for_instants() {
        let tl = tl_with(&[(1, Outcome::Applied, 1)]);
        let markers = [
            Marker {
                at_ms: T + 60_000,
                until_ms: Some(T + 120_000),
                kind: MarkerKind::Burst,
                label: "mqtt://b:1883: 300 duplicates absorbed".into(),
            },
            Marker {
                at_ms: T + 600_000,
                until_ms: Some(T + 600_000),
                kind: MarkerKind::Burst,
                label: "<script>x</script>".into(),
            },
            Marker {
                at_ms: T + 900_000,
                until_ms: None,
                kind: MarkerKind::Gap,
                label: "CAL/E1 epoch 1: 3 missing (4..6)".into(),
            },
        ];
        let svg = timeline(&tl, &markers, &Zone::utc());
        assert_eq!(count(&svg, "<g class=\"burst\">"), 2);
        assert_eq!(count(&svg, "<g class=\"gap\">"), 1);
        assert!(svg.contains("300 duplicates absorbed"));
        assert!(!svg.contains("<script>") && svg.contains("&lt;script&gt;"));
    }

    #[test]
    fn time_ticks_fall_on_round_times_of_the_zone() {
        let tl = tl_with(&[]);
        let svg = timeline(&tl, &[], &Zone::utc());
        // An hour's span: ticks every 10 minutes, the first labelled with its day.
        assert!(svg.contains(">11-30 03:00</text>"), "{svg}");
        assert!(svg.contains(">03:10</text>") && svg.contains(">03:50</text>"));
        assert!(svg.contains("time (UTC)") && svg.contains("no decisions in range"));
        let st_johns = Zone::parse("America/St_Johns").unwrap();
        let svg = timeline(&tl, &[], &st_johns);
        assert!(svg.contains(">11-29 23:30</text>"), "{svg}");
        assert!(svg.contains("time (UTC-03:30)"));
    }

    #[test]
    fn tick_steps_and_interval_words() {
        assert_eq!(tick_step(3_600_000), 600_000);
        assert_eq!(tick_step(60_000), 10_000);
        assert_eq!(tick_step(7 * 86_400_000), 86_400_000);
        assert_eq!(interval_words(30_000), "30 s");
        assert_eq!(interval_words(50), "50 ms");
        assert_eq!(tick_step(1_200), 200);
        assert_eq!(interval_words(300_000), "5 min");
        assert_eq!(interval_words(21_600_000), "6 h");
        assert_eq!(interval_words(2 * 86_400_000), "2 days");
    }
}
