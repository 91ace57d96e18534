//! Progress bars for long CLI work (whole-LUN `read`/`write`, bench sweeps, soak, osd bench,
//! `analyze`), drawn with indicatif on stderr, and only when stderr is a terminal: output
//! redirected to a file or a pipe gets no progress bytes at all.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Whether bars are drawn: stderr is a terminal.
pub fn visible() -> bool {
    std::io::stderr().is_terminal()
}

/// A bar of `total` bytes labelled `what` (a spinner with the count when `total` is unknown).
pub fn bytes(total: Option<u64>, what: &str) -> ProgressBar {
    let Some(total) = total else {
        return spinner_with(
            what,
            "{prefix} {spinner} {bytes} {bytes_per_sec} {elapsed_precise}",
        );
    };
    bar(
        total,
        what,
        "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
}

/// A bar of `total` steps labelled `what`; the message (`set_message`) follows it.
pub fn steps(total: u64, what: &str) -> ProgressBar {
    bar(total, what, "{prefix} [{bar:30}] {pos}/{len} {msg}")
}

/// A spinner labelled `what` with the time spent, for work of unknown length.
pub fn spinner(what: &str) -> ProgressBar {
    spinner_with(what, "{prefix} {spinner} {elapsed_precise} {msg}")
}

fn bar(total: u64, what: &str, template: &str) -> ProgressBar {
    if !visible() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    ProgressBar::new(total)
        .with_style(style)
        .with_prefix(what.to_string())
}

fn spinner_with(what: &str, template: &str) -> ProgressBar {
    if !visible() {
        return ProgressBar::hidden();
    }
    let style =
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_spinner());
    let p = ProgressBar::new_spinner()
        .with_style(style)
        .with_prefix(what.to_string());
    p.enable_steady_tick(Duration::from_millis(200));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_are_hidden_off_a_terminal() {
        // Under `cargo test` stderr is captured (not a terminal) in CI and scripts; the bars
        // must then be hidden whatever is done with them.
        if visible() {
            eprintln!("SKIP: stderr is a terminal here");
            return;
        }
        for p in [
            bytes(Some(10), "x"),
            bytes(None, "x"),
            steps(3, "x"),
            spinner("x"),
        ] {
            assert!(p.is_hidden());
            p.inc(1);
            p.finish_and_clear();
        }
    }
}
