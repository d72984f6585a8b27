//! `report` on stores made by the real service across a real broker failover: its numbers
//! (read from the JSON twin and from the HTML's `id`/`data-*` attributes) equal `stats`,
//! `gaps` and `verify` over the same store; the page renders in a real headless Chromium (PNG
//! and PDF, A4 and Letter, no console error, one band per burst); a tampered store's report
//! says so at the top; hostile names are escaped; a PostgreSQL store reports like a file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use replay_guard::json::{Json, Pointer};

use super::broker::{Broker, free_port};
use super::common::{self, run};
use super::service::Consumer;

fn parse(bytes: &[u8]) -> Json {
    replay_guard::json::parse(bytes, 32)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(bytes)))
}

fn at<'a>(j: &'a Json, pointer: &str) -> &'a Json {
    j.pointer(&Pointer::parse(pointer).unwrap())
        .unwrap_or_else(|| panic!("no {pointer} in {}", j.to_compact()))
}

fn n(j: &Json, pointer: &str) -> u64 {
    match at(j, pointer) {
        Json::Number(s) => s.parse().unwrap(),
        other => panic!("{pointer}: {other:?}"),
    }
}

fn arr<'a>(j: &'a Json, pointer: &str) -> &'a [Json] {
    match at(j, pointer) {
        Json::Array(a) => a,
        other => panic!("{pointer}: {other:?}"),
    }
}

fn s<'a>(j: &'a Json, pointer: &str) -> &'a str {
    match at(j, pointer) {
        Json::String(s) => s,
        other => panic!("{pointer}: {other:?}"),
    }
}

fn ok(out: &Output, what: &str) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

const OUTCOMES: [&str; 9] = [
    "applied",
    "applied_late",
    "duplicate",
    "conflict",
    "stale",
    "malformed",
    "released",
    "discarded",
    "relay",
];

/// The HTML tags starting with `open` (e.g. `<li class="gap"`), each as its attribute text.
fn tags<'a>(html: &'a str, open: &str) -> Vec<&'a str> {
    html.match_indices(open)
        .map(|(i, _)| {
            let rest = &html[i..];
            &rest[..rest.find('>').unwrap()]
        })
        .collect()
}

/// The value of `name="…"` in a tag's text.
fn attr<'a>(tag: &'a str, name: &str) -> &'a str {
    let key = format!(" {name}=\"");
    let at = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {tag}"));
    let rest = &tag[at + key.len()..];
    &rest[..rest.find('"').unwrap()]
}

/// The `data-value` of the element with `id`.
fn id_value(html: &str, id: &str) -> u64 {
    let tag = tags(html, &format!("id=\"{id}\""));
    assert_eq!(tag.len(), 1, "id {id} appears {} times", tag.len());
    attr(tag[0], "data-value").parse().unwrap()
}

/// A store made by the real `run` across a real failover: 300 events delivered by broker A
/// and acknowledged, A killed, standby B restored from A's snapshot replays them (a burst of
/// 300 duplicates), then B carries a source with a gap (6..=8 never sent), a conflict, a
/// malformed delivery and more events. The malformed one is then discarded by an operator.
fn failover_store(dir: &Path) -> PathBuf {
    let events = |from: u64, to: u64| -> Vec<String> {
        (from..to)
            .map(|i| common::msg("CALFIRE", &format!("E{}", i % 4), 1, i / 4 + 1, "status"))
            .collect()
    };
    let mut a = Broker::start_with(&dir.join("a"), true, "log_type all\n");
    let b_port = free_port();
    let b_url = format!("mqtt://127.0.0.1:{b_port}");
    let mut c = Consumer::new(dir, &[a.url(), b_url], "v5", "rg-report");
    c.start();
    c.wait_subscribed();
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0));
    a.publish_lines("incidents/ca", &events(0, 300), "pub-a");
    a.snapshot();
    c.start();
    c.wait_decided(300, Duration::from_secs(30));
    a.wait_pubacks("rg-report", 300);
    let b = a.kill_and_restore_into(&dir.join("b"), b_port);
    c.wait_decided(600, Duration::from_secs(30));
    let mut more = events(300, 400);
    more.extend(
        (1..=5)
            .chain(9..=12)
            .map(|q| common::msg("CALFIRE", "GAP", 2, q, "pos")),
    );
    more.push(common::msg("CALFIRE", "E0", 1, 1, "tampered"));
    more.push("not json".into());
    b.publish_lines("incidents/ca", &more, "pub-b");
    c.wait_decided(600 + more.len() as u64, Duration::from_secs(30));
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    let db = c.db.clone();
    let dump = ok(
        &run(&["dump-quarantine", "--db", db.to_str().unwrap()]),
        "dump-quarantine",
    );
    let malformed = dump
        .lines()
        .map(|l| parse(l.as_bytes()))
        .find(|q| s(q, "/outcome") == "malformed")
        .expect("the malformed delivery is quarantined");
    ok(
        &run(&[
            "quarantine",
            "discard",
            "--db",
            db.to_str().unwrap(),
            &n(&malformed, "/id").to_string(),
            "--reason",
            "not a message <b>at all</b>",
            "--operator",
            "alice",
        ]),
        "quarantine discard",
    );
    db
}

