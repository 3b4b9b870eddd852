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

/// Lines of tab-separated cells aligned as Go's text/tabwriter aligns them
/// for talosctl (minimum width 0, padding 3, spaces): a column is as wide
/// as its widest cell over a run of consecutive lines that all have that
/// column, and the last cell of a line (not followed by a tab) is never
/// padded and widens nothing.
pub fn tabwrite(lines: &[String]) -> String {
    let cells: Vec<Vec<&str>> = lines.iter().map(|l| l.split('\t').collect()).collect();
    let mut out = String::new();
    let mut widths = Vec::new();
    format_block(&cells, 0, cells.len(), &mut widths, &mut out);
    out
}

/// Go's tabwriter `format`: aligns column `widths.len()` over each run of
/// lines in `line0..line1` that have a cell there, recursing for the next.
fn format_block(
    cells: &[Vec<&str>],
    mut line0: usize,
    line1: usize,
    widths: &mut Vec<usize>,
    out: &mut String,
) {
    let column = widths.len();
    let mut this = line0;
    while this < line1 {
        if column + 1 >= cells[this].len() {
            this += 1;
            continue;
        }
        write_lines(cells, line0, this, widths, out);
        line0 = this;
        let mut width = 0;
        while this < line1 && column + 1 < cells[this].len() {
            width = width.max(cells[this][column].chars().count() + 3);
            this += 1;
        }
        widths.push(width);
        format_block(cells, line0, this, widths, out);
        widths.pop();
        line0 = this;
    }
    write_lines(cells, line0, line1, widths, out);
}

fn write_lines(cells: &[Vec<&str>], from: usize, to: usize, widths: &[usize], out: &mut String) {
    for line in &cells[from..to] {
        for (j, cell) in line.iter().enumerate() {
            out.push_str(cell);
            if j + 1 < line.len() && j < widths.len() {
                let pad = widths[j].saturating_sub(cell.chars().count());
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::{Table, tabwrite};

    #[test]
    fn tabwrite_leaves_the_last_cell_alone_as_go_does() {
        // talosctl's events: a header, then an event on two lines.
        let lines: Vec<String> = [
            "NODE\tID\tEVENT\tACTOR\tSOURCE\tMESSAGE",
            "10.0.0.1\tabc\ttalos/runtime/machine.SequenceEvent",
            "\tboot\tSTART",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            tabwrite(&lines),
            "NODE       ID     EVENT   ACTOR   SOURCE   MESSAGE\n\
             10.0.0.1   abc    talos/runtime/machine.SequenceEvent\n           \
             boot   START\n"
        );
    }

    #[test]
    fn columns_align_with_three_spaces() {
        let mut t = Table::new(&["NODE", "ID"]);
        t.row(vec!["10.0.0.1".into(), "ab".into()]);
        assert_eq!(t.render(), "NODE       ID\n10.0.0.1   ab\n");
    }
}
