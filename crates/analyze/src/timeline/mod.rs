//! Timelines of a capture: [`svg`] draws a static SVG (one element per PDU, for small
//! captures and documents); [`html`] writes a self-contained page that embeds the capture as
//! compact columns ([`data`]) and draws them on a canvas with plain JavaScript: PDU lanes,
//! a command lane and time-series lanes per connection, aggregated per pixel column when
//! zoomed out, so that captures of a million PDUs stay usable.

pub mod data;
mod html;
mod svg;

pub use data::{TcpInfoMatch, TcpInfoTrace};
pub use html::html;
pub use svg::svg;
