//! Plain-text tables for terminals: a header row, aligned columns, numbers
//! right-aligned, text left-aligned.

use std::fmt;

/// A table built row by row and rendered with [`fmt::Display`].
#[derive(Debug, Clone, Default)]
pub struct Table {
    title: Option<String>,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headings.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Table {
            title: None,
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Sets a title printed above the table.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Appends a row; missing cells render empty, extra cells are kept.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Self {
        self.rows.push(cells.into_iter().map(Into::into).collect());
        self
    }

    /// Number of data rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the table has no data rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

fn numeric(s: &str) -> bool {
    let t = s.trim_end_matches(['%', 'x']);
    !t.is_empty() && t.parse::<f64>().is_ok()
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cols = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.header.len()])
            .max()
            .unwrap_or(0);
        let mut width = vec![0usize; cols];
        for row in self.rows.iter().chain([&self.header]) {
            for (i, c) in row.iter().enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        if let Some(t) = &self.title {
            writeln!(f, "{t}")?;
        }
        let line = |f: &mut fmt::Formatter<'_>, row: &[String], align_numbers: bool| {
            let mut out = String::new();
            for (i, w) in width.iter().enumerate() {
                let c = row.get(i).map(String::as_str).unwrap_or("");
                if i > 0 {
                    out.push_str("  ");
                }
                // Padded by hand: `format!`'s width is a u16 and panics
                // past 65,535, and a cell may be any length (a name).
                let pad = w.saturating_sub(c.chars().count());
                if align_numbers && numeric(c) {
                    out.extend(std::iter::repeat_n(' ', pad));
                    out.push_str(c);
                } else {
                    out.push_str(c);
                    out.extend(std::iter::repeat_n(' ', pad));
                }
            }
            writeln!(f, "{}", out.trim_end())
        };
        line(f, &self.header, false)?;
        let rule: Vec<String> = width.iter().map(|&w| "-".repeat(w)).collect();
        line(f, &rule, false)?;
        for row in &self.rows {
            line(f, row, true)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(["method", "share"]).title("T");
        t.row(["maglev", "0.1%"]).row(["karger-long", "12.25"]);
        let s = t.to_string();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "T");
        assert_eq!(lines[1], "method       share");
        assert_eq!(lines[2], "-----------  -----");
        assert_eq!(lines[3], "maglev        0.1%");
        assert_eq!(lines[4], "karger-long  12.25");
        assert_eq!(t.len(), 2);
    }

    /// A cell wider than `format!` can pad (65,535) is printed whole, its
    /// column as wide, numbers still right-aligned under it.
    #[test]
    fn cells_wider_than_a_u16_are_printed() {
        let long = "n".repeat(70_000);
        let mut t = Table::new(["name", "packets"]);
        t.row([long.as_str(), "1"]).row(["a", "22"]);
        t.row(["b".to_string(), "3".repeat(70_001)]);
        let s = t.to_string();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[1].len(), 70_000 + 2 + 70_001);
        assert_eq!(lines[2], format!("{long}  {}1", " ".repeat(70_000)));
        assert_eq!(
            lines[3],
            format!("a{}  {}22", " ".repeat(69_999), " ".repeat(69_999))
        );
    }
}
