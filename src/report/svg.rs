//! The report's timeline as one inline SVG, sans-IO: the bars of decisions per interval
//! stacked by outcome (Okabe–Ito colours), a round y-axis, a time axis in the `--tz` zone with
//! ticks at round times, two strips under it on their own scales (deliveries held in
//! quarantine per bar, upstream gap events per bar), a legend, and the markers drawn
//! generically over the bars (a band for a marker with an end, a tick for one without), each
//! numbered as the list under the chart numbers it. Model in, `String` out.

use std::fmt::Write as _;

use super::{Marker, MarkerKind, Timeline, align_down, escape_html};
use crate::model::Outcome;
use crate::timefmt::Zone;

// The viewBox is 800 wide: printed across A4's 186 mm text width one unit is 0.23 mm, so
// the 13-unit text prints at 8.6 pt (larger on Letter and on screen).
const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 84.0;
const RIGHT: f64 = 18.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 250.0;
/// The strips under the time axis: deliveries held in quarantine per bar, and gap events per
/// bar, each on its own scale.
const HELD_TOP: f64 = 284.0;
const GAPS_TOP: f64 = 312.0;
const STRIP_H: f64 = 22.0;
const FONT: f64 = 13.0;
// 8 pt is 2.822 mm: across A4's 186 mm, FONT units of WIDTH must print at least that tall.
const _: () = assert!(FONT * 186.0 / WIDTH >= 2.822);
/// The colours of the strips: held in the conflict colour, gaps in one the bars never use.
pub const HELD_COLOUR: &str = "#D55E00";
pub const GAP_COLOUR: &str = "#332288";

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

/// An estimate of a label's width at `FONT` (sans-serif, about 0.55 em a character).
fn text_w(label: &str) -> f64 {
    label.chars().count() as f64 * FONT * 0.55
}

/// The shortest tick step of `TICK_STEPS_MS` giving at most `MAX_TICKS` ticks whose labels
/// (of the clock that step shows, a date added where the day changes) do not overlap across
/// `plot_w`.
fn tick_step_fitting(span_ms: u64, plot_w: f64) -> u64 {
    let chars = |step: u64| match step {
        s if s < 1_000 => 12.0,
        s if s < 60_000 => 8.0,
        _ => 5.0,
    };
    TICK_STEPS_MS
        .iter()
        .copied()
        .find(|&s| {
            let gap = plot_w * s as f64 / span_ms.max(1) as f64;
            span_ms / s <= MAX_TICKS && gap >= (chars(s) + 6.0) * FONT * 0.55 + 10.0
        })
        .unwrap_or_else(|| tick_step(span_ms))
}

