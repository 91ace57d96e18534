//! A results table: printed aligned for terminals, or written as CSV or JSON for other tools.

use std::fmt;

use serde_json::{Map, Value};

/// One table cell. Numbers are right-aligned in text output and become JSON numbers.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Text(String),
    Int(i64),
    /// A float printed with a fixed number of decimals.
    Float {
        value: f64,
        decimals: usize,
    },
}

impl Cell {
    /// A float cell printed with `decimals` digits after the point.
    pub fn float(value: f64, decimals: usize) -> Cell {
        Cell::Float { value, decimals }
    }

    fn is_numeric(&self) -> bool {
        !matches!(self, Cell::Text(_))
    }

    fn to_json(&self) -> Value {
        match self {
            Cell::Text(s) => Value::String(s.clone()),
            Cell::Int(i) => Value::from(*i),
            // JSON has no NaN/infinity: those become null.
            Cell::Float { value, .. } => serde_json::Number::from_f64(*value)
                .map(Value::Number)
                .unwrap_or(Value::Null),
        }
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Text(s) => f.write_str(s),
            Cell::Int(i) => write!(f, "{i}"),
            Cell::Float { value, decimals } => write!(f, "{value:.decimals$}"),
        }
    }
}

impl From<&str> for Cell {
    fn from(s: &str) -> Cell {
        Cell::Text(s.to_string())
    }
}
impl From<String> for Cell {
    fn from(s: String) -> Cell {
        Cell::Text(s)
    }
}
impl From<i64> for Cell {
    fn from(v: i64) -> Cell {
        Cell::Int(v)
    }
}
impl From<i32> for Cell {
    fn from(v: i32) -> Cell {
        Cell::Int(v.into())
    }
}
impl From<u32> for Cell {
    fn from(v: u32) -> Cell {
        Cell::Int(v.into())
    }
}
impl From<u64> for Cell {
    /// Values above `i64::MAX` are kept exactly as text.
    fn from(v: u64) -> Cell {
        i64::try_from(v).map_or_else(|_| Cell::Text(v.to_string()), Cell::Int)
    }
}
impl From<usize> for Cell {
    fn from(v: usize) -> Cell {
        Cell::from(v as u64)
    }
}
impl From<f64> for Cell {
    /// Three decimals; use [`Cell::float`] to choose.
    fn from(v: f64) -> Cell {
        Cell::float(v, 3)
    }
}

/// Column headers and rows of cells. Rows shorter than the header are padded with empty cells
/// when printed; longer rows are an error caught by [`Table::push_row`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    pub fn new<I, S>(headers: I) -> Table
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row. Panics if it has more cells than there are headers (a programming error).
    pub fn push_row<I, C>(&mut self, cells: I)
    where
        I: IntoIterator<Item = C>,
        C: Into<Cell>,
    {
        let row: Vec<Cell> = cells.into_iter().map(Into::into).collect();
        assert!(
            row.len() <= self.headers.len(),
            "row has {} cells but the table has {} columns",
            row.len(),
            self.headers.len()
        );
        self.rows.push(row);
    }

    fn cell(&self, row: usize, col: usize) -> Option<&Cell> {
        self.rows[row].get(col)
    }

    /// RFC 4180 CSV: a header line, then one line per row; fields holding a comma, quote or line
    /// break are quoted. Lines end with `\n`.
    pub fn to_csv(&self) -> String {
        fn field(out: &mut String, s: &str) {
            if s.contains([',', '"', '\n', '\r']) {
                out.push('"');
                out.push_str(&s.replace('"', "\"\""));
                out.push('"');
            } else {
                out.push_str(s);
            }
        }
        let mut out = String::new();
        for (i, h) in self.headers.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            field(&mut out, h);
        }
        out.push('\n');
        for r in 0..self.rows.len() {
            for c in 0..self.headers.len() {
                if c > 0 {
                    out.push(',');
                }
                if let Some(cell) = self.cell(r, c) {
                    field(&mut out, &cell.to_string());
                }
            }
            out.push('\n');
        }
        out
    }

    /// An array with one object per row, keyed by header; numeric cells are JSON numbers and
    /// missing cells are null.
    pub fn to_json(&self) -> Value {
        let rows = self
            .rows
            .iter()
            .map(|row| {
                let mut obj = Map::new();
                for (c, h) in self.headers.iter().enumerate() {
                    obj.insert(h.clone(), row.get(c).map_or(Value::Null, Cell::to_json));
                }
                Value::Object(obj)
            })
            .collect();
        Value::Array(rows)
    }

    /// [`Table::to_json`] pretty-printed.
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(&self.to_json()).expect("a JSON value always serializes")
    }
}

