//! SVG flame graphs from folded lines, with inferno.

use std::io::Write;

use anyhow::{Context, Result};
use inferno::flamegraph::{self, Options};

pub fn write_svg(title: &str, count_name: &str, lines: &[String], out: impl Write) -> Result<()> {
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.count_name = count_name.to_string();
    if lines.is_empty() {
        // inferno refuses empty input; an empty graph that says so is more useful.
        let placeholder = ["no samples 1".to_string()];
        return flamegraph::from_lines(&mut opts, placeholder.iter().map(String::as_str), out)
            .context("render flame graph");
    }
    flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out)
        .context("render flame graph")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_svg_with_frames() {
        let mut buf = Vec::new();
        write_svg(
            "CPU",
            "samples",
            &["p-1/1;main;hot_a 70".into(), "p-1/2;main;hot_b 30".into()],
            &mut buf,
        )
        .unwrap();
        let svg = String::from_utf8(buf).unwrap();
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("hot_a") && svg.contains("hot_b"));
    }
}