fn report(db: &Path, format: &str, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "report",
        "--db",
        db.to_str().unwrap(),
        "--format",
        format,
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn a_report_of_a_real_failover_says_what_stats_gaps_and_verify_say() {
    let dir = tempfile::tempdir().unwrap();
    let db = failover_store(dir.path());
    let d = db.to_str().unwrap();
    let stats = parse(ok(&run(&["stats", "--db", d, "--format", "json"]), "stats").as_bytes());
    let gaps: Vec<Json> = ok(&run(&["gaps", "--db", d]), "gaps")
        .lines()
        .map(|l| parse(l.as_bytes()))
        .collect();
    let verify = ok(&run(&["verify", "--db", d]), "verify");
    assert!(verify.starts_with("verified "), "{verify}");

    let json_path = dir.path().join("r.json");
    ok(
        &report(&db, "json", &json_path, &[]),
        "report --format json",
    );
    let r = parse(&std::fs::read(&json_path).unwrap());
    let html_path = dir.path().join("r.html");
    ok(&report(&db, "html", &html_path, &[]), "report");
    let html = std::fs::read_to_string(&html_path).unwrap();

    assert_eq!(s(&r, "/schema"), "replay-guard.report.v1");
    assert_eq!(at(&r, "/verify/ok"), &Json::Bool(true));
    assert_eq!(
        attr(tags(&html, "<header id=\"verdict\"")[0], "data-verify"),
        "ok"
    );
    assert!(!html.contains("VERIFY FAILED"));
    assert_eq!(s(&r, "/chain_head").len(), 64);
    assert!(html.contains(s(&r, "/chain_head")));

    // Decisions per outcome: stats' totals, verify's counts, the JSON and the HTML agree.
    for o in OUTCOMES {
        let want = n(&stats, &format!("/decisions_total/{o}"));
        assert_eq!(n(&r, &format!("/counts/{o}")), want, "{o}");
        assert_eq!(n(&r, &format!("/verify/counts/{o}")), want, "{o}");
        assert_eq!(id_value(&html, &format!("count-{o}")), want, "{o}");
    }
    assert_eq!(n(&r, "/counts/duplicate"), 300);
    assert_eq!(n(&r, "/counts/conflict"), 1);
    assert_eq!(n(&r, "/counts/discarded"), 1);
    assert_eq!(n(&r, "/summary/genuine_applied"), 409);
    assert_eq!(id_value(&html, "genuine"), 409);
    assert_eq!(id_value(&html, "duplicates"), 300);
    assert_eq!(n(&r, "/summary/quarantine_open"), 1);
    assert_eq!(id_value(&html, "quarantine-open"), 1);
    assert!(
        s(&r, "/summary/words").starts_with(
            "409 genuine events applied once; 3 sequences missing in 1 gap across 1 source; 300 \
             deliveries suppressed as proven duplicates; 2 held in quarantine (1 still open)"
        ),
        "{}",
        s(&r, "/summary/words")
    );
    // Verified, but a gap: the banner is amber, not green, and says why on the first screen.
    assert_eq!(s(&r, "/verify/verdict"), "missing");
    let header = tags(&html, "<header id=\"verdict\"")[0];
    assert_eq!(attr(header, "data-verdict"), "missing");
    assert!(html.contains(
        "<div class=\"banner missing\" id=\"verify-ok\"><strong>Verified, but sequences are \
         missing upstream</strong>: 3 sequences missing in 1 gap across 1 source."
    ));
    assert_eq!(
        (
            n(&r, "/summary/missing_sequences"),
            n(&r, "/summary/gaps"),
            n(&r, "/summary/sources_with_gaps")
        ),
        (3, 1, 1)
    );
    // What `run` recorded upstream: the gap it confirmed, in the verdict.
    assert!(html.contains("<p id=\"upstream\""), "{html}");
    assert_eq!(
        n(&r, "/upstream_losses/gap_events"),
        n(&stats, "/upstream_losses/gap_events"),
        "{:?}",
        at(&stats, "/upstream_losses")
    );

    // Gaps: exactly `gaps`' rows, in the JSON per source and in the HTML's gap items.
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    let mut from_json = Vec::new();
    for src in arr(&r, "/sources") {
        for g in arr(src, "/gaps") {
            from_json.push((
                s(src, "/agency").to_string(),
                s(src, "/source_id").to_string(),
                n(g, "/epoch"),
                n(g, "/lowest"),
                n(g, "/highest"),
                n(g, "/missing_from"),
                n(g, "/missing_to"),
            ));
        }
    }
    let from_gaps: Vec<_> = gaps
        .iter()
        .map(|g| {
            (
                s(g, "/agency").to_string(),
                s(g, "/source_id").to_string(),
                n(g, "/epoch"),
                n(g, "/lowest"),
                n(g, "/highest"),
                n(g, "/missing_from"),
                n(g, "/missing_to"),
            )
        })
        .collect();
    assert_eq!(from_json, from_gaps);
    let gap_items = tags(&html, "<li class=\"gap\"");
    assert_eq!(gap_items.len(), 1);
    assert_eq!(
        (
            attr(gap_items[0], "data-epoch"),
            attr(gap_items[0], "data-from"),
            attr(gap_items[0], "data-to")
        ),
        ("2", "6", "8")
    );
    // The sources with something open (E0's conflict) or missing (GAP) are listed first,
    // marked; the unparseable row last.
    let rows = tags(&html, "<tr class=\"source");
    assert_eq!(rows.len(), 6);
    assert_eq!(attr(rows[0], "data-source"), "CALFIRE/E0");
    assert_eq!(attr(rows[1], "data-source"), "CALFIRE/GAP");
    assert!(
        rows[..2]
            .iter()
            .all(|r| r.starts_with("<tr class=\"source attention\""))
    );
    assert!(rows[2..].iter().all(|r| !r.contains("attention")));
    assert_eq!(attr(rows[1], "data-missing"), "3");
    assert_eq!(attr(rows[rows.len() - 1], "data-source"), "(unparseable)");
    assert_eq!(attr(rows[rows.len() - 1], "data-malformed"), "1");
    // E0 holds the open conflict.
    let e0 = rows
        .iter()
        .find(|t| attr(t, "data-source") == "CALFIRE/E0")
        .unwrap();
    assert_eq!(
        (
            attr(e0, "data-applied"),
            attr(e0, "data-duplicate"),
            attr(e0, "data-conflict"),
            attr(e0, "data-open")
        ),
        ("100", "75", "1", "1")
    );
    // The high-water marks are stats' marks.
    for mark in arr(&stats, "/sources") {
        let name = format!("{}/{}", s(mark, "/agency"), s(mark, "/source_id"));
        let src = arr(&r, "/sources")
            .iter()
            .find(|x| s(x, "/name") == name)
            .unwrap();
        assert_eq!(
            (n(src, "/high_water/epoch"), n(src, "/high_water/sequence")),
            (
                n(mark, "/high_water_epoch"),
                n(mark, "/high_water_sequence")
            )
        );
    }
    // The upstream gap is counted in its bar: one gap event leaving 3 missing, one mark in
    // the gaps strip.
    let (events, missing) = arr(&r, "/timeline/bars").iter().fold((0, 0), |(e, m), b| {
        (e + n(b, "/gap_events"), m + n(b, "/missing"))
    });
    assert_eq!((events, missing), (1, 3));
    let strip = html.split("<g class=\"strip gaps\"").nth(1).unwrap();
    let strip = &strip[..strip.find("</g>").unwrap()];
    assert_eq!(tags(strip, "<rect class=\"count\"").len(), 1);
    assert_eq!(id_value(&html, "gap-events"), 1);
    // The strips' scales are printed, not only attributes: one gap event, one held delivery
    // at most per bar (the conflict and the malformed delivery arrive apart or together).
    let scales = &html[html
        .find("<p class=\"muted\" id=\"strip-scales\">")
        .unwrap()..];
    assert!(
        scales.contains("gaps: full height 1 per bar (at "),
        "{}",
        &scales[..300]
    );
    assert!(scales.contains("held: full height "), "{}", &scales[..300]);

    // The burst: one band per recorded burst, labelled; three proofs from inside it.
    let bursts = arr(&stats, "/replay_bursts");
    assert_eq!(bursts.len(), 1);
    assert_eq!(tags(&html, "<g class=\"burst\"").len(), bursts.len());
    assert!(html.contains(&format!(
        "{}: 300 duplicates absorbed",
        s(&bursts[0], "/broker")
    )));
    // Every connect is a tick of its own: A twice (the first start and the restart), then
    // the switch to B, which the burst's band also covers.
    let connects: Vec<String> = arr(&r, "/timeline/markers")
        .iter()
        .filter(|m| s(m, "/kind") == "connect")
        .map(|m| s(m, "/label").to_string())
        .collect();
    assert_eq!(connects.len(), 3, "{connects:?}");
    assert!(
        connects[2].starts_with(&format!("connected to {} ", s(&bursts[0], "/broker"))),
        "{connects:?}"
    );
    assert_eq!(tags(&html, "<g class=\"connect\"").len(), 3);
    let proofs = arr(&r, "/proofs");
    assert_eq!(proofs.len(), 1);
    assert_eq!(s(&proofs[0], "/broker"), s(&bursts[0], "/broker"));
    assert_eq!(n(&proofs[0], "/duplicates"), 300);
    let samples = arr(&proofs[0], "/samples");
    assert_eq!(samples.len(), 3);
    for p in samples {
        // Each proof names the effect it matched and the entry that applied it, and
        // `explain` of its key tells the same.
        let key = s(p, "/key");
        let offset = n(p, "/effect_offset");
        assert_eq!(s(p, "/applied_by/outcome"), "applied");
        assert!(
            s(p, "/story").contains(&format!("as effect #{offset}")),
            "{p:?}"
        );
        let story = parse(
            ok(
                &run(&["explain", "--db", d, key, "--format", "json"]),
                "explain",
            )
            .as_bytes(),
        );
        let audit = arr(&story, "/audit");
        assert_eq!(n(&audit[0], "/index"), n(p, "/applied_by/index"));
        assert!(audit.iter().any(|e| n(e, "/index") == n(p, "/index")));
        assert_eq!(n(&arr(&story, "/effects")[0], "/offset"), offset);
        assert!(html.contains(key));
    }
    // Quarantine: the open conflict, the operator's discard with who and why (escaped).
    assert_eq!(tags(&html, "<tr class=\"open\"").len(), 1);
    let res = arr(&r, "/quarantine/resolutions/listed");
    assert_eq!(res.len(), 1);
    assert_eq!(s(&res[0], "/operator"), "alice");
    assert_eq!(s(&res[0], "/why"), "not a message <b>at all</b>");
    assert!(html.contains("not a message &lt;b&gt;at all&lt;/b&gt;"));
    assert!(!html.contains("<b>at all"));
    // The timeline's interval is round and gives at most 200 bars.
    let bars = arr(&r, "/timeline/bars").len();
    assert!((1..=200).contains(&bars), "{bars}");
    let total: u64 = arr(&r, "/timeline/bars")
        .iter()
        .map(|b| n(b, "/counts/total"))
        .sum();
    assert_eq!(total, n(&r, "/counts/total"));
    // Check it yourself: every count the commands claim is what they print.
    check_counts(&r);
    // Without a range or pruning, `stats` and `gaps` cover what the report covers.
    assert!(
        arr(&r, "/commands")
            .iter()
            .any(|c| s(c, "/command") == format!("replay-guard stats --db {d} --format json"))
    );
    let commands = arr(&r, "/commands");
    assert!(
        commands
            .iter()
            .any(|c| s(c, "/command") == format!("replay-guard verify --db {d}"))
    );
    assert!(
        commands
            .iter()
            .any(|c| s(c, "/command").starts_with(&format!("replay-guard explain --db {d} ")))
    );

    // A range and a source narrow the counts to what `dump-audit` selects.
    let since = s(&r, "/range/first_entry_at").to_string();
    let out = dir.path().join("e1.json");
    ok(
        &report(
            &db,
            "json",
            &out,
            &["--since", &since, "--source", "CALFIRE/E1"],
        ),
        "report --source",
    );
    let narrowed = parse(&std::fs::read(&out).unwrap());
    let dumped = ok(
        &run(&[
            "dump-audit",
            "--db",
            d,
            "--since",
            &since,
            "--source",
            "CALFIRE/E1",
        ]),
        "dump-audit",
    );
    assert_eq!(n(&narrowed, "/counts/total"), dumped.lines().count() as u64);
    assert_eq!(arr(&narrowed, "/sources").len(), 1);
    assert_eq!(n(&narrowed, "/counts/malformed"), 0);
    check_counts(&narrowed);

    // Several sources and a range: one dump-audit per source (it takes one), numbers that
    // add up, no claim that `stats` matches, and `gaps` said to cover the whole log.
    let out = dir.path().join("two.json");
    ok(
        &report(
            &db,
            "json",
            &out,
            &[
                "--since",
                &since,
                "--source",
                "CALFIRE/E0",
                "--source",
                "CALFIRE/GAP",
            ],
        ),
        "report --source --source",
    );
    let two = parse(&std::fs::read(&out).unwrap());
    let commands = arr(&two, "/commands");
    for c in commands {
        let cmd = s(c, "/command");
        assert!(cmd.matches("--source").count() <= 1, "{cmd}");
        assert!(!cmd.starts_with("replay-guard stats"), "{cmd}");
        if cmd.starts_with("replay-guard gaps") {
            assert!(s(c, "/what").contains("whole retained log"), "{c:?}");
        }
    }
    let applied: Vec<&str> = commands
        .iter()
        .map(|c| s(c, "/command"))
        .filter(|c| c.contains("--outcome applied "))
        .collect();
    assert_eq!(applied.len(), 2, "{applied:?}");
    assert_eq!(check_counts(&two), n(&two, "/counts/total"));
}

/// Runs each "… | wc -l" command of a report's "check it yourself" and compares what it
/// prints with the count its description claims; the sum of the counts checked.
fn check_counts(r: &Json) -> u64 {
    let mut sum = 0;
    let mut checked = 0;
    for c in arr(r, "/commands") {
        let (what, cmd) = (s(c, "/what"), s(c, "/command"));
        let Some(rest) = cmd.strip_suffix(" | wc -l") else {
            continue;
        };
        let claimed: u64 = what
            .strip_prefix("the ")
            .and_then(|w| w.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {what:?}"));
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{} | wc -l",
                rest.replacen("replay-guard", common::bin().to_str().unwrap(), 1)
            ))
            .output()
            .unwrap();
        let printed: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert_eq!(printed, claimed, "{what}: {cmd}");
        sum += printed;
        checked += 1;
    }
    assert!(checked > 0, "no count to check in {:?}", at(r, "/commands"));
    sum
}

