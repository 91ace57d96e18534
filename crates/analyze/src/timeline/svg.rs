//! The static timeline: an SVG with one lane per connection and direction, each PDU a mark at
//! the time its bytes were on the wire, each SCSI command a span from command to status,
//! pauses on the wire shaded, and TCP retransmissions and losses flagged in red. One element
//! per PDU: fine for small captures; the HTML page (`super::html`) scales to large ones.

use std::fmt::Write as _;

use crate::analysis::Analysis;
use crate::iscsi::Dir;
use crate::listing::pdu_line;
use crate::stats::{CommandStat, StatsOptions};
use crate::tcp::TcpEventKind;
use report::xml_escape;

const WIDTH: f64 = 1400.0;
const LEFT: f64 = 170.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const LANE_H: f64 = 26.0;
const CMD_H: f64 = 14.0;
const CONN_GAP: f64 = 14.0;

fn colour(opcode: u8) -> &'static str {
    match opcode {
        0x01 => "#4e79a7",        // SCSI Command
        0x25 | 0x05 => "#59a14f", // data
        0x21 => "#f28e2b",        // response
        0x31 => "#b07aa1",        // R2T
        0x03 | 0x23 => "#9c755f", // login
        0x3f => "#e15759",        // reject
        _ => "#bab0ac",
    }
}

/// Time axis: seconds from the capture start to x pixels.
struct Scale {
    t0: u64,
    span: f64,
}

impl Scale {
    fn x(&self, ts: u64) -> f64 {
        LEFT + (ts.saturating_sub(self.t0) as f64 / self.span) * (WIDTH - LEFT - RIGHT)
    }
}

fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

