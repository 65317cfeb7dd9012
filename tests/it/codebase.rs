//! Facts about the code base that no other test sees (docs/DEVELOPING.md#conventions):
//! `rust-version` in Cargo.toml is the true minimum of the locked crates. No services
//! needed; it asks `cargo metadata` offline, so it runs after any build.

use std::path::Path;
use std::process::Command;

/// A `rust-version` as numbers, so that 1.9 < 1.10 and 1.88 = 1.88.0.
fn version(text: &str) -> Vec<u64> {
    let mut v: Vec<u64> = text
        .trim()
        .split('.')
        .map(|n| {
            n.parse()
                .unwrap_or_else(|_| panic!("rust-version {text:?}: not numbers"))
        })
        .collect();
    v.resize(3, 0);
    v
}

/// The host's target triple, from `rustc -vV` (the crates the build really compiles).
fn host() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host")
}

/// Cargo.toml's `rust-version` is the highest one any locked dependency declares (for
/// the host's target): not lower — the build would fail on it — and not higher — it
/// would claim a need nothing has. Bumping a crate that needs a newer rustc fails here
/// until Cargo.toml says so. Clippy's `incompatible_msrv` lint (on in CI's `-D
/// warnings`) holds tally's own code to the same version.
#[test]
fn rust_version_is_the_locked_crates_highest() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .expect("Cargo.toml")
        .parse()
        .expect("Cargo.toml parses");
    let declared = manifest["package"]["rust-version"]
        .as_str()
        .expect("Cargo.toml declares package.rust-version");

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host()])
        .current_dir(root)
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let ours: Vec<&serde_json::Value> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .collect();
    let highest = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| !ours.contains(&&p["id"]))
        .filter_map(|p| {
            let v = p["rust_version"].as_str()?;
            Some((version(v), format!("{} {} ({v})", p["name"], p["version"])))
        })
        .max()
        .expect("some locked crate declares a rust-version");
    assert_eq!(
        version(declared),
        highest.0,
        "Cargo.toml says rust-version = {declared:?}; the locked crate needing the newest \
         rustc is {}",
        highest.1
    );
}

// ---------------------------------------------------------------------------------
// The layers (docs/DEVELOPING.md#layers): which top-level module may import which,
// no circle between them, and the size bars. It reads `src/**/*.rs` as text — no
// tool, no parser crate — leaving out comments, string literals and test code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// The floors, lowest first. A module imports from its own floor and the floors
/// below it, never from one above; within a floor, no circle either. A new top-level
/// module goes on a floor here and in DEVELOPING.md, or the test fails.
const FLOORS: &[(&str, &[&str])] = &[
    (
        "ground",
        &[
            "base",
            "failpoint",
            "logfmt",
            "percent",
            "progress",
            "secrets",
        ],
    ),
    ("vocabulary", &["time", "model"]),
    ("logic", &["engine", "gen", "reprocess"]),
    ("state", &["state"]),
    ("checkpoint", &["checkpoint"]),
    ("adapters", &["kafka", "metrics", "service"]),
    ("config", &["config"]),
    ("programs", &["sink", "worker", "api", "explain"]),
    ("commands", &["cli", "devtools"]),
];

/// The soft bars, outside test code.
const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 100;

/// Files over the bar, each with its reason. An entry that is no longer over it
/// fails the test too: delete the line.
#[rustfmt::skip]
const LONG_FILES: &[(&str, &str)] = &[
    ("src/engine/task.rs", "the partition task, steps 2–4 (step 1 is step1.rs); its spill and restore paths are next to leave it"),
    ("src/state/mod.rs", "the working copy's store; the lead's memory work splits it"),
];

/// Functions over the bar, each with its reason (file, function, reason); stale
/// entries fail as above.
#[rustfmt::skip]
const LONG_FNS: &[(&str, &str, &str)] = &[
];

/// One source file: its path from the package root, its top-level module and its
/// code without comments, literals and test code.
struct Source {
    path: String,
    top: String,
    code: String,
}