/// Runs chromium headless with `args` and `url`, its profile in `dir`; its stderr.
fn chromium(dir: &Path, args: &[&str], url: &str) -> String {
    let out = Command::new("timeout")
        .arg("120")
        .arg("chromium")
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.join("chromium").display()
        ))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium (scripts/test.sh installs it: apt-get install chromium)");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "chromium: {stderr}");
    stderr
}

/// `pdfinfo`'s (pages, page size line) of a PDF.
fn pdfinfo(pdf: &Path) -> (u64, String) {
    let out = Command::new("pdfinfo")
        .arg(pdf)
        .output()
        .expect("run pdfinfo (scripts/test.sh installs it: apt-get install poppler-utils)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("pdfinfo has no {name}: {text}"))
    };
    (field("Pages:").parse().unwrap(), field("Page size:"))
}

#[test]
fn the_report_renders_in_a_real_chromium_to_png_and_to_pdf_on_a4_and_letter() {
    let dir = tempfile::tempdir().unwrap();
    let db = failover_store(dir.path());
    let html_path = dir.path().join("report.html");
    ok(
        &report(&db, "html", &html_path, &["--tz", "America/St_Johns"]),
        "report",
    );
    let html = std::fs::read_to_string(&html_path).unwrap();
    // Self-contained: nothing is loaded from elsewhere, nothing runs.
    for banned in [
        "<script", " src=", " href=", "url(", "@import", "<link", "<img",
    ] {
        assert!(!html.contains(banned), "the page holds {banned}");
    }
    let bursts = tags(&html, "<g class=\"burst\"").len();
    assert_eq!(bursts, 1);

    let png = dir.path().join("report.png");
    let log = chromium(
        dir.path(),
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1280,2400",
        ],
        &format!("file://{}", html_path.display()),
    );
    for bad in ["ERROR:CONSOLE", "Uncaught", "Refused to load"] {
        assert!(!log.contains(bad), "chromium logged {bad}: {log}");
    }
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) = (
        u32::from_be_bytes(bytes[16..20].try_into().unwrap()),
        u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1280, 2400));
    // A blank page compresses to a few KB; text, tables and a chart do not.
    assert!(bytes.len() > 60_000, "PNG of {} bytes", bytes.len());

    // Letter, chromium's default paper: the verdict and the six sections, each on its page.
    let letter = dir.path().join("letter.pdf");
    chromium(
        dir.path(),
        &[
            &format!("--print-to-pdf={}", letter.display()),
            "--no-pdf-header-footer",
        ],
        &format!("file://{}", html_path.display()),
    );
    let (pages, size) = pdfinfo(&letter);
    assert_eq!(pages, 7, "{size}");
    assert!(size.contains("(letter)"), "{size}");
    // A4: the same page with the paper size set as a print dialog would.
    let a4_html = dir.path().join("report-a4.html");
    std::fs::write(
        &a4_html,
        html.replacen("</head>", "<style>@page{size:A4}</style></head>", 1),
    )
    .unwrap();
    let a4 = dir.path().join("a4.pdf");
    chromium(
        dir.path(),
        &[
            &format!("--print-to-pdf={}", a4.display()),
            "--no-pdf-header-footer",
        ],
        &format!("file://{}", a4_html.display()),
    );
    let (pages, size) = pdfinfo(&a4);
    assert_eq!(pages, 7, "{size}");
    assert!(size.contains("(A4)"), "{size}");
}