/// Aligned text: headers, a rule, rows; numeric columns right-aligned, text left-aligned.
impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ncols = self.headers.len();
        let texts: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|row| {
                (0..ncols)
                    .map(|c| row.get(c).map(|x| x.to_string()).unwrap_or_default())
                    .collect()
            })
            .collect();
        let widths: Vec<usize> = (0..ncols)
            .map(|c| {
                texts
                    .iter()
                    .map(|row| row[c].chars().count())
                    .chain(std::iter::once(self.headers[c].chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        // A column is numeric (right-aligned) when every non-empty cell in it is a number.
        let numeric: Vec<bool> = (0..ncols)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|row| row.get(c))
                    .all(Cell::is_numeric)
                    && self.rows.iter().any(|row| row.get(c).is_some())
            })
            .collect();
        let line = |f: &mut fmt::Formatter<'_>, cells: &[String]| -> fmt::Result {
            let mut out = String::new();
            for (c, text) in cells.iter().enumerate() {
                if c > 0 {
                    out.push_str("  ");
                }
                let w = widths[c];
                if numeric[c] {
                    out.push_str(&format!("{text:>w$}"));
                } else {
                    out.push_str(&format!("{text:<w$}"));
                }
            }
            writeln!(f, "{}", out.trim_end())
        };
        line(f, &self.headers)?;
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        line(f, &rule)?;
        for row in &texts {
            line(f, row)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new(["method", "size", "cycles/byte"]);
        t.push_row([Cell::from("sarwate"), 8192u64.into(), Cell::float(6.75, 2)]);
        t.push_row([
            Cell::from("hw, 3 streams"),
            512u64.into(),
            Cell::float(0.1, 2),
        ]);
        t
    }

    #[test]
    fn text_is_aligned_with_numbers_right() {
        let text = sample().to_string();
        let expected = "\
method         size  cycles/byte
-------------  ----  -----------
sarwate        8192         6.75
hw, 3 streams   512         0.10
";
        assert_eq!(text, expected);
    }

    #[test]
    fn csv_quotes_only_when_needed() {
        assert_eq!(
            sample().to_csv(),
            "method,size,cycles/byte\nsarwate,8192,6.75\n\"hw, 3 streams\",512,0.10\n"
        );
        let mut t = Table::new(["a\"b"]);
        t.push_row(["x\ny"]);
        assert_eq!(t.to_csv(), "\"a\"\"b\"\n\"x\ny\"\n");
    }

    #[test]
    fn json_is_array_of_objects_keyed_by_header() {
        let mut t = sample();
        t.push_row([Cell::from("short")]);
        let parsed: Value = serde_json::from_str(&t.to_json_string()).unwrap();
        assert_eq!(
            parsed,
            serde_json::json!([
                {"method": "sarwate", "size": 8192, "cycles/byte": 6.75},
                {"method": "hw, 3 streams", "size": 512, "cycles/byte": 0.1},
                {"method": "short", "size": null, "cycles/byte": null},
            ])
        );
    }

    #[test]
    fn non_finite_floats_become_null() {
        let mut t = Table::new(["x"]);
        t.push_row([f64::NAN]);
        assert_eq!(t.to_json(), serde_json::json!([{"x": null}]));
    }

    #[test]
    #[should_panic(expected = "row has 2 cells")]
    fn too_long_row_panics() {
        let mut t = Table::new(["only"]);
        t.push_row(["a", "b"]);
    }

    #[test]
    fn large_u64_is_kept_exactly() {
        assert_eq!(Cell::from(u64::MAX).to_string(), u64::MAX.to_string());
    }
}
