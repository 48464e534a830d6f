//! Snapshot checks for rendered output: the expected text lives in `report/snapshots/NAME`.
//! `GPUTRACE_BLESS=1 cargo test` rewrites the files after a deliberate change; review the diff.

use std::path::PathBuf;

pub fn check(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/report/snapshots")
        .join(name);
    if std::env::var_os("GPUTRACE_BLESS").is_some() {
        std::fs::write(&path, actual).expect("write snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "snapshot {} missing; run with GPUTRACE_BLESS=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "snapshot {name} differs at line {}:\n--- expected\n{}\n--- actual\n{}\n\
             (GPUTRACE_BLESS=1 rewrites it)",
            first + 1,
            expected.lines().nth(first).unwrap_or("<end>"),
            actual.lines().nth(first).unwrap_or("<end>")
        );
    }
}