fn honest_db(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let db = dir.join("honest.redb");
    let feed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/feed.jsonl");
    for _ in 0..2 {
        ok(
            &run(&[
                "ingest",
                "--db",
                db.to_str().unwrap(),
                feed.to_str().unwrap(),
            ]),
            "ingest",
        );
    }
    db
}

#[test]
fn a_report_over_a_tampered_store_says_so_at_the_top_and_exits_4() {
    use redb::{Builder, ConcurrencyMode};
    use replay_guard::store::tables::AUDIT;
    let dir = tempfile::tempdir().unwrap();
    let db = honest_db(dir.path());
    // An audit entry's reason edited in place: its hash no longer holds.
    let file = Builder::new()
        .set_concurrency_mode(ConcurrencyMode::SingleWriter)
        .open(&db)
        .unwrap();
    let txn = file.begin_write().unwrap();
    {
        // Read from the table: the entry may leave its prev_hash to the one before it.
        let mut rec = AUDIT.open_mut(&txn).unwrap().get(3).unwrap().unwrap();
        rec.reason = "nothing to see here".into();
        AUDIT
            .open_mut(&txn)
            .unwrap()
            .put(3, &rec, &mut Vec::new())
            .unwrap();
    }
    txn.commit().unwrap();
    drop(file);

    let html_path = dir.path().join("r.html");
    let out = report(&db, "html", &html_path, &[]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("verification failed"), "{stderr}");
    let html = std::fs::read_to_string(&html_path).unwrap();
    let body = &html[html.find("<body>").unwrap() + "<body>".len()..];
    let first = body.trim_start();
    assert!(
        first.starts_with("<header id=\"verdict\" data-verify=\"failed\" data-verdict=\"failed\"><div class=\"banner failed\" id=\"verify-failed\""),
        "{}",
        &first[..200.min(first.len())]
    );
    assert!(first.contains("VERIFY FAILED"));
    assert!(
        first.contains("audit entry 3: its hash does not match its content"),
        "the banner names the entry: {}",
        &first[..400.min(first.len())]
    );
    let json_path = dir.path().join("r.json");
    assert_eq!(report(&db, "json", &json_path, &[]).status.code(), Some(4));
    let r = parse(&std::fs::read(&json_path).unwrap());
    assert_eq!(at(&r, "/verify/ok"), &Json::Bool(false));
    assert!(s(&r, "/verify/violation").contains("audit entry 3"));
    // The honest copy's report passes.
    let honest = honest_db(&dir.path().join("again"));
    assert_eq!(
        report(&honest, "json", &json_path, &[]).status.code(),
        Some(0)
    );
}