/// The SVG of `timeline` with `markers` (numbered 1.. in order, as the list under the chart
/// numbers them), times shown in `zone`.
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
    let _ = write!(
        s,
        "<style>text{{font:{FONT}px sans-serif;fill:#222}}.axis{{stroke:#444;stroke-width:1}}\
         .grid{{stroke:#ddd;stroke-width:1}}.burst text,.session_lost text{{font-weight:bold}}\
         </style>"
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
        "<text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" \
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
    // The strips: each bar's count on the strip's own scale, at least 2 units high for any
    // count above zero, so one conflict among thousands still shows.
    let held: Vec<u64> = (0..tl.bars.len()).map(|i| tl.held(i)).collect();
    let gaps: Vec<u64> = tl.gaps.iter().map(|g| g.0).collect();
    for (class, top, values, colour) in [
        ("held", HELD_TOP, &held, HELD_COLOUR),
        ("gaps", GAPS_TOP, &gaps, GAP_COLOUR),
    ] {
        let max = values.iter().copied().max().unwrap_or(0);
        let _ = write!(
            s,
            "<g class=\"strip {class}\" data-max=\"{max}\"><rect x=\"{LEFT}\" y=\"{top}\" \
             width=\"{plot_w:.1}\" height=\"{STRIP_H}\" fill=\"#f4f4f4\"/><text x=\"{:.1}\" \
             y=\"{:.1}\" text-anchor=\"end\">{class}</text>",
            LEFT - 6.0,
            top + STRIP_H - 6.0
        );
        for (i, &n) in values.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let h = (n as f64 / max as f64 * STRIP_H).max(2.0);
            let _ = write!(
                s,
                "<rect class=\"count\" data-bar=\"{i}\" data-value=\"{n}\" x=\"{:.2}\" \
                 y=\"{:.2}\" width=\"{:.2}\" height=\"{h:.2}\" fill=\"{colour}\"><title>{n} \
                 {class}</title></rect>",
                LEFT + i as f64 * bar_w + pad,
                top + STRIP_H - h,
                (bar_w - 2.0 * pad).max(1.0)
            );
        }
        s.push_str("</g>");
    }
    // Markers over the bars, numbered as listed under the chart.
    let mut band = 0usize;
    for (k, m) in markers.iter().enumerate() {
        let number = k + 1;
        let label = escape_html(&format!("{number}. {}", m.label));
        let class = m.kind.as_str();
        match m.until_ms {
            Some(until) => {
                let x0 = x(m.at_ms);
                let w = (x(until) - x0).max(3.0);
                let ly = 18.0 + (band % 2) as f64 * 16.0;
                band += 1;
                let (anchor, lx) = if x0 + text_w(&label) > WIDTH - RIGHT {
                    ("end", (x0 + w).min(WIDTH - 2.0))
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
                // A lost session in black; any other connect in grey, thinner.
                let (ink, width) = match m.kind {
                    MarkerKind::SessionLost => ("#000000", 1.5),
                    _ => ("#777777", 1.0),
                };
                let _ = write!(
                    s,
                    "<g class=\"{class}\"><title>{label}</title><line x1=\"{xx:.2}\" \
                     y1=\"{TOP}\" x2=\"{xx:.2}\" y2=\"{BOTTOM}\" stroke=\"{ink}\" \
                     stroke-width=\"{width}\" stroke-dasharray=\"6 3\"/><path d=\"M{:.2} {:.1} \
                     L{:.2} {:.1} L{xx:.2} {TOP} Z\" fill=\"{ink}\"/><text x=\"{xx:.2}\" \
                     y=\"{:.1}\" text-anchor=\"middle\">{number}</text></g>",
                    xx - 5.0,
                    TOP - 9.0,
                    xx + 5.0,
                    TOP - 9.0,
                    TOP - 12.0
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
    let tick = tick_step_fitting(span, plot_w);
    let offset = zone.offset_ms_at(start);
    let mut t = align_down(start, tick, offset);
    if t < start {
        t += tick;
    }
    // The first tick's day is in the axis title; a label names its day only when it changes.
    let mut last_day = zone.show_ms(t).get(5..10).unwrap_or("").to_string();
    let first_day = zone.show_ms(t).get(..10).unwrap_or("").to_string();
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
        // A label that would run past either edge is inset: anchored at its tick's side.
        let half = text_w(&label) / 2.0;
        let anchor = if xx + half > WIDTH - 2.0 {
            "end"
        } else if xx - half < 2.0 {
            "start"
        } else {
            "middle"
        };
        let _ = write!(
            s,
            "<line class=\"axis\" x1=\"{xx:.2}\" y1=\"{BOTTOM}\" x2=\"{xx:.2}\" y2=\"{:.1}\"/>\
             <text class=\"tick\" x=\"{xx:.2}\" y=\"{:.1}\" text-anchor=\"{anchor}\">{}</text>",
            BOTTOM + 5.0,
            BOTTOM + 20.0,
            escape_html(&label)
        );
        t += tick;
    }
    let zone_name = zone_label(&zone.show_ms(start));
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">time ({}), from {}</text>",
        LEFT + plot_w / 2.0,
        GAPS_TOP + STRIP_H + 22.0,
        escape_html(&zone_name),
        escape_html(&first_day)
    );
    // Legend: the outcomes that occur, then the marker kinds and the strips; wrapped onto a
    // second row when the first is full.
    let mut totals = crate::model::OutcomeCounts::default();
    for b in &tl.bars {
        totals.merge(b);
    }
    let square = |colour: &str| {
        format!("<rect x=\"{{x}}\" y=\"{{y}}\" width=\"12\" height=\"12\" fill=\"{colour}\"/>")
    };
    let mut items: Vec<(String, String)> = Vec::new();
    for (o, colour) in PALETTE {
        if totals.get(o) > 0 {
            items.push((square(colour), o.to_string()));
        }
    }
    if markers.iter().any(|m| m.kind == MarkerKind::Burst) {
        items.push((
            "<rect x=\"{x}\" y=\"{y}\" width=\"12\" height=\"12\" fill=\"#000000\" \
             fill-opacity=\"0.10\" stroke=\"#333333\" stroke-dasharray=\"2 2\"/>"
                .into(),
            "replay burst".into(),
        ));
    }
    if markers.iter().any(|m| m.kind == MarkerKind::SessionLost) {
        items.push((
            "<rect x=\"{x}\" y=\"{y}\" width=\"3\" height=\"12\" fill=\"#000000\"/>".into(),
            "broker session lost".into(),
        ));
    }
    if markers.iter().any(|m| m.kind == MarkerKind::Connect) {
        items.push((
            "<rect x=\"{x}\" y=\"{y}\" width=\"2\" height=\"12\" fill=\"#777777\"/>".into(),
            "broker connect".into(),
        ));
    }
    if held.iter().any(|n| *n > 0) {
        items.push((square(HELD_COLOUR), "held in quarantine (strip)".into()));
    }
    if gaps.iter().any(|n| *n > 0) {
        items.push((square(GAP_COLOUR), "upstream gap events (strip)".into()));
    }
    let mut lx = LEFT;
    let mut ly = HEIGHT - 32.0;
    s.push_str("<g class=\"legend\">");
    for (swatch, name) in items {
        let w = 17.0 + text_w(&name) + 14.0;
        if lx + w > WIDTH - RIGHT && lx > LEFT {
            lx = LEFT;
            ly += 20.0;
        }
        s.push_str(
            &swatch
                .replace("{x}", &format!("{lx:.1}"))
                .replace("{y}", &format!("{:.1}", ly - 10.0)),
        );
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{ly:.1}\">{}</text>",
            lx + 17.0,
            escape_html(&name)
        );
        lx += w;
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
                kind: MarkerKind::SessionLost,
                label: "session lost at mqtt://a:1883 (client id rg)".into(),
            },
        ];
        let svg = timeline(&tl, &markers, &Zone::utc());
        assert_eq!(count(&svg, "<g class=\"burst\">"), 2);
        assert_eq!(count(&svg, "<g class=\"session_lost\">"), 1);
        // Numbered as the list under the chart numbers them.
        assert!(
            svg.contains(">1. mqtt://b:1883: 300 duplicates absorbed</text>"),
            "{svg}"
        );
        assert!(svg.contains("text-anchor=\"middle\">3</text>"), "{svg}");
        assert!(svg.contains(">broker session lost</text>"));
        assert!(!svg.contains("<script>") && svg.contains("&lt;script&gt;"));
    }

    #[test]
    fn gaps_are_a_count_per_bar_in_their_own_strip_in_a_colour_no_bar_uses() {
        let mut tl = tl_with(&[(0, Outcome::Applied, 5000), (7, Outcome::Conflict, 1)]);
        // 19,999 gap events, all in the first bars: one rect per bar with any, not per gap.
        tl.gaps[0] = (19_000, 19_000);
        tl.gaps[1] = (999, 999);
        let svg = timeline(&tl, &[], &Zone::utc());
        let gaps = svg
            .split("<g class=\"strip gaps\"")
            .nth(1)
            .unwrap()
            .split("</g>")
            .next()
            .unwrap();
        assert_eq!(count(gaps, "<rect class=\"count\""), 2, "{gaps}");
        assert!(gaps.contains("data-max=\"19000\"") && gaps.contains("data-value=\"999\""));
        assert!(gaps.contains(&format!("fill=\"{GAP_COLOUR}\"")));
        assert!(PALETTE.iter().all(|(_, c)| *c != GAP_COLOUR) && GAP_COLOUR != HELD_COLOUR);
        // One conflict beside 5,000 applied still shows in the held strip.
        let held = svg.split("<g class=\"strip held\"").nth(1).unwrap();
        assert!(
            held.contains("data-bar=\"7\" data-value=\"1\"") && held.contains("height=\"22.00\""),
            "{held}"
        );
    }

    #[test]
    fn text_prints_at_8_pt_or_more_on_a4_and_axis_labels_stay_inside() {
        // A4 less 2 x 12 mm margins: 186 mm for the viewBox's width; 8 pt = 2.822 mm.
        // (FONT against WIDTH is checked at compile time, beside the constants.)
        let tl = tl_with(&[]);
        let svg = timeline(&tl, &[], &Zone::utc());
        assert!(!svg.contains("font:11px") && svg.contains("font:13px"));
        // The last tick (03:50 of an hour's bars ending at 03:52:30) sits near the right edge:
        // every tick label ends inside the viewBox.
        for tag in svg.split("<text class=\"tick\" ").skip(1) {
            let x: f64 = tag
                .split("x=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            let label = tag.split('>').nth(1).unwrap().split('<').next().unwrap();
            let w = text_w(label);
            let (lo, hi) = if tag.contains("text-anchor=\"end\"") {
                (x - w, x)
            } else if tag.contains("text-anchor=\"start\"") {
                (x, x + w)
            } else {
                (x - w / 2.0, x + w / 2.0)
            };
            assert!(lo >= 0.0 && hi <= WIDTH, "{label} at {x}: {lo}..{hi}");
        }
    }

    #[test]
    fn time_ticks_fall_on_round_times_of_the_zone() {
        let tl = tl_with(&[]);
        let svg = timeline(&tl, &[], &Zone::utc());
        // An hour's span: ticks every 10 minutes, the first labelled with its day.
        assert!(svg.contains(">03:00</text>"), "{svg}");
        assert!(svg.contains(">03:10</text>") && svg.contains(">03:50</text>"));
        assert!(
            svg.contains("time (UTC), from 2026-11-30") && svg.contains("no decisions in range")
        );
        let st_johns = Zone::parse("America/St_Johns").unwrap();
        let svg = timeline(&tl, &[], &st_johns);
        // The day changes at the zone's midnight: that label names it.
        assert!(
            svg.contains(">23:30</text>") && svg.contains(">11-30 00:00</text>"),
            "{svg}"
        );
        assert!(svg.contains("time (UTC-03:30), from 2026-11-29"));
    }

    #[test]
    fn tick_labels_never_overlap() {
        // 1.2 s of 10 ms bars: 200 ms ticks would put 12-character labels 119 units apart.
        for span in [1_200, 3_000, 60_000, 3_600_000, 7 * 86_400_000] {
            let step = tick_step_fitting(span, 698.0);
            let gap = 698.0 * step as f64 / span as f64;
            assert!(
                gap >= text_w("00:00:00.000") + 10.0 || step >= 1_000,
                "{span}: {step}"
            );
            assert!(gap >= text_w("11-30 00:00"), "{span}: {step} gives {gap}");
        }
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
