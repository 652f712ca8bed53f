//! Byte offsets to 1-based line and column numbers, counted from the start of the file.
//!
//! Line breaks are `\n`, `\r\n` and a lone `\r` (the Hub's front-matter regex and YAML both accept
//! all three). Columns count Unicode scalar values, so a CJK card points at the right character.

use std::ops::Range;

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LineCol {
    pub line: usize,
    pub column: usize,
}

/// Index of line starts in one text, for turning byte offsets into [`LineCol`].
#[derive(Debug, Clone)]
pub struct LineIndex {
    starts: Vec<usize>,
    len: usize,
}

impl LineIndex {
    pub fn new(text: &str) -> Self {
        let bytes = text.as_bytes();
        let mut starts = vec![0];
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'\n' => starts.push(i + 1),
                b'\r' if bytes.get(i + 1) != Some(&b'\n') => starts.push(i + 1),
                _ => {}
            }
            i += 1;
        }
        Self {
            starts,
            len: text.len(),
        }
    }

    /// Line and column of a byte offset; offsets past the end clamp to the end.
    pub fn line_col(&self, text: &str, offset: usize) -> LineCol {
        let offset = offset.min(self.len);
        let line0 = match self.starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let start = self.starts[line0];
        let column = text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count())
            + 1;
        LineCol {
            line: line0 + 1,
            column,
        }
    }

    /// Byte range of a 1-based line without its line break.
    pub fn line_range(&self, text: &str, line: usize) -> Range<usize> {
        let start = self.starts[(line - 1).min(self.starts.len() - 1)];
        let rest = &text[start..];
        let end = rest.find(['\n', '\r']).map_or(text.len(), |i| start + i);
        start..end
    }

    pub fn line_count(&self) -> usize {
        self.starts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_lines_for_all_three_line_breaks() {
        let text = "a\nb\r\nc\rd";
        let index = LineIndex::new(text);
        assert_eq!(index.line_count(), 4);
        assert_eq!(index.line_col(text, 0), LineCol { line: 1, column: 1 });
        assert_eq!(index.line_col(text, 2), LineCol { line: 2, column: 1 });
        assert_eq!(index.line_col(text, 5), LineCol { line: 3, column: 1 });
        assert_eq!(index.line_col(text, 7), LineCol { line: 4, column: 1 });
        assert_eq!(index.line_range(text, 2), 2..3);
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        let text = "名前: x";
        let index = LineIndex::new(text);
        let offset = text.find('x').unwrap();
        assert_eq!(index.line_col(text, offset), LineCol { line: 1, column: 5 });
    }
}