#[test]
fn hostile_names_are_escaped_in_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.redb");
    let feed = [
        common::msg("<script>alert(1)</script>", "E\\u001b[31m", 0, 1, "x"),
        common::msg("<script>alert(1)</script>", "E\\u001b[31m", 0, 5, "x"),
        common::msg("<script>alert(1)</script>", "E\\u001b[31m", 0, 5, "y"),
    ]
    .join("\n");
    ok(
        &common::run_with_stdin(
            &[
                "ingest",
                "--db",
                db.to_str().unwrap(),
                "--topic",
                "t\"><img src=x>",
                "-",
            ],
            feed.as_bytes(),
        ),
        "ingest",
    );
    let out = dir.path().join("r.html");
    ok(&report(&db, "html", &out, &[]), "report");
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(!html.contains("<script"), "a script tag got through");
    assert!(!html.contains("<img"), "an img tag got through");
    assert!(
        !html.chars().any(|c| c == '\u{1b}'),
        "a raw escape got through"
    );
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;/E\\u001b[31m"));
}

#[test]
fn a_report_over_a_postgres_store_matches_its_stats() {
    let pg = super::pg::PgDb::new("report");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pg.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"postgres\"\ndsn = \"{}\"\nschema = \"rg\"\n",
            pg.dsn()
        ),
    )
    .unwrap();
    let c = config.to_str().unwrap();
    let feed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/feed.jsonl");
    for _ in 0..2 {
        ok(
            &run(&["ingest", "--config", c, feed.to_str().unwrap()]),
            "ingest",
        );
    }
    let stats = parse(ok(&run(&["stats", "--config", c, "--format", "json"]), "stats").as_bytes());
    let out = ok(
        &run(&["report", "--config", c, "--format", "json", "-o", "-"]),
        "report",
    );
    let r = parse(out.as_bytes());
    assert_eq!(s(&r, "/store/backend"), "postgres");
    assert_eq!(at(&r, "/verify/ok"), &Json::Bool(true));
    for o in OUTCOMES {
        assert_eq!(
            n(&r, &format!("/counts/{o}")),
            n(&stats, &format!("/decisions_total/{o}")),
            "{o}"
        );
    }
    assert!(
        arr(&r, "/commands")
            .iter()
            .any(|x| s(x, "/command") == format!("replay-guard verify --config {c}"))
    );
}

