//! Keeps README.md and docs/*.md true: every `ironsan` command line they show must parse
//! with this binary's arguments, and every TOML block must be a configuration the target
//! accepts. Only the parse is checked (no command runs); the stages run the commands.

use crate::Cli;
use clap::error::ErrorKind;
use clap::Parser;
use std::path::{Path, PathBuf};

/// One example found in a page, with where it is for the failure message.
struct Example {
    place: String,
    text: String,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every page under docs/.
fn pages() -> Vec<(String, String)> {
    let root = repo_root();
    let mut names = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ beside README.md")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(root.join(&n)).expect("a readable page");
            (n, text)
        })
        .collect()
}

/// One line of a page: its number (from 1), its text, and the language of the fenced block it
/// lies in (`Some("")` for a fence without one); fence markers themselves are `Marker`s.
enum PageLine<'a> {
    Marker,
    Text {
        number: usize,
        text: &'a str,
        fence: Option<&'a str>,
    },
}

/// The lines of a page, each with the fenced block it lies in.
fn page_lines(text: &str) -> Vec<PageLine<'_>> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(lang) = line.trim_start().strip_prefix("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(lang.trim()),
            };
            out.push(PageLine::Marker);
        } else {
            out.push(PageLine::Text {
                number: i + 1,
                text: line,
                fence,
            });
        }
    }
    out
}

/// Lines of code in a page: indented by four spaces outside fences, or inside a fence that
/// is not TOML. A line ending in `\` continues on the next.
fn code_lines(name: &str, text: &str) -> Vec<Example> {
    let mut out: Vec<Example> = Vec::new();
    let mut continuing = false;
    for line in page_lines(text) {
        let PageLine::Text {
            number,
            text: line,
            fence,
        } = line
        else {
            continuing = false;
            continue;
        };
        let is_code = match fence {
            Some(lang) => lang != "toml",
            None => line.starts_with("    "),
        };
        if !is_code {
            continuing = false;
            continue;
        }
        let trimmed = line.trim();
        if continuing {
            let last = out.last_mut().expect("a line to continue");
            last.text.push(' ');
            last.text.push_str(trimmed.trim_end_matches('\\'));
        } else {
            out.push(Example {
                place: format!("{name}:{number}"),
                text: trimmed.trim_end_matches('\\').to_string(),
            });
        }
        continuing = trimmed.ends_with('\\');
    }
    out
}

/// The TOML blocks of a page: where each starts (`page:line`) and its text.
fn toml_blocks(name: &str, text: &str) -> Vec<(String, String)> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut open = false;
    for line in page_lines(text) {
        match line {
            PageLine::Marker => open = false,
            PageLine::Text {
                number,
                text,
                fence: Some("toml"),
            } => {
                if !open {
                    blocks.push((format!("{name}:{number}"), String::new()));
                    open = true;
                }
                let block = &mut blocks.last_mut().expect("an open block").1;
                block.push_str(text);
                block.push('\n');
            }
            PageLine::Text { .. } => {}
        }
    }
    blocks
}

fn ironsan_words(line: &str) -> Option<Vec<String>> {
    let line = line.strip_prefix("$ ").unwrap_or(line);
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    let mut in_word = false;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, ';') => break,
            (None, '#' | '|' | '>' | '<' | '&') if !in_word => break,
            (None, '|') => {
                // `clear|punch`: the first alternative.
                while chars.peek().is_some_and(|c| !c.is_whitespace()) {
                    chars.next();
                }
            }
            (None, '[' | ']') => {}
            (None, '$') if chars.peek() == Some(&'(') => {
                let mut depth = 0;
                for c in chars.by_ref() {
                    match c {
                        '(' => depth += 1,
                        ')' if depth == 1 => break,
                        ')' => depth -= 1,
                        _ => {}
                    }
                }
                word.push('1');
                in_word = true;
            }
            (None, '$') => {
                while chars
                    .peek()
                    .is_some_and(|c| c.is_alphanumeric() || *c == '_')
                {
                    chars.next();
                }
                word.push_str("iscsi://127.0.0.1/iqn.2026-11.org.example:disk1/4");
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    // Environment assignments before the command (`IRONSAN_LOG=info ironsan ...`).
    let first = words
        .iter()
        .position(|w| !w.contains('=') || w.starts_with('-'))?;
    let words = words.split_off(first);
    (words.first().map(String::as_str) == Some("ironsan") && words.len() > 1).then_some(words)
}

#[test]
fn every_documented_command_line_parses() {
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (name, text) in pages() {
        for example in code_lines(&name, &text) {
            let Some(words) = ironsan_words(&example.text) else {
                continue;
            };
            checked += 1;
            if let Err(e) = Cli::try_parse_from(&words) {
                if !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                    let why = e.to_string();
                    let why = why.lines().next().unwrap_or_default().to_string();
                    wrong.push(format!("{}: `{}`: {why}", example.place, example.text));
                }
            }
        }
    }
    println!("{checked} documented ironsan command lines parse");
    assert!(
        checked >= 50,
        "only {checked} ironsan command lines found in the docs"
    );
    assert!(
        wrong.is_empty(),
        "documented commands the CLI refuses:\n{}",
        wrong.join("\n")
    );
}

/// The TOML blocks of every page: each is a whole configuration or a part of one, and the
/// target must accept it as it stands.
#[test]
fn every_documented_configuration_parses() {
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (name, text) in pages() {
        for (origin, block) in toml_blocks(&name, &text) {
            if let Err(e) = iscsi_target::Config::parse(&block, &origin) {
                wrong.push(e.to_string());
            }
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} toml blocks found in the docs");
    assert!(
        wrong.is_empty(),
        "documented configurations the target refuses:\n{}",
        wrong.join("\n")
    );
}

/// Every relative link of a page names a file that exists.
#[test]
fn every_documented_link_resolves() {
    let root = repo_root();
    let mut wrong = Vec::new();
    for (name, text) in pages() {
        let dir = root
            .join(&name)
            .parent()
            .expect("a page's folder")
            .to_path_buf();
        for (i, _) in text.match_indices("](") {
            let target = &text[i + 2..];
            let Some(end) = target.find(')') else {
                continue;
            };
            let target = target[..end].split('#').next().unwrap_or_default();
            if target.is_empty() || target.contains("://") {
                continue;
            }
            if !dir.join(target).exists() {
                wrong.push(format!("{name}: {target}"));
            }
        }
    }
    assert!(wrong.is_empty(), "links to nothing:\n{}", wrong.join("\n"));
}

#[test]
fn command_words_are_split_as_a_shell_would() {
    assert_eq!(
        ironsan_words("IRONSAN_LOG=x ironsan bench 'a b' [--json] --rw read|write # note"),
        Some(
            vec!["ironsan", "bench", "a b", "--json", "--rw", "read"]
                .into_iter()
                .map(String::from)
                .collect()
        )
    );
    assert_eq!(
        ironsan_words("ironsan read URL > data; ironsan x").map(|w| w.len()),
        Some(3)
    );
    assert_eq!(ironsan_words("iscsiadm -m node --login"), None);
    assert_eq!(ironsan_words("ironsan"), None);
}