/// Every non-test file of the library under `src/` (not `main.rs`, `lib.rs` or
/// `bin/`, which are the commands' own).
fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    let texts: BTreeMap<PathBuf, String> = files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read a source file");
            (p, strip(&text))
        })
        .collect();
    // Files that a `#[cfg(test)] mod x;` declares, and everything under them.
    let mut test_paths: Vec<PathBuf> = Vec::new();
    for (path, code) in &texts {
        let dir = match path.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => path.parent().expect("a dir").to_path_buf(),
            _ => path.with_extension(""),
        };
        let mut rest = code.as_str();
        while let Some(i) = rest.find("#[cfg(test)]") {
            rest = &rest[i + "#[cfg(test)]".len()..];
            let item = rest.trim_start();
            let item = item.strip_prefix("pub ").unwrap_or(item).trim_start();
            if let Some(decl) = item.strip_prefix("mod ") {
                let name: String = decl.chars().take_while(|c| is_ident(*c)).collect();
                if decl[name.len()..].trim_start().starts_with(';') {
                    test_paths.push(dir.join(format!("{name}.rs")));
                    test_paths.push(dir.join(name));
                }
            }
        }
    }
    let src = root.join("src");
    texts
        .into_iter()
        .filter(|(p, _)| !test_paths.iter().any(|t| p.starts_with(t)))
        .filter_map(|(p, code)| {
            let rel = p.strip_prefix(&src).expect("under src");
            let first = rel.components().next()?.as_os_str().to_str()?.to_string();
            if matches!(first.as_str(), "main.rs" | "lib.rs" | "bin") {
                return None;
            }
            Some(Source {
                path: format!("src/{}", rel.display()),
                top: first.trim_end_matches(".rs").to_string(),
                code: drop_tests(&code),
            })
        })
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with comments and the contents of string and char literals blanked
/// (newlines kept, so lines still count).
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, s: &[char]| {
        out.extend(s.iter().map(|&ch| if ch == '\n' { '\n' } else { ' ' }))
    };
    let mut i = 0;
    while i < c.len() {
        let prev_ident = i > 0 && is_ident(c[i - 1]);
        let at = |k: usize| c.get(i + k).copied().unwrap_or('\0');
        if at(0) == '/' && at(1) == '/' {
            let end = c[i..]
                .iter()
                .position(|&ch| ch == '\n')
                .map_or(c.len(), |n| i + n);
            blank(&mut out, &c[i..end]);
            i = end;
        } else if at(0) == '/' && at(1) == '*' {
            let (mut depth, mut j) = (0, i);
            while j < c.len() {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, &c[i..j.min(c.len())]);
            i = j;
        } else if !prev_ident && (at(0) == 'r' || (at(0) == 'b' && at(1) == 'r')) && {
            let k = if at(0) == 'b' { 2 } else { 1 };
            let hashes = c[i + k..].iter().take_while(|&&ch| ch == '#').count();
            c.get(i + k + hashes) == Some(&'"')
        } {
            // A raw string: r"…", r#"…"#, br"…".
            let k = if at(0) == 'b' { 2 } else { 1 };
            let hashes = c[i + k..].iter().take_while(|&&ch| ch == '#').count();
            let body = i + k + hashes + 1;
            let mut j = body;
            while j < c.len()
                && !(c[j] == '"'
                    && c[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == '#')
                        .count()
                        == hashes)
            {
                j += 1;
            }
            out.push('"');
            blank(&mut out, &c[i + 1..j]);
            out.push('"');
            i = (j + 1 + hashes).min(c.len());
        } else if at(0) == '"' || (!prev_ident && matches!(at(0), 'b' | 'c') && at(1) == '"') {
            let start = if at(0) == '"' { i } else { i + 1 };
            let mut j = start + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            out.extend(&c[i..=start]);
            blank(&mut out, &c[start + 1..j.min(c.len())]);
            out.push('"');
            i = j + 1;
        } else if at(0) == '\'' && (at(1) == '\\' || at(2) == '\'') {
            // A char literal ('x', '\n', '\u{1F600}'), not a lifetime ('a).
            let mut j = i + 1;
            while j < c.len() && c[j] != '\'' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("' '");
            i = j + 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// `code` without the items marked `#[cfg(test)]` (a `mod tests { … }`, a test
/// helper): each up to its `;` or its closing brace.
fn drop_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let item = &rest[i..];
        let mut depth = 0;
        let mut end = item.len();
        for (k, ch) in item.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The top-level modules `code` names through `crate::` paths (`use crate::a::b`,
/// `crate::{a, b::c}`, `crate::a::f()`).
fn crate_targets(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("crate::") {
        let at = from + i;
        from = at + "crate::".len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| is_ident(c) || c == '$' || c == ':') {
            continue;
        }
        let rest = code[from..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = true;
            for (k, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if item_start && depth == 1 && is_ident(c) => {
                        let name: String =
                            group[k..].chars().take_while(|c| is_ident(*c)).collect();
                        out.insert(name);
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out.remove("self");
    out
}

/// Every module's imports of other top-level modules, with the files they are in.
fn imports(sources: &[Source]) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for s in sources {
        let node = graph.entry(s.top.clone()).or_default();
        for t in crate_targets(&s.code) {
            if t != s.top {
                node.entry(t).or_default().insert(s.path.clone());
            }
        }
    }
    graph
}

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|(_, ms)| ms.contains(&module))
}

/// No module imports from a floor above its own, and every module is on a floor.
#[test]
fn layers_import_only_downward() {
    let sources = sources();
    assert!(sources.len() > 100, "found {} source files", sources.len());
    let mut broken = Vec::new();
    for (module, targets) in imports(&sources) {
        let Some(own) = floor_of(&module) else {
            broken.push(format!(
                "src/{module}: on no floor; add it to FLOORS and DEVELOPING.md"
            ));
            continue;
        };
        for (target, files) in targets {
            match floor_of(&target) {
                Some(f) if f <= own => {}
                Some(f) => broken.push(format!(
                    "{module} ({}) imports crate::{target} ({}), a floor above: {}",
                    FLOORS[own].0,
                    FLOORS[f].0,
                    files.into_iter().collect::<Vec<_>>().join(", ")
                )),
                None => broken.push(format!(
                    "{module} imports crate::{target}, which is on no floor: {}",
                    files.into_iter().collect::<Vec<_>>().join(", ")
                )),
            }
        }
    }
    assert!(
        broken.is_empty(),
        "layer rules broken:\n{}",
        broken.join("\n")
    );
}

/// No circle of imports between top-level modules (within a floor, the floors
/// alone do not forbid one).
#[test]
fn no_import_circle_between_top_level_modules() {
    let graph = imports(&sources());
    // Depth-first search; a back edge is a circle, reported with its path.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        circles: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|n| n == node) {
            circles.push(format!("{} -> {node}", path[at..].join(" -> ")));
            return;
        }
        if !done.insert(node.to_string()) {
            return;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|t| t.keys()) {
            visit(next, graph, path, done, circles);
        }
        path.pop();
    }
    let mut circles = Vec::new();
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        visit(node, &graph, &mut Vec::new(), &mut done, &mut circles);
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// Circles between the files of one room (`src/<room>/<file>`) that remain, each
/// with its reason; a listed circle that is gone fails too.
#[rustfmt::skip]
const ROOM_CIRCLES: &[(&str, &[&str], &str)] = &[
];

/// Inside a room, the files import each other without a circle: `crate::<room>::x`
/// anywhere, and `super::x` in a file directly under the room, are imports of `x`
/// (the room's own `mod.rs`, the hub that re-exports, is not a node).
#[test]
fn no_import_circle_inside_a_room() {
    let sources = sources();
    let mut rooms: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for s in &sources {
        let parts: Vec<&str> = s.path.trim_start_matches("src/").split('/').collect();
        if parts.len() < 2 || parts[1] == "mod.rs" {
            continue;
        }
        let file = parts[1].trim_end_matches(".rs").to_string();
        rooms.entry(s.top.clone()).or_default().insert(file.clone());
        let direct = parts.len() == 2 || (parts.len() == 3 && parts[2] == "mod.rs");
        let mut targets: BTreeSet<String> = BTreeSet::new();
        for (prefix, only_direct) in [
            (format!("crate::{}::", s.top), false),
            ("super::".to_string(), true),
        ] {
            if only_direct && !direct {
                continue;
            }
            let mut from = 0;
            while let Some(i) = s.code[from..].find(&prefix) {
                let at = from + i;
                from = at + prefix.len();
                if s.code[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| is_ident(c) || c == ':' || c == '$')
                {
                    continue;
                }
                let rest = &s.code[from..];
                let names: Vec<String> = match rest.strip_prefix('{') {
                    Some(group) => group[..group.find('}').unwrap_or(group.len())]
                        .split(',')
                        .map(|n| n.trim().chars().take_while(|c| is_ident(*c)).collect())
                        .collect(),
                    None => vec![rest.chars().take_while(|c| is_ident(*c)).collect()],
                };
                targets.extend(names.into_iter().filter(|n| !n.is_empty() && *n != file));
            }
        }
        edges
            .entry((s.top.clone(), file))
            .or_default()
            .extend(targets);
    }
    let mut circles: Vec<(String, BTreeSet<String>, String)> = Vec::new();
    for (room, files) in &rooms {
        let graph: BTreeMap<&str, Vec<&str>> = files
            .iter()
            .map(|f| {
                let to = edges.get(&(room.clone(), f.clone())).into_iter().flatten();
                (
                    f.as_str(),
                    to.filter(|t| files.contains(*t))
                        .map(String::as_str)
                        .collect(),
                )
            })
            .collect();
        fn visit<'a>(
            node: &'a str,
            graph: &BTreeMap<&'a str, Vec<&'a str>>,
            path: &mut Vec<&'a str>,
            done: &mut BTreeSet<&'a str>,
            out: &mut Vec<Vec<&'a str>>,
        ) {
            if let Some(at) = path.iter().position(|n| *n == node) {
                out.push(path[at..].to_vec());
                return;
            }
            if !done.insert(node) {
                return;
            }
            path.push(node);
            for next in graph.get(node).into_iter().flatten() {
                visit(next, graph, path, done, out);
            }
            path.pop();
        }
        let mut found = Vec::new();
        let mut done = BTreeSet::new();
        for node in graph.keys() {
            visit(node, &graph, &mut Vec::new(), &mut done, &mut found);
        }
        for c in found {
            let text = format!("{room}: {} -> {}", c.join(" -> "), c[0]);
            circles.push((
                room.clone(),
                c.into_iter().map(String::from).collect(),
                text,
            ));
        }
    }
    let mut broken = Vec::new();
    for (room, nodes, text) in &circles {
        let listed = ROOM_CIRCLES
            .iter()
            .any(|(r, files, _)| r == room && nodes.iter().all(|n| files.contains(&n.as_str())));
        if !listed {
            broken.push(text.clone());
        }
    }
    for (room, files, _) in ROOM_CIRCLES {
        let still = circles
            .iter()
            .any(|(r, nodes, _)| r == room && nodes.iter().all(|n| files.contains(&n.as_str())));
        if !still {
            broken.push(format!(
                "{room}: {files:?} is listed in ROOM_CIRCLES but has no circle: delete the line"
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "import circles inside rooms:\n{}",
        broken.join("\n")
    );
}

/// Each function of `code` that has a body: its name and its length in lines.
fn functions(code: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("fn ") {
        let at = from + i;
        from = at + 3;
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let name: String = code[from..].chars().take_while(|c| is_ident(*c)).collect();
        if name.is_empty() {
            continue;
        }
        let mut depth = 0;
        let mut end = None;
        for (k, ch) in code[from..].char_indices() {
            match ch {
                ';' if depth == 0 => break,
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(from + k);
                        break;
                    }
                }
                _ => {}
            }
        }
        if let Some(end) = end {
            out.push((name, code[at..end].lines().count()));
        }
    }
    out
}

/// No file over 600 lines and no function over 100, outside test code, except
/// those listed with a reason (LONG_FILES, LONG_FNS) — and every listed one still
/// is over, so the list stays true.
#[test]
fn files_and_functions_stay_short() {
    let mut over = Vec::new();
    let mut long_files = BTreeSet::new();
    let mut long_fns = BTreeSet::new();
    for s in sources() {
        let lines = s.code.lines().count();
        if lines > MAX_FILE_LINES {
            long_files.insert(s.path.clone());
            if !LONG_FILES.iter().any(|(p, _)| *p == s.path) {
                over.push(format!("{}: {lines} lines (bar {MAX_FILE_LINES})", s.path));
            }
        }
        for (name, lines) in functions(&s.code) {
            if lines > MAX_FN_LINES {
                long_fns.insert((s.path.clone(), name.clone()));
                if !LONG_FNS.iter().any(|(p, f, _)| *p == s.path && *f == name) {
                    over.push(format!(
                        "{}: fn {name}, {lines} lines (bar {MAX_FN_LINES})",
                        s.path
                    ));
                }
            }
        }
    }
    for (path, _) in LONG_FILES {
        if !long_files.contains(*path) {
            over.push(format!(
                "{path} is listed in LONG_FILES but is within the bar: delete the line"
            ));
        }
    }
    for (path, name, _) in LONG_FNS {
        if !long_fns.contains(&(path.to_string(), name.to_string())) {
            over.push(format!(
                "{path}: fn {name} is listed in LONG_FNS but is within the bar: delete the line"
            ));
        }
    }
    assert!(
        over.is_empty(),
        "over the soft bars (docs/DEVELOPING.md#layers):\n{}",
        over.join("\n")
    );
}

/// The reader itself: literals, comments and test code are not read as imports.
#[test]
fn the_reader_skips_literals_comments_and_tests() {
    let code = strip(concat!(
        "use crate::a::b; // crate::commented\n",
        "let s = \"crate::quoted\"; let r = r#\"crate::raw \"# ; let c = '{';\n",
        "fn f<'a>(x: &'a str) { crate::{c, d::e}::g(); }\n",
        "#[cfg(test)]\nmod tests { use crate::tested; }\n",
        "$crate::macro_path; not_crate::x;\n",
    ));
    let code = drop_tests(&code);
    let found: Vec<String> = crate_targets(&code).into_iter().collect();
    assert_eq!(found, ["a", "c", "d"]);
    assert_eq!(functions(&code), [("f".to_string(), 1)]);
}