#[test]
fn an_empty_range_or_a_zoneless_time_is_a_one_line_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = honest_db(dir.path());
    let out = dir.path().join("r.html");
    for (extra, says) in [
        (
            &[
                "--since",
                "2026-12-03T00:00:00Z",
                "--until",
                "2026-12-02T00:00:00Z",
            ][..],
            "--since must be before --until",
        ),
        (&["--since", "2026-12-02T10:00"], "missing time zone"),
        (&["--tz", "Mars/Olympus_Mons"], "Mars/Olympus_Mons"),
    ] {
        let o = report(&db, "html", &out, extra);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(!out.exists(), "{extra:?} wrote a report");
    }
}

#[test]
fn the_delivery_section_is_relay_status_with_the_operators_actions() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.redb");
    let config = dir.path().join("rg.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\npath = {:?}\n[[sink]]\nname = \"cop\"\nkind = \"exec\"\n\
             command = [\"/bin/true\"]\n",
            db.to_str().unwrap()
        ),
    )
    .unwrap();
    let c = config.to_str().unwrap();
    let feed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/feed.jsonl");
    // The writer makes the cursor of each sink its config names: nothing delivered yet.
    ok(
        &run(&["ingest", "--config", c, feed.to_str().unwrap()]),
        "ingest",
    );
    ok(
        &run(&[
            "relay",
            "skip",
            "--config",
            c,
            "--sink",
            "cop",
            "--to",
            "3",
            "--reason",
            "replayed <export>",
            "--operator",
            "ana",
            "--yes",
        ]),
        "relay skip",
    );
    let status = parse(
        ok(
            &run(&["relay", "status", "--config", c, "--format", "json"]),
            "relay status",
        )
        .as_bytes(),
    );
    let r = parse(
        ok(
            &run(&["report", "--config", c, "--format", "json", "-o", "-"]),
            "report",
        )
        .as_bytes(),
    );
    let want = &arr(&status, "/sinks")[0];
    let got = &arr(&r, "/delivery/sinks")[0];
    for field in ["/sink", "/state", "/kind"] {
        assert_eq!(s(got, field), s(want, field), "{field}");
    }
    for field in ["/cursor", "/head", "/lag_events", "/parked", "/delivered"] {
        assert_eq!(n(got, field), n(want, field), "{field}");
    }
    assert_eq!(n(got, "/cursor"), 3);
    let actions = arr(&r, "/delivery/actions/listed");
    assert_eq!(actions.len(), 1);
    assert_eq!(s(&actions[0], "/sink"), "cop");
    assert!(s(&actions[0], "/reason").contains("ana"), "{actions:?}");
    assert_eq!(n(&r, "/counts/relay"), 1);
    // verify's accounting of the sink: the three offsets passed over by the audited skip.
    assert_eq!(n(&r, "/verify/sinks/0/skipped"), 3);
    let lag = n(want, "/lag_events");
    assert!(s(&r, "/summary/words").ends_with(&format!(
        "sinks: cop: {} delivered, {lag} effects behind ({} s).",
        n(got, "/delivered"),
        n(got, "/lag_seconds")
    )));

    let html = ok(&run(&["report", "--config", c, "-o", "-"]), "report");
    let row = tags(&html, "<tr class=\"sink\"");
    assert_eq!(row.len(), 1);
    assert_eq!(attr(row[0], "data-sink"), "cop");
    assert_eq!(attr(row[0], "data-lag"), lag.to_string());
    assert_eq!(attr(row[0], "data-stream"), "effects");
    assert_eq!(n(&r, "/verify/sinks/0/not_selected"), 0);
    assert_eq!(s(&r, "/verify/sinks/0/stream"), "effects");
    assert_eq!(tags(&html, "<tr class=\"relay-action\"").len(), 1);
    assert!(html.contains("replayed &lt;export&gt;"));
    assert!(
        html.contains("sink cop: every offset from 0 to its cursor 3 accounted for"),
        "{html}"
    );
}

