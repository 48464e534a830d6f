//! Human-readable numbers shared by the terminal, HTML, verdicts and diff, so a figure reads
//! the same everywhere.

/// `812 B`, `3.4 KB`, `1.2 GB` (decimal units, as disk and PCIe rates are quoted).
pub fn bytes(b: u64) -> String {
    let b = b as f64;
    const UNITS: [&str; 5] = ["KB", "MB", "GB", "TB", "PB"];
    if b < 1000.0 {
        return format!("{b:.0} B");
    }
    let mut v = b / 1000.0;
    let mut i = 0;
    // Past 999.95 a value prints as 1000.0: the next unit then.
    while v >= 999.95 && i < UNITS.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

/// Bytes per second from bytes over a duration in ns; `-` when the duration is zero.
pub fn rate(b: u64, ns: u64) -> String {
    if ns == 0 {
        return "-".into();
    }
    format!("{}/s", bytes((b as f64 * 1e9 / ns as f64) as u64))
}

/// `850 ns`, `12.3 µs`, `4.5 ms`, `2.31 s`.
pub fn dur(ns: u64) -> String {
    let n = ns as f64;
    // Each unit up to where its one decimal would print 1000.0.
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 999_950 {
        format!("{:.1} µs", n / 1e3)
    } else if ns < 999_950_000 {
        format!("{:.1} ms", n / 1e6)
    } else {
        format!("{:.2} s", n / 1e9)
    }
}

/// Count per second over a duration in ns.
pub fn per_sec(count: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        count as f64 * 1e9 / ns as f64
    }
}

/// `part` as a percentage of `whole` (0 when `whole` is 0).
pub fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// The first `most` of `items` joined by ", ", and how many more there are: `1, 2 and 3 more`.
pub fn some_of<T: std::fmt::Display>(
    items: impl IntoIterator<Item = T, IntoIter: ExactSizeIterator>,
    most: usize,
) -> String {
    let items = items.into_iter();
    let more = items.len().saturating_sub(most);
    let named: Vec<String> = items.take(most).map(|i| i.to_string()).collect();
    match more {
        0 => named.join(", "),
        n => format!("{} and {n} more", named.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn some_of_names_at_most_so_many_and_counts_the_rest() {
        assert_eq!(some_of([1, 2, 3], 5), "1, 2, 3");
        assert_eq!(some_of([1, 2, 3], 3), "1, 2, 3");
        assert_eq!(some_of([1, 2, 3, 4, 5], 2), "1, 2 and 3 more");
        assert_eq!(some_of(Vec::<u32>::new(), 2), "");
    }

    #[test]
    fn formats() {
        assert_eq!(bytes(812), "812 B");
        assert_eq!(bytes(3_400), "3.4 KB");
        assert_eq!(bytes(1_200_000_000), "1.2 GB");
        assert_eq!(rate(180_000_000, 1_000_000_000), "180.0 MB/s");
        assert_eq!(rate(1, 0), "-");
        assert_eq!(dur(850), "850 ns");
        assert_eq!(dur(12_300), "12.3 µs");
        assert_eq!(dur(4_500_000), "4.5 ms");
        assert_eq!(dur(2_310_000_000), "2.31 s");
        assert_eq!(pct(1, 4), 25.0);
        assert_eq!(pct(1, 0), 0.0);
        assert_eq!(per_sec(10, 2_000_000_000), 5.0);
        // Never 1000.0 of a unit.
        assert_eq!(bytes(999_990), "1.0 MB");
        assert_eq!(bytes(999_940), "999.9 KB");
        assert_eq!(bytes(999_990_000), "1.0 GB");
        assert_eq!(dur(999_990), "1.0 ms");
        assert_eq!(dur(999_940), "999.9 µs");
        assert_eq!(dur(999_990_000), "1.00 s");
    }
}
