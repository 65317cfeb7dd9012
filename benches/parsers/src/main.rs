//! parsebench: best-of-N timing of the extraction parsers over in-memory records.
//! Usage: parsebench [INPUT.jsonl] [N_RECORDS] [RUNS] [SHAPES (default,ce,nested)] [chunked]

use std::hint::black_box;
use std::io::{BufRead, BufReader};
use std::time::Instant;

use parsebench::*;

#[derive(Debug, Clone, Copy, PartialEq)]
enum P {
    A,
    B,
    C,
    C2,
    D,
    E,
    F,
    G,
}

impl P {
    fn name(self) -> &'static str {
        match self {
            P::A => "(a) serde_json from_slice",
            P::B => "(b) from_utf8 + serde_json from_str",
            P::C => "(c) sonic-rs serde from_slice",
            P::C2 => "(c2) from_utf8 + sonic-rs serde from_str",
            P::D => "(d) simd-json serde (copy incl.)",
            P::E => "(e) old derive Wire, serde_json::from_slice",
            P::F => "(f) sonic-rs get_many (non-serde)",
            P::G => "(g) from_utf8 + tally's scanner (then (b))",
        }
    }
}

struct Recs {
    data: Vec<u8>,
    ranges: Vec<(usize, usize)>,
}

impl Recs {
    fn new() -> Self {
        Recs {
            data: Vec::new(),
            ranges: Vec::new(),
        }
    }
    fn push(&mut self, r: &[u8]) {
        let s = self.data.len();
        self.data.extend_from_slice(r);
        self.ranges.push((s, self.data.len()));
    }
    fn bytes(&self) -> usize {
        self.data.len()
    }
    fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.ranges.iter().map(|&(s, e)| &self.data[s..e])
    }
}

#[inline(never)]
fn lp<F: FnMut(&[u8]) -> Option<u64>>(recs: &Recs, range: (usize, usize), mut f: F) -> (u64, u64) {
    let (mut n, mut sum) = (0u64, 0u64);
    for &(s, e) in &recs.ranges[range.0..range.1] {
        let r = &recs.data[s..e];
        if let Some(h) = f(black_box(r)) {
            n += 1;
            sum = sum.wrapping_add(h);
        }
    }
    (n, sum)
}

/// This thread's CPU time in seconds (excludes time descheduled by the other
/// engineer's build on this shared 2-core machine).
fn cpu_now() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn run(p: P, shape: Shape, recs: &Recs, range: (usize, usize)) -> (u64, u64, f64, f64) {
    let plan = shape.plan();
    let tree = shape.tree();
    let n = shape.pointers().len();
    let t = Instant::now();
    let c0 = cpu_now();
    let (c, s) = match p {
        P::A => lp(recs, range, |b| summarize(shape, &a_serde_slice(&plan, b)?)),
        P::B => lp(recs, range, |b| summarize(shape, &b_serde_str(&plan, b)?)),
        P::G => lp(recs, range, |b| summarize(shape, &g_scan(&plan, b)?)),
        P::C => lp(recs, range, |b| summarize(shape, &c_sonic_slice(&plan, b)?)),
        P::C2 => lp(recs, range, |b| summarize(shape, &c2_sonic_str(&plan, b)?)),
        P::D => {
            let mut buf = Vec::with_capacity(4096);
            let mut buffers = simd_json::Buffers::new(4096);
            lp(recs, range, |b| {
                summarize(shape, &d_simd(&plan, &mut buf, &mut buffers, b)?)
            })
        }
        P::E => lp(recs, range, |b| summarize(shape, &e_wire(b)?)),
        P::F => lp(recs, range, |b| {
            f_sonic_get_many(&tree, n, b, |v| summarize(shape, v)).flatten()
        }),
    };
    let wall = t.elapsed().as_secs_f64();
    (c, s, wall, cpu_now() - c0)
}

