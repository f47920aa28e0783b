//! Plain-text tables for people: columns padded to their widest cell, two spaces apart.

/// Render `rows` (the first is the header); columns whose index is in `left` are aligned left,
/// the others (numbers) right.
pub(crate) fn render<const N: usize>(rows: &[[String; N]], left: &[usize]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, (cell, &w)) in row.iter().zip(&widths).enumerate() {
            if left.contains(&i) {
                line += &format!("{cell:<w$}  ");
            } else {
                line += &format!("{cell:>w$}  ");
            }
        }
        text += line.trim_end();
        text.push('\n');
    }
    text
}
