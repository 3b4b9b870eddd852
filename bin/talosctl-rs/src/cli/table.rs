//! Aligned columns, as Go's tabwriter prints them for talosctl (minimum
//! width 0, padding 3).

/// Collects rows and prints them with aligned columns.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with a header row.
    pub fn new(header: &[&str]) -> Table {
        Table {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text.
    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let last = row.len().saturating_sub(1);
            for (i, cell) in row.iter().enumerate() {
                out.push_str(cell);
                if i < last {
                    let pad = widths[i] - cell.chars().count() + 3;
                    out.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push('\n');
        }
        out
    }

    /// Prints the table unless it has only its header.
    pub fn print(&self) {
        if self.rows.len() > 1 {
            out!("{}", self.render());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn columns_align_with_three_spaces() {
        let mut t = Table::new(&["NODE", "ID"]);
        t.row(vec!["10.0.0.1".into(), "ab".into()]);
        assert_eq!(t.render(), "NODE       ID\n10.0.0.1   ab\n");
    }
}