/// `ingest` of `feed` into `db` under the config `cfg`.
fn ingest(cfg: &Path, db: &Path, feed: &str) {
    ok(
        &common::run_with_stdin(
            &[
                "ingest",
                "--config",
                cfg.to_str().unwrap(),
                "--db",
                db.to_str().unwrap(),
                "-",
            ],
            feed.as_bytes(),
        ),
        "ingest",
    );
}

#[test]
fn open_records_keep_their_source_after_retention_and_show_from_before_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ret.redb");
    let cfg = dir.path().join("rg.toml");
    std::fs::write(&cfg, "[retention]\naudit_max_entries = 10\n").unwrap();
    // A conflict of CALFIRE/E7 held open, then enough of CHP/X for retention to prune the
    // conflict's audit entry.
    let mut feed = vec![
        common::msg("CALFIRE", "E7", 1, 1, "a"),
        common::msg("CALFIRE", "E7", 1, 1, "b"),
    ];
    feed.extend((1..=40).map(|q| common::msg("CHP", "X", 1, q, "x")));
    ingest(&cfg, &db, &feed.join("\n"));
    let d = db.to_str().unwrap();
    ingest(
        &cfg,
        &db,
        &(41..=45)
            .map(|q| common::msg("CHP", "X", 1, q, "x"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    let anchor = n(
        &parse(ok(&run(&["stats", "--db", d, "--format", "json"]), "stats").as_bytes()),
        "/audit/anchor/index",
    );
    assert!(anchor >= 1, "retention pruned the conflict's entry");
    // The range starts at the second ingest's first entry: a process started after the first
    // ingest ended, so strictly later than the conflict (the first ingest's messages may all
    // share one millisecond).
    let since = ok(
        &run(&["dump-audit", "--db", d, "--format", "jsonl"]),
        "dump-audit",
    )
    .lines()
    .map(|l| parse(l.as_bytes()))
    .find(|e| s(e, "/source_id") == "X" && n(e, "/sequence") == 41)
    .map(|e| s(&e, "/recorded_at").to_string())
    .expect("the second ingest's first entry is kept");

    // Whole log, only CALFIRE/E7: its open conflict is found by its own payload.
    let out = dir.path().join("e7.json");
    ok(
        &report(&db, "json", &out, &["--source", "CALFIRE/E7"]),
        "report --source",
    );
    let r = parse(&std::fs::read(&out).unwrap());
    let open = arr(&r, "/quarantine/open/listed");
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(
        (s(&open[0], "/agency"), s(&open[0], "/source_id")),
        ("CALFIRE", "E7")
    );
    assert_eq!(n(&r, "/pruned_entries"), anchor + 1);
    // `dump-quarantine --source`, the page's own check, finds it the same way.
    let listed = ok(
        &run(&[
            "dump-quarantine",
            "--db",
            d,
            "--source",
            "CALFIRE/E7",
            "--format",
            "jsonl",
        ]),
        "dump-quarantine --source",
    );
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert_eq!(s(&parse(listed.as_bytes()), "/outcome"), "conflict");
    let html_path = dir.path().join("all.html");
    ok(&report(&db, "html", &html_path, &[]), "report");
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(!html.contains("(unparseable)"), "{html}");
    assert_eq!(id_value(&html, "pruned"), anchor + 1);

    // A range starting after the conflict: it is still open, listed, marked as older.
    let out = dir.path().join("ranged.html");
    ok(
        &report(&db, "html", &out, &["--since", &since]),
        "report --since",
    );
    let html = std::fs::read_to_string(&out).unwrap();
    let rows = tags(&html, "<tr class=\"open");
    assert_eq!(rows.len(), 1, "{html}");
    assert_eq!(attr(rows[0], "data-when"), "before_range");
    assert!(rows[0].contains("before-range"));
    assert!(html.contains("(before the range)"));
    assert_eq!(id_value(&html, "quarantine-open"), 1);
}

#[test]
fn a_feed_missing_every_other_sequence_is_amber_with_capped_gaps_and_counts_per_bar() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("odd.redb");
    let cfg = dir.path().join("rg.toml");
    std::fs::write(&cfg, "").unwrap();
    let feed: Vec<String> = (0..2_000)
        .map(|i| common::msg("CHP", "ODD", 0, 2 * i + 1, "x"))
        .collect();
    ingest(&cfg, &db, &feed.join("\n"));
    let json_path = dir.path().join("odd.json");
    ok(
        &report(&db, "json", &json_path, &[]),
        "report --format json",
    );
    let r = parse(&std::fs::read(&json_path).unwrap());
    assert_eq!(s(&r, "/verify/verdict"), "missing");
    assert!(
        s(&r, "/summary/words").contains(
            "2000 genuine events applied once; 1999 sequences missing in 1999 gaps across 1 source"
        ),
        "{}",
        s(&r, "/summary/words")
    );
    let src = &arr(&r, "/sources")[0];
    assert_eq!(arr(src, "/gaps").len(), 20);
    assert_eq!(n(src, "/gaps_total"), 1999);
    assert_eq!(n(src, "/gaps_left_off"), 1979);
    assert_eq!(n(src, "/missing"), 1999);
    // Gap events per bar add up to every jump, across the whole range (not the first 1,000).
    let bars = arr(&r, "/timeline/bars");
    let events: u64 = bars.iter().map(|b| n(b, "/gap_events")).sum();
    assert_eq!(events, 1999);

    let html_path = dir.path().join("odd.html");
    ok(&report(&db, "html", &html_path, &[]), "report");
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.len() < 200_000, "{} bytes", html.len());
    assert!(html.contains("class=\"banner missing\""));
    assert_eq!(tags(&html, "<li class=\"gap\"").len(), 20);
    assert!(html.contains("… 1979 more"));
    assert!(html.contains("<code>replay-guard gaps --source CHP/ODD</code>"));
    let strip = html.split("<g class=\"strip gaps\"").nth(1).unwrap();
    let strip = &strip[..strip.find("</g>").unwrap()];
    let marks = tags(strip, "<rect class=\"count\"");
    assert!(!marks.is_empty() && marks.len() <= bars.len());
    let drawn: u64 = marks
        .iter()
        .map(|t| attr(t, "data-value").parse::<u64>().unwrap())
        .sum();
    assert_eq!(drawn, 1999);
}

