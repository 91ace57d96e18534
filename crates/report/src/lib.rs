//! Presents benchmark results the same way across ironsan: aligned text tables that can also be
//! written as CSV or JSON ([`Table`]), SVG line plots and grouped bar charts ([`LinePlot`],
//! [`BarChart`]), and, re-exported from the `byte-size` crate, the helpers the benchmark
//! command lines use to print and parse sizes such as `8 KiB` or `128k` ([`format_size`],
//! [`parse_size`]). It does no I/O: every function returns a `String` or value for the
//! caller to print or write.

mod plot;
mod table;

pub use byte_size::{format_size, parse_size, SizeError};
pub use plot::{xml_escape, BarChart, BarSeries, LinePlot, Series, TickLabels};
pub use table::{Cell, Table};