fn rfc3339_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let input = args
        .get(1)
        .map(String::as_str)
        .unwrap_or("/tmp/tally-bench/events-5000000.jsonl");
    let nrec: usize = args.get(2).map_or(1_000_000, |s| s.parse().unwrap());
    let runs: usize = args.get(3).map_or(5, |s| s.parse().unwrap());
    let shapes = args.get(4).map_or("default,ce,nested", String::as_str);
    let chunked = args.get(5).is_some_and(|s| s == "chunked");

    // Load.
    let f = std::fs::File::open(input).expect("input");
    let mut def = Recs::new();
    for line in BufReader::with_capacity(1 << 20, f).split(b'\n').take(nrec) {
        def.push(&line.unwrap());
    }
    // Generate the other shapes from the default records.
    let plan = Shape::Default.plan();
    let (mut ce, mut nested) = (Recs::new(), Recs::new());
    let mut times: Vec<String> = Vec::with_capacity(def.ranges.len());
    for r in def.iter() {
        let v = b_serde_str(&plan, r).expect("default record parses");
        let js = |v: &Val| match v {
            Val::Str(s) => serde_json::to_string(&**s).unwrap(),
            Val::U64(n) => n.to_string(),
            Val::I64(n) => n.to_string(),
            Val::Null | Val::Absent => "null".into(),
            Val::Other => panic!("unexpected value"),
        };
        let completed = match v[6] {
            Val::U64(n) => n as i64,
            Val::I64(n) => n,
            _ => panic!("completed_ts"),
        };
        let time = rfc3339_ms(completed);
        ce.push(
            format!(
                r#"{{"specversion":"1.0","id":{},"source":"//gw/eu","type":"com.example.request.completed","subject":{},"time":"{}","datacontenttype":"application/json","data":{{"model":{},"prompt_tokens":{},"completion_tokens":{},"started_ts":{}}}}}"#,
                js(&v[0]), js(&v[1]), time, js(&v[2]), js(&v[3]), js(&v[4]), js(&v[5])
            )
            .as_bytes(),
        );
        nested.push(
            format!(
                r#"{{"req":{},"customer":{{"id":{}}},"usage":{{"model":{},"input_tokens":{},"output_tokens":{}}},"time":{},"started":{}}}"#,
                js(&v[0]), js(&v[1]), js(&v[2]), js(&v[3]), js(&v[4]), js(&v[6]), js(&v[5])
            )
            .as_bytes(),
        );
        times.push(time);
    }
    eprintln!(
        "records: {}; bytes default {} ({:.1}/rec), ce {} ({:.1}/rec), nested {} ({:.1}/rec)",
        def.ranges.len(),
        def.bytes(),
        def.bytes() as f64 / def.ranges.len() as f64,
        ce.bytes(),
        ce.bytes() as f64 / ce.ranges.len() as f64,
        nested.bytes(),
        nested.bytes() as f64 / nested.ranges.len() as f64
    );
    for (name, recs) in [("default", &def), ("ce", &ce), ("nested", &nested)] {
        std::fs::write(
            format!("sample-{name}.json"),
            recs.iter().next().unwrap(),
        )
        .ok();
    }

    for (label, shape, recs) in [
        ("default", Shape::Default, &def),
        ("ce", Shape::CloudEvents, &ce),
        ("nested", Shape::Nested, &nested),
    ] {
        if !shapes.split(',').any(|s| s == label) {
            continue;
        }
        let mut ps = vec![P::A, P::B, P::G, P::C, P::C2, P::D];
        if shape == Shape::Default {
            ps.push(P::E);
        }
        ps.push(P::F);
        let mut times_s: Vec<Vec<f64>> = vec![Vec::new(); ps.len()];
        let mut cpu_s: Vec<Vec<f64>> = vec![Vec::new(); ps.len()];
        let mut counts: Vec<(u64, u64)> = vec![(0, 0); ps.len()];
        for r in 0..runs {
            // Alternate the order: forward on even runs, reversed on odd ones.
            let order: Vec<usize> = if r % 2 == 0 {
                (0..ps.len()).collect()
            } else {
                (0..ps.len()).rev().collect()
            };
            for i in order {
                let (c, s, t, cpu) = run(ps[i], shape, recs, (0, recs.ranges.len()));
                times_s[i].push(t);
                cpu_s[i].push(cpu);
                counts[i] = (c, s);
            }
        }
        let min = |v: &Vec<f64>| v.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = |v: &Vec<f64>| v.iter().cloned().fold(0.0, f64::max);
        let best_a = min(&times_s[0]);
        let best_a_cpu = min(&cpu_s[0]);
        println!(
            "\n## {label}: {} records, {:.1} MB, {:.1} bytes/rec, best of {runs}",
            recs.ranges.len(),
            recs.bytes() as f64 / 1e6,
            recs.bytes() as f64 / recs.ranges.len() as f64
        );
        println!("| parser | best wall s | worst wall s | events/s | MB/s | vs (a) | best CPU s | worst CPU s | CPU events/s | CPU MB/s | CPU vs (a) | valid | checksum |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for (i, p) in ps.iter().enumerate() {
            let (best, worst) = (min(&times_s[i]), max(&times_s[i]));
            let (bc, wc) = (min(&cpu_s[i]), max(&cpu_s[i]));
            println!(
                "| {} | {:.4} | {:.4} | {:.2}M | {:.0} | {:.2}x | {:.4} | {:.4} | {:.2}M | {:.0} | {:.2}x | {} | {:016x} |",
                p.name(),
                best,
                worst,
                recs.ranges.len() as f64 / best / 1e6,
                recs.bytes() as f64 / best / 1e6,
                best_a / best,
                bc,
                wc,
                recs.ranges.len() as f64 / bc / 1e6,
                recs.bytes() as f64 / bc / 1e6,
                best_a_cpu / bc,
                counts[i].0,
                counts[i].1
            );
        }
        if counts.iter().any(|c| *c != counts[0]) {
            println!("!! parsers disagree on count/checksum");
        }
        if chunked {
            // Less noisy estimate on a shared machine: 20 chunks; per chunk, each
            // parser `runs` times (alternating order), min per chunk, summed.
            let nch = 20;
            let len = recs.ranges.len();
            let mut tot = vec![0.0f64; ps.len()];
            for ch in 0..nch {
                let range = (ch * len / nch, (ch + 1) * len / nch);
                let mut mins = vec![f64::INFINITY; ps.len()];
                for r in 0..runs {
                    let order: Vec<usize> = if (r + ch) % 2 == 0 {
                        (0..ps.len()).collect()
                    } else {
                        (0..ps.len()).rev().collect()
                    };
                    for i in order {
                        let (_, _, _, cpu) = run(ps[i], shape, recs, range);
                        mins[i] = mins[i].min(cpu);
                    }
                }
                for i in 0..ps.len() {
                    tot[i] += mins[i];
                }
            }
            println!("\nchunked estimate ({label}: sum over 20 chunks of the per-chunk min CPU time of {runs} tries):");
            println!("| parser | s | events/s | MB/s | vs (a) |");
            println!("|---|---|---|---|---|");
            for (i, p) in ps.iter().enumerate() {
                println!(
                    "| {} | {:.4} | {:.2}M | {:.0} | {:.2}x |",
                    p.name(),
                    tot[i],
                    len as f64 / tot[i] / 1e6,
                    recs.bytes() as f64 / tot[i] / 1e6,
                    tot[0] / tot[i]
                );
            }
        }
        if shape == Shape::CloudEvents {
            let mut best = f64::INFINITY;
            let mut worst: f64 = 0.0;
            let mut acc = 0i64;
            let mut best_cpu = f64::INFINITY;
            for _ in 0..runs {
                let t = Instant::now();
                let c0 = cpu_now();
                let mut s = 0i64;
                for x in &times {
                    if let Ok(d) = chrono::DateTime::parse_from_rfc3339(black_box(x)) {
                        s = s.wrapping_add(d.timestamp_millis());
                    }
                }
                let e = t.elapsed().as_secs_f64();
                best_cpu = best_cpu.min(cpu_now() - c0);
                best = best.min(e);
                worst = worst.max(e);
                acc = s;
            }
            println!(
                "chrono parse_from_rfc3339+timestamp_millis over {} strings: best {:.4}s (worst {:.4}s) = {:.1} ns/record, {:.2}M/s; best CPU {:.4}s = {:.1} ns/record (sum {acc})",
                times.len(),
                best,
                worst,
                best / times.len() as f64 * 1e9,
                times.len() as f64 / best / 1e6,
                best_cpu,
                best_cpu / times.len() as f64 * 1e9
            );
        }
    }
}
