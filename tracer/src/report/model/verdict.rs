//! Findings of the verdict engine (issue 5). Schema: docs/report.md, rules: docs/verdicts.md.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Finding {
    /// Rule id, e.g. `data-loading-bound`, `launch-bound`.
    pub rule: String,
    /// `critical`, `high`, `medium`, `low`.
    pub severity: String,
    /// One sentence with the numbers, e.g. "the main thread waited 41% of wall time for ...".
    pub title: String,
    /// Estimated share of wall time at stake (0-100), used for ranking.
    pub impact_percent: f64,
    /// The numbers the finding rests on.
    pub evidence: Vec<String>,
    pub suggestions: Vec<String>,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
}