/// The timeline as an SVG document.
pub fn svg(a: &Analysis, cmds: &[CommandStat], opts: &StatsOptions) -> String {
    let t0 = a.start_ns;
    let span = (a.end_ns.saturating_sub(t0)).max(1) as f64;
    let sc = Scale { t0, span };
    let conn_h = 2.0 * LANE_H + CMD_H + CONN_GAP;
    let height = TOP + conn_h * a.connections.len().max(1) as f64 + 40.0;
    let mut s = String::with_capacity(256 + a.pdus.len() * 200);
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<defs><clipPath id="plotclip"><rect x="{LEFT}" y="0" width="{}" height="{height}"/></clipPath></defs>"#,
        WIDTH - LEFT - RIGHT
    );
    let _ = write!(
        s,
        r#"<text x="{LEFT}" y="16" font-size="13">iSCSI timeline: {} PDUs on {} connection(s), {:.6} s; shaded: no packet for at least {} us</text>"#,
        a.pdus.len(),
        a.connections.len(),
        span / 1e9,
        opts.idle_gap_ns / 1000
    );
    // Lane labels stay outside the zoomed group.
    for (ci, c) in a.connections.iter().enumerate() {
        let y0 = TOP + ci as f64 * conn_h;
        for (li, dir) in [Dir::ToTarget, Dir::ToInitiator].iter().enumerate() {
            let y = y0 + li as f64 * (LANE_H + CMD_H);
            let _ = write!(
                s,
                r#"<text x="6" y="{:.1}">c{} {} {}</text>"#,
                y + LANE_H * 0.65,
                c.id,
                dir.arrow(),
                xml_escape(&match dir {
                    Dir::ToTarget => c.target.to_string(),
                    Dir::ToInitiator => c.initiator.to_string(),
                })
            );
        }
    }
    s.push_str(r#"<g clip-path="url(#plotclip)"><g id="zoom">"#);
    for (ci, c) in a.connections.iter().enumerate() {
        let y0 = TOP + ci as f64 * conn_h;
        let lane_y = |d: Dir| match d {
            Dir::ToTarget => y0,
            Dir::ToInitiator => y0 + LANE_H + CMD_H,
        };
        // Idle gaps: between consecutive payload packets of this connection.
        let mut times: Vec<u64> = c.packets.iter().map(|p| p.ts_ns).collect();
        times.sort_unstable();
        for w in times.windows(2) {
            if w[1] - w[0] >= opts.idle_gap_ns {
                let (x0, x1) = (sc.x(w[0]), sc.x(w[1]));
                let _ = write!(
                    s,
                    r##"<rect class="idle" x="{x0:.3}" y="{y0:.1}" width="{:.3}" height="{:.1}" fill="#dddddd"><title>idle {:.1} us</title></rect>"##,
                    (x1 - x0).max(0.0),
                    2.0 * LANE_H + CMD_H,
                    (w[1] - w[0]) as f64 / 1e3
                );
            }
        }
        for dir in [Dir::ToTarget, Dir::ToInitiator] {
            let _ = write!(
                s,
                r##"<g class="lane" data-conn="{}" data-dir="{}"><line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#999" stroke-width="0.5" vector-effect="non-scaling-stroke"/>"##,
                c.id,
                dir.arrow(),
                WIDTH - RIGHT,
                y = lane_y(dir) + LANE_H / 2.0
            );
            for p in a.pdus.iter().filter(|p| p.conn == c.id && p.dir == dir) {
                let x0 = sc.x(p.first_ts_ns);
                let x1 = sc.x(p.ts_ns);
                let _ = write!(
                    s,
                    r#"<rect class="pdu" data-i="{}" x="{x0:.3}" y="{:.1}" width="{:.3}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                    p.index,
                    lane_y(dir) + 3.0,
                    (x1 - x0).max(0.6),
                    LANE_H - 6.0,
                    colour(p.opcode),
                    xml_escape(pdu_line(p).trim())
                );
            }
            s.push_str("</g>");
        }
        // Command spans between the two lanes.
        let cy = y0 + LANE_H + 2.0;
        for k in cmds.iter().filter(|k| k.conn == c.id) {
            let end = k.end_ns.unwrap_or(a.end_ns);
            let (x0, x1) = (sc.x(k.start_ns), sc.x(end));
            let _ = write!(
                s,
                r##"<rect class="cmd" x="{x0:.3}" y="{cy:.1}" width="{:.3}" height="{:.1}" fill="#4e79a7" fill-opacity="0.35" stroke="#4e79a7" stroke-width="0.5" vector-effect="non-scaling-stroke"><title>{} ITT 0x{:08x}: {}</title></rect>"##,
                (x1 - x0).max(0.6),
                CMD_H - 4.0,
                xml_escape(&k.cdb),
                k.itt,
                k.latency_us
                    .map_or("no response in capture".to_string(), |l| format!(
                        "{l:.1} us, idle {:.1} us",
                        k.idle_us
                    ))
            );
        }
        // TCP anomalies.
        for (dir, e) in &c.tcp_events {
            let label = match e.kind {
                TcpEventKind::Retransmission => "retransmission",
                TcpEventKind::LostRetransmitted => "lost segment, retransmitted",
                TcpEventKind::OutOfOrder => "segment after a hole",
                TcpEventKind::Unrecovered => "bytes never captured",
            };
            let x = sc.x(e.ts_ns);
            let y = lane_y(*dir);
            let _ = write!(
                s,
                r##"<rect class="tcp-event" data-kind="{:?}" x="{:.3}" y="{y:.1}" width="2" height="{LANE_H}" fill="#e15759"><title>{label}: frame {} stream offset {} len {}</title></rect>"##,
                e.kind,
                x - 1.0,
                e.frame,
                e.offset,
                e.len
            );
        }
    }
    s.push_str("</g></g>");
    // Time axis (recomputed by the HTML page's script when zooming).
    let axis_y = height - 24.0;
    let _ = write!(
        s,
        r##"<g id="axis"><line x1="{LEFT}" x2="{}" y1="{axis_y}" y2="{axis_y}" stroke="#333"/>"##,
        WIDTH - RIGHT
    );
    let secs = span / 1e9;
    let step = nice_step(secs / 8.0);
    let mut k = 0.0;
    // At most about 12 ticks by construction of `step`.
    while k <= secs + step * 1e-9 && step > 0.0 {
        let x = LEFT + k / secs * (WIDTH - LEFT - RIGHT);
        let _ = write!(
            s,
            r##"<line x1="{x:.2}" x2="{x:.2}" y1="{axis_y}" y2="{}" stroke="#333"/><text x="{x:.2}" y="{}" text-anchor="middle">{}</text>"##,
            axis_y + 4.0,
            axis_y + 16.0,
            fmt_secs(k)
        );
        k += step;
    }
    s.push_str("</g></svg>\n");
    s
}

fn fmt_secs(s: f64) -> String {
    if s == 0.0 {
        "0".into()
    } else if s < 1e-3 {
        format!("{:.0} us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}
