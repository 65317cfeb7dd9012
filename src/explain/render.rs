//! The terminal table of an `Explanation`: one line per request, then the
//! totals, the sink's line and the notes. Pure formatting.

use std::fmt::Write;

use super::{Explanation, Routed};
use crate::time::utc::format_utc_ms;

fn opt(v: Option<i64>) -> String {
    v.map_or("-".into(), |w| w.to_string())
}

pub(super) fn table(x: &Explanation) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "tenant {} windows [{}, {})",
        x.tenant_id,
        format_utc_ms(x.window_start),
        format_utc_ms(x.window_end)
    );
    for p in &x.partitions {
        let from = match &p.checkpoint {
            Some(c) => format!(" from checkpoint {}", c.name),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "  replayed partition {} offsets {}..{}{from} (log {}..{}; watermark {}, {})",
            p.partition,
            p.from_offset,
            p.to_offset,
            p.log_start,
            p.log_end,
            opt(p.watermark),
            if p.final_here { "final" } else { "not final" }
        );
    }
    let multi = multi(x);
    billed(&mut s, x, multi);
    elsewhere(&mut s, x, multi);
    totals(&mut s, x);
    s
}

/// The window a row belongs to, when the rows are of more than one (`multi`).
fn window_of(multi: bool, end: i64) -> String {
    if multi {
        format!(" (window ending {})", format_utc_ms(end))
    } else {
        String::new()
    }
}

/// Whether the rows belong to more than one window.
fn multi(x: &Explanation) -> bool {
    let ends = x.billed.iter().map(|b| b.window_end);
    ends.chain(x.elsewhere.iter().map(|e| e.window_end))
        .any(|e| e != x.window_end)
}

fn billed(s: &mut String, x: &Explanation, multi: bool) {
    let _ = writeln!(s, "\nBILLED INTO THE WINDOW ({})", x.billed.len());
    let _ = writeln!(
        s,
        "{:<28} {:>9} {:>8} {:<16} {:>8} {:>8} {:<14} {:>22} {:<7}",
        "REQUEST",
        "PARTITION",
        "OFFSET",
        "MODEL",
        "PROMPT",
        "COMPL",
        "PRICE/PLAN",
        "COST_PICO",
        "PANE"
    );
    for b in &x.billed {
        let price = match (&b.plan, b.price_effective_from) {
            (Some(plan), _) => format!("plan {plan}"),
            (None, Some(f)) => format!("from {f}"),
            (None, None) => "-".into(),
        };
        let _ = writeln!(
            s,
            "{:<28} {:>9} {:>8} {:<16} {:>8} {:>8} {:<14} {:>22} {:<7}{}",
            b.request_id,
            b.partition,
            b.offset,
            b.model,
            b.prompt_tokens,
            b.completion_tokens,
            price,
            b.cost_pico,
            b.pane,
            window_of(multi, b.window_end)
        );
    }
}

fn elsewhere(s: &mut String, x: &Explanation, multi: bool) {
    let _ = writeln!(s, "\nROUTED ELSEWHERE ({})", x.elsewhere.len());
    for e in &x.elsewhere {
        let why = match &e.route {
            Routed::Duplicate {
                of_offset,
                before_offset: Some(b),
            } if of_offset.is_none() => {
                format!("duplicate of a record before offset {b} (the replay's checkpoint)")
            }
            Routed::Duplicate { of_offset, .. } => {
                format!("duplicate of offset {}", opt(*of_offset))
            }
            Routed::TooLate {
                watermark,
                cost_pico,
                on_late_topic,
                adjustment,
            } => format!(
                "too late at watermark {watermark} ({cost_pico} pico-USD; {}; {})",
                if *on_late_topic {
                    "on the late topic"
                } else {
                    "not on the late topic"
                },
                match adjustment {
                    Some(true) => "adjustment billed it",
                    Some(false) => "no adjustment yet",
                    None => "adjustments not read",
                }
            ),
            Routed::DeadLetter {
                code,
                on_dead_letter_topic,
                ..
            } => format!(
                "dead letter {code}{}",
                if *on_dead_letter_topic {
                    ""
                } else {
                    " (not on the dead-letter topic)"
                }
            ),
        };
        let _ = writeln!(
            s,
            "{:<28} {:>9} {:>8} {why}{}",
            e.request_id.as_deref().unwrap_or("?"),
            e.partition,
            e.offset,
            window_of(multi, e.window_end)
        );
    }
}

fn totals(s: &mut String, x: &Explanation) {
    let t = &x.totals;
    let _ = writeln!(
        s,
        "\nTOTALS billed {} requests, {} pico-USD; adjustments {} ({} pico-USD); line {} pico-USD",
        t.requests,
        t.cost_pico,
        t.adjusted_requests,
        t.adjusted_cost_pico,
        t.expected_line_cost_pico
    );
    if let Some(sink) = &x.sink {
        let _ = writeln!(
            s,
            "SINK   line {} pico-USD, {} requests",
            sink.cost_pico.as_deref().unwrap_or("(none)"),
            sink.requests
        );
    }
    let verdict = match (x.exact, x.agrees) {
        (false, _) => "NOT EXACT: part of the input was deleted by retention",
        (true, Some(true)) => "AGREES with the sink",
        (true, Some(false)) => "DIFFERS from the sink",
        (true, None) => "not compared with a sink",
    };
    let _ = writeln!(s, "{verdict}");
    if let Some(f) = &x.finality {
        let held = f.held_back_by.map_or(String::new(), |p| {
            format!(", held back by input partition {p}")
        });
        let _ = writeln!(
            s,
            "{} as the sink stored it{held} (lateness still to run: {})",
            if f.is_final { "FINAL" } else { "NOT FINAL" },
            f.lateness_to_run_ms
                .map_or("unknown".into(), |l| format!("{l} ms"))
        );
    }
    for n in &x.notes {
        let _ = writeln!(s, "  - {n}");
    }
}
