//! Plain-text tables for the terminal.

/// Renders rows under a header, columns padded; numeric-looking cells are right-aligned.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let numeric =
        |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || ".-%,".contains(c));
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        // Cells beyond the header have no column: they are dropped, not a panic.
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, &w)| {
                if numeric(c) {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    out.push_str(
        &widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  "),
    );
    out.push('\n');
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}