#[test]
fn a_lost_broker_session_and_runs_confirmed_gap_are_in_the_verdict_and_on_the_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let bdir = dir.path().join("b");
    let mut broker = Broker::start(&bdir, false);
    let port_b = broker.port;
    let c = Consumer::new(dir.path(), &[broker.url()], "v5", "rg-report-lost");
    let mut config = std::fs::read_to_string(&c.config).unwrap();
    config += "[feed]\ngap_grace_ms = 200\n";
    std::fs::write(&c.config, config).unwrap();
    let mut c = c;
    let seqs = |q: &[u64]| -> Vec<String> {
        q.iter()
            .map(|q| common::msg("fire", "engine-7", 3, *q, "x"))
            .collect()
    };
    c.start();
    c.wait_subscribed();
    broker.publish_lines("incidents/fire", &seqs(&[1, 2, 3]), "pub-lost");
    c.wait_applied(3, Duration::from_secs(30));
    // The broker restarts without persistence: `run`'s session is gone.
    let mark = c.log_text().len();
    broker.stop();
    let broker = Broker::start_on(&bdir, port_b, false);
    c.wait_log("broker session lost", Duration::from_secs(30));
    common::wait_subscribed(c.log_path(), mark, "");
    // 4 and 5 never come.
    broker.publish_lines("incidents/fire", &seqs(&[6, 7]), "pub-lost");
    c.wait_applied(5, Duration::from_secs(30));
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());

    let json_path = dir.path().join("r.json");
    ok(
        &report(&c.db, "json", &json_path, &[]),
        "report --format json",
    );
    let r = parse(&std::fs::read(&json_path).unwrap());
    assert_eq!(n(&r, "/upstream_losses/sessions_lost"), 1);
    assert_eq!(n(&r, "/upstream_losses/sessions_lost_in_range"), 1);
    assert_eq!(n(&r, "/upstream_losses/gap_events"), 1);
    assert_eq!(n(&r, "/upstream_losses/missing_sequences"), 2);
    let lost: Vec<_> = arr(&r, "/timeline/markers")
        .iter()
        .filter(|m| s(m, "/kind") == "session_lost")
        .collect();
    assert_eq!(lost.len(), 1);
    assert!(
        s(lost[0], "/label").starts_with(&format!("session lost at {}", broker.url())),
        "{lost:?}"
    );

    let html_path = dir.path().join("r.html");
    ok(&report(&c.db, "html", &html_path, &[]), "report");
    let html = std::fs::read_to_string(&html_path).unwrap();
    let upstream = tags(&html, "<p id=\"upstream\"")[0];
    assert_eq!(attr(upstream, "data-sessions-lost"), "1");
    assert!(
        html.contains(
            "1 gap confirmed by run (2 sequences), 1 broker session lost, since the store was \
             made; 1 broker session lost in range, marked on the timeline"
        ),
        "{html}"
    );
    assert_eq!(tags(&html, "<g class=\"session_lost\"").len(), 1);
    let items = tags(&html, "<li class=\"marker\" data-kind=\"session_lost\"");
    assert_eq!(items.len(), 1);
    assert!(html.contains(&format!(
        ": session lost at {} (client id rg-report-lost)",
        broker.url()
    )));
    // The report's own gap: 4..5 missing, amber; the banner names the lost session first.
    assert_eq!(s(&r, "/verify/verdict"), "missing");
    assert!(
        html.contains(
            "Verified, but a broker lost replay-guard's session</strong> (1 time in range)"
        ),
        "{html}"
    );
    // The first connect (a new session, nothing consumed yet) is a broker connect of its own;
    // the reconnect that found the session gone is the session-lost tick, not a second one.
    let connects: Vec<_> = arr(&r, "/timeline/markers")
        .iter()
        .filter(|m| s(m, "/kind") == "connect")
        .collect();
    assert_eq!(connects.len(), 1, "{connects:?}");
    assert_eq!(
        s(connects[0], "/label"),
        format!(
            "connected to {} (client id rg-report-lost; new session)",
            broker.url()
        )
    );
    assert_eq!(tags(&html, "<g class=\"connect\"").len(), 1);
}
