//! The interactive timeline page: one self-contained HTML file (no external scripts, no
//! network) holding the data of [`super::data`] as JSON and the script `page.js` that draws
//! it on a canvas. `#selftest` in the page's address runs the page's own check after the
//! first drawing (used by tests/stages/55-analyze-timeline.sh in headless Chromium).

use super::data::{match_tcp_info, page_data, TcpInfoTrace};
use crate::analysis::Analysis;
use crate::stats::{CommandStat, StatsOptions};
use report::xml_escape;

const SCRIPT: &str = include_str!("page.js");
const STYLE: &str = include_str!("page.css");

/// The page: PDU lanes, a command lane and time-series lanes per connection (outstanding
/// commands, read/write MB/s, bytes in flight and advertised window, TCP events, and cwnd and
/// RTT from `tcp_info` samples when given), wheel or buttons to zoom, drag to pan, hover for
/// the PDU's listing line or the command's details.
pub fn html(
    a: &Analysis,
    cmds: &[CommandStat],
    opts: &StatsOptions,
    tcp_info: &[TcpInfoTrace],
) -> String {
    let matched = match_tcp_info(a, tcp_info);
    let pairs: Vec<_> = tcp_info.iter().cloned().zip(matched).collect();
    // `</` inside a JSON string would end the script element early.
    let data = page_data(a, cmds, opts, &pairs).replace("</", "<\\/");
    let unplaced: Vec<String> = pairs
        .iter()
        .filter(|(_, m)| m.is_none())
        .map(|(t, _)| xml_escape(&t.name))
        .collect();
    let note = if unplaced.is_empty() {
        String::new()
    } else {
        format!(
            "<div class=\"note\">TCP_INFO samples not matched to a connection: {}</div>",
            unplaced.join(", ")
        )
    };
    format!(
        r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>ironsan timeline</title>
<style>{STYLE}</style></head><body>
<div id="bar"><span id="title"></span>
<button id="zin" title="zoom in">+</button><button id="zout" title="zoom out">&minus;</button><button id="zreset" title="whole capture">reset</button>
<span id="range"></span><span class="help">wheel: zoom &middot; drag: pan &middot; double-click: reset &middot; hover: details</span></div>
{note}<div id="legend"></div>
<div id="wrap"><canvas id="tl"></canvas></div><div id="tip"></div><div id="status"></div>
<script type="application/json" id="data">{data}</script>
<script>{SCRIPT}</script></body></html>
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::commands;
    use crate::synthetic::{data_in, data_out, r2t, response, rw10, Synthetic};
    use iscsi_wire::Bhs;

    /// READs and WRITEs on one connection, a command every `gap_us`, each in flight about
    /// eight gaps: `commands` commands, 2 PDUs per READ and 4 per WRITE.
    pub(crate) fn busy_capture(commands: u32, gap_us: u64) -> Analysis {
        let block = vec![0u8; 512];
        let mut ev: Vec<(u64, u32, Bhs, bool)> = Vec::new();
        for i in 0..commands {
            let (t, itt) = (i as u64 * gap_us, i + 1);
            if i % 5 < 2 {
                ev.push((t, 0, rw10(itt, false, i, 1, 0), false));
                ev.push((t + 8 * gap_us, 1, data_in(itt, 0, true), true));
            } else {
                ev.push((t, 0, rw10(itt, true, i, 1, 0), false));
                ev.push((t + 3 * gap_us, 1, r2t(itt, itt, 0, 512), false));
                ev.push((t + 5 * gap_us, 2, data_out(itt, itt, 0), true));
                ev.push((t + 8 * gap_us, 3, response(itt), false));
            }
        }
        ev.sort_by_key(|e| (e.0, e.1));
        let mut s = Synthetic::new();
        for (t, _, bhs, data) in ev {
            s.pdu(t, bhs, if data { &block } else { &[] });
        }
        s.analysis()
    }

    #[test]
    fn the_page_is_self_contained() {
        let a = busy_capture(200, 10);
        let cmds = commands(&a, &StatsOptions::default());
        let page = html(&a, &cmds, &StatsOptions::default(), &[]);
        assert!(page.starts_with("<!DOCTYPE html>"));
        // No external resource: no src/href attributes and no URL the page would fetch.
        for bad in ["src=", "href=", "http://", "https://", "import("] {
            assert!(!page.contains(bad), "{bad} in the page");
        }
        let start = page.find("id=\"data\">").unwrap() + "id=\"data\">".len();
        let end = start + page[start..].find("</script>").unwrap();
        let doc: serde_json::Value = serde_json::from_str(&page[start..end]).unwrap();
        assert_eq!(
            doc["conns"][0]["lanes"][0]["k"].as_array().unwrap().len(),
            200 + 120
        );
        assert_eq!(
            doc["conns"][0]["lanes"][1]["k"].as_array().unwrap().len(),
            80 + 240
        );
        assert_eq!(doc["conns"][0]["cmds"]["w"].as_array().unwrap().len(), 200);
        assert_eq!(doc["agg"], 3);
    }

    /// The size of a page for a million PDUs; run with
    /// `cargo test --release -p analyze million -- --ignored --nocapture` (writes
    /// $TIMELINE_OUT, default /tmp/timeline-1m.html, for a browser).
    #[test]
    #[ignore]
    fn million_pdus() {
        let t = std::time::Instant::now();
        // 2 PDUs per READ (2 of 5 commands), 4 per WRITE: 3.2 per command.
        let a = busy_capture(312_500, 10);
        assert_eq!(a.pdus.len(), 1_000_000);
        let built = t.elapsed();
        let cmds = commands(&a, &StatsOptions::default());
        let t = std::time::Instant::now();
        let page = html(&a, &cmds, &StatsOptions::default(), &[]);
        let took = t.elapsed();
        let out = std::env::var("TIMELINE_OUT").unwrap_or("/tmp/timeline-1m.html".into());
        std::fs::write(&out, &page).unwrap();
        println!(
            "1M PDUs: capture built in {built:?}, page {} bytes written in {took:?} to {out}",
            page.len()
        );
        assert!(page.len() < 60_000_000, "{} bytes", page.len());
    }
}
