//! From the kernel's time sums to per-thread breakdowns. Pure: no BPF, no /proc.
//!
//! A thread instance is (tid, born_ns), so a recycled tid is a different thread. Its alive
//! time runs from `born_ns` (its creation, or the seeding at attach) to its death or the end of
//! the window; the categories come from the charged intervals plus the interval still open at
//! the end, which is charged here exactly as the kernel would have charged it.

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use tracer_common::{
    time::Category,
    wall::{LifeKey, LifeVal, ThreadState, WallKey, WallVal},
};

use super::classify::Verdict;
use crate::report::model::time::{CategoryTime, ReasonTime, TimeBreakdown};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub key: WallKey,
    pub val: WallVal,
}

/// The tid of rows that stand for a process's folded threads (`FoldedLives`): no traced
/// thread has it (the idle task has no state).
pub const FOLDED_TID: u32 = 0;
/// What names them where a thread's name goes (flame graphs, GIL waiters).
pub const FOLDED_COMM: &str = "exited-threads";

/// Exited threads of one process whose time rows were summed into the process's rows (tid
/// [`FOLDED_TID`]) to bound gputrace's memory: how many, their lives summed, and their tids
/// (bounded by the pid space; what tells a folded thread that also has CPU samples, or an
/// instance of its tid kept whole, from one the report would not otherwise count).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FoldedLives {
    pub threads: u64,
    pub alive_ns: u64,
    pub tids: std::collections::BTreeSet<u32>,
}

/// A map of a few entries, kept as a vector: a thread's categories and reasons are a handful
/// each, and a `BTreeMap` allocates a node of 11 slots for its first entry (~0.5 KB for a
/// thread's reasons: 150 MB of a 3-minute shell loop's report, 170,000 thread instances).
#[derive(Debug, Clone, PartialEq)]
pub struct Few<K, V>(Vec<(K, V)>);

impl<K, V> Default for Few<K, V> {
    fn default() -> Self {
        Few(Vec::new())
    }
}

impl<K: PartialEq, V: Default> Few<K, V> {
    /// `k`'s value, made (default) if it has none.
    pub fn entry(&mut self, k: K) -> &mut V {
        let i = match self.0.iter().position(|(x, _)| *x == k) {
            Some(i) => i,
            None => {
                self.0.push((k, V::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[i].1
    }

    pub fn get(&self, k: &K) -> Option<&V> {
        self.0.iter().find(|(x, _)| x == k).map(|(_, v)| v)
    }
}

impl<K, V> Few<K, V> {
    /// In the order the entries were made.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }
}

impl<K: PartialEq, V: Default> std::ops::Index<&K> for Few<K, V> {
    type Output = V;
    fn index(&self, k: &K) -> &V {
        self.get(k).expect("no such entry")
    }
}

/// One thread instance's time, or the folded threads of a process (tid [`FOLDED_TID`]: its
/// `end_ns` is then their lives summed, from `born_ns` 0).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadTime {
    pub tgid: u32,
    pub tid: u32,
    pub born_ns: u64,
    pub end_ns: u64,
    pub exited: bool,
    pub categories: Few<Category, u64>,
    /// (category, reason) -> (ns, intervals). A reason is shared by every thread that has it
    /// (see [`threads`]).
    pub reasons: Few<(Category, Arc<str>), (u64, u64)>,
}

impl ThreadTime {
    pub fn alive_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.born_ns)
    }
    pub fn accounted_ns(&self) -> u64 {
        self.categories.values().sum()
    }
}

/// The rows the kernel would write if the thread's running interval closed at `end` and it
/// wrote out the time it holds (`ThreadState::held_cpu`).
pub fn open_rows(tid: u32, st: &ThreadState, end: u64) -> impl Iterator<Item = Row> {
    let running = Row {
        key: st.row_key(tid),
        val: WallVal {
            ns: end.saturating_sub(st.start_ns),
            count: 1,
        },
    };
    st.held_rows(tid)
        .into_iter()
        .filter(|(_, v)| v.count != 0)
        .map(|(key, val)| Row { key, val })
        .chain(std::iter::once(running))
}

/// Builds every thread instance's time. `rows` are the kernel's sums, `open` the states of
/// threads alive at `end`, `deaths` the threads that died, `folded` the exited threads each
/// process's [`FOLDED_TID`] rows stand for; `classify` names a row's category.
pub fn threads(
    rows: &[Row],
    open: &[(u32, ThreadState)],
    deaths: &[(LifeKey, LifeVal)],
    folded: &BTreeMap<u32, FoldedLives>,
    end: u64,
    mut classify: impl FnMut(&WallKey) -> Verdict,
) -> Vec<ThreadTime> {
    let mut out: BTreeMap<(u32, u64), ThreadTime> = BTreeMap::new();
    fn entry(
        out: &mut BTreeMap<(u32, u64), ThreadTime>,
        end: u64,
        (tgid, tid, born): (u32, u32, u64),
    ) -> &mut ThreadTime {
        out.entry((tid, born)).or_insert_with(|| ThreadTime {
            tgid,
            tid,
            born_ns: born,
            end_ns: end,
            ..Default::default()
        })
    }
    // Keyed (FOLDED_TID, tgid): one per process, and no thread instance has tid 0.
    for (tgid, f) in folded {
        out.insert(
            (FOLDED_TID, *tgid as u64),
            ThreadTime {
                tgid: *tgid,
                tid: FOLDED_TID,
                born_ns: 0,
                end_ns: f.alive_ns,
                exited: true,
                ..Default::default()
            },
        );
    }
    for (k, v) in deaths {
        let t = entry(&mut out, end, (v.tgid, k.tid, k.born_ns));
        t.end_ns = v.died_ns.min(end);
        t.exited = true;
    }
    let open_rows: Vec<Row> = open
        .iter()
        .flat_map(|(tid, st)| open_rows(*tid, st, end))
        .collect();
    // One copy of each reason for all the threads that have it: most are a few words that
    // thousands of short threads share ("on-CPU", "wait4").
    let mut said: HashSet<Arc<str>> = HashSet::new();
    for r in rows.iter().chain(open_rows.iter()) {
        let v = classify(&r.key);
        let reason = match said.get(v.reason.as_str()) {
            Some(a) => a.clone(),
            None => {
                let a: Arc<str> = v.reason.into();
                said.insert(a.clone());
                a
            }
        };
        let t = if r.key.tid == FOLDED_TID {
            out.entry((FOLDED_TID, r.key.tgid as u64))
                .or_insert_with(|| ThreadTime {
                    tgid: r.key.tgid,
                    exited: true,
                    ..Default::default()
                })
        } else {
            entry(&mut out, end, (r.key.tgid, r.key.tid, r.key.born_ns))
        };
        *t.categories.entry(v.category) += r.val.ns;
        let e = t.reasons.entry((v.category, reason));
        e.0 += r.val.ns;
        e.1 += r.val.count;
    }
    out.into_values().collect()
}

/// Sums thread instances (of one tid, or of a whole process) into one breakdown.
pub fn breakdown<'a>(
    parts: impl IntoIterator<Item = &'a ThreadTime>,
    cpu_user_percent: Option<f64>,
) -> TimeBreakdown {
    let mut alive = 0u64;
    let mut cats: BTreeMap<Category, u64> = BTreeMap::new();
    let mut reasons: BTreeMap<(Category, Arc<str>), (u64, u64)> = BTreeMap::new();
    for t in parts {
        alive += t.alive_ns();
        for (c, ns) in t.categories.iter() {
            *cats.entry(*c).or_default() += ns;
        }
        for (k, (ns, n)) in t.reasons.iter() {
            let e = reasons.entry(k.clone()).or_default();
            e.0 += ns;
            e.1 += n;
        }
    }
    let pct = |ns: u64| {
        if alive == 0 {
            0.0
        } else {
            100.0 * ns as f64 / alive as f64
        }
    };
    let mut categories: Vec<CategoryTime> = cats
        .iter()
        .filter(|(_, ns)| **ns > 0)
        .map(|(c, ns)| CategoryTime {
            category: c.name().to_string(),
            ns: *ns,
            percent: pct(*ns),
        })
        .collect();
    categories.sort_by_key(|x| std::cmp::Reverse(x.ns));
    let mut reasons: Vec<ReasonTime> = reasons
        .into_iter()
        .filter(|(_, (ns, _))| *ns > 0)
        .map(|((c, reason), (ns, count))| ReasonTime {
            category: c.name().to_string(),
            reason: reason.to_string(),
            ns,
            count,
        })
        .collect();
    reasons.sort_by_key(|x| std::cmp::Reverse(x.ns));
    TimeBreakdown {
        alive_ns: alive,
        accounted_ns: cats.values().sum(),
        categories,
        cpu_user_percent,
        reasons,
    }
}

/// True when the categories sum to the alive time within `tolerance` (a fraction).
pub fn invariant_holds(b: &TimeBreakdown, tolerance: f64) -> bool {
    let diff = b.alive_ns.abs_diff(b.accounted_ns) as f64;
    diff <= tolerance * b.alive_ns.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{
        time::NO_OVERRIDE,
        wall::{KIND_BLOCKED, PHASE_BLOCKED, PHASE_ONCPU, PHASE_RUNNABLE, RQ_WOKEN},
    };

    fn row(tid: u32, born: u64, kind: u32, ns: u64) -> Row {
        Row {
            key: WallKey {
                born_ns: born,
                tgid: 1,
                tid,
                kind,
                sys_nr: 202,
                kstack: -1,
                ustack: -1,
                state: 1,
                fd1: 0,
                pystack: 0,
                gil: 0,
            },
            val: WallVal { ns, count: 1 },
        }
    }

    fn state(born: u64, start: u64, phase: u32) -> ThreadState {
        ThreadState {
            start_ns: start,
            off_state: 1,
            off_sys_nr: 230,
            ..ThreadState::new(born, 1, 1, phase)
        }
    }

    fn classify(k: &WallKey) -> Verdict {
        let category = if k.kind == KIND_BLOCKED {
            Category::Lock
        } else {
            Category::from_u32(k.kind).unwrap()
        };
        Verdict {
            category,
            reason: "r".into(),
        }
    }

    #[test]
    fn straddling_the_window_start_and_end() {
        // Seeded at 100 (window start) while blocked; blocked until 400, on CPU since 400,
        // and still on CPU at the end (1000): the open interval is charged up to the end.
        let rows = [row(7, 100, KIND_BLOCKED, 300)];
        let open = [(7, state(100, 400, PHASE_ONCPU))];
        let t = threads(&rows, &open, &[], &BTreeMap::new(), 1000, classify);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].alive_ns(), 900);
        assert_eq!(t[0].categories[&Category::Lock], 300);
        assert_eq!(t[0].categories[&Category::Cpu], 600);
        let b = breakdown(&t, None);
        assert!(invariant_holds(&b, 0.01));
        assert_eq!(b.categories[0].category, "cpu");
        assert!((b.categories[0].percent - 66.666).abs() < 0.01);
    }

    fn open_row(tid: u32, st: &ThreadState, end: u64) -> Row {
        let rows: Vec<Row> = open_rows(tid, st, end).collect();
        assert_eq!(rows.len(), 1, "nothing held");
        rows[0]
    }

    #[test]
    fn held_time_is_charged_with_the_open_interval() {
        // A launch loop between two switch-outs: 5 on-CPU stretches (40 ns) and 4 calls of one
        // CUDA site (60 ns) held in the state, and a call in progress since 900.
        let mut st = state(0, 900, PHASE_ONCPU);
        st.held_cpu = WallVal { ns: 40, count: 5 };
        st.held_cuda = WallVal { ns: 60, count: 4 };
        st.held_cat = Category::CudaLaunch as u32;
        st.held_fid = 7;
        st.held_pystack = 11;
        st.override_cat = Category::CudaLaunch as u32;
        st.cuda_fid = 7;
        st.cuda_pystack = 11;
        let rows: Vec<Row> = open_rows(3, &st, 1000).collect();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].key, st.cpu_key(3));
        assert_eq!(rows[0].val, WallVal { ns: 40, count: 5 });
        assert_eq!(
            rows[1].key,
            st.row_key(3),
            "the held CUDA row is the running call's"
        );
        assert_eq!(rows[1].val, WallVal { ns: 60, count: 4 });
        assert_eq!(rows[2].val, WallVal { ns: 100, count: 1 });
        assert!(st.running_is_held_cuda());
        let t = threads(&[], &[(3, st)], &[], &BTreeMap::new(), 1000, classify);
        assert_eq!(t[0].categories[&Category::Cpu], 40);
        assert_eq!(t[0].categories[&Category::CudaLaunch], 160);
        st.cuda_fid = 8;
        assert!(
            !st.running_is_held_cuda(),
            "another function is another row"
        );
    }

    #[test]
    fn held_wait_time_is_charged_under_the_rows_of_its_wait() {
        // A reader that blocked three times in one read (30 ns blocked, 6 ns runnable held),
        // written to a WALL row once before (20 ns), and on CPU since 900.
        let mut st = state(0, 900, PHASE_ONCPU);
        st.off_kstack = 4;
        st.hold_current_wait();
        st.held_blocked = WallVal { ns: 30, count: 3 };
        st.held_runqueue = WallVal { ns: 6, count: 3 };
        let rows: Vec<Row> = open_rows(3, &st, 1000).collect();
        assert_eq!(rows.len(), 3, "two held wait rows and the running one");
        let mut blocked = st;
        blocked.phase = PHASE_BLOCKED;
        let mut runnable = st;
        runnable.phase = PHASE_RUNNABLE;
        assert_eq!(rows[0].key, blocked.row_key(3), "the kernel's own row");
        assert_eq!(rows[0].val, WallVal { ns: 30, count: 3 });
        assert_eq!(rows[1].key, runnable.row_key(3));
        assert_eq!(rows[1].key.state, RQ_WOKEN);
        let written = Row {
            key: blocked.row_key(3),
            val: WallVal { ns: 20, count: 2 },
        };
        let t = threads(
            &[written],
            &[(3, st)],
            &[],
            &BTreeMap::new(),
            1000,
            classify,
        );
        assert_eq!(t[0].categories[&Category::Lock], 50);
        assert_eq!(t[0].categories[&Category::Runqueue], 6);
        assert_eq!(t[0].categories[&Category::Cpu], 100);
        assert_eq!(t[0].reasons[&(Category::Lock, Arc::from("r"))], (50, 5));
    }

    #[test]
    fn open_interval_keeps_its_phase() {
        let mut st = state(0, 50, PHASE_RUNNABLE);
        let r = open_row(3, &st, 80);
        assert_eq!(r.key.kind, Category::Runqueue as u32);
        assert_eq!(r.key.state, RQ_WOKEN);
        assert_eq!(r.val.ns, 30);
        st.override_cat = Category::CudaSync as u32;
        assert_eq!(open_row(3, &st, 80).key.kind, Category::CudaSync as u32);
        st.override_cat = NO_OVERRIDE;
        st.phase = PHASE_BLOCKED;
        let r = open_row(3, &st, 80);
        assert_eq!((r.key.kind, r.key.sys_nr), (KIND_BLOCKED, 230));
    }

    #[test]
    fn threads_starting_and_exiting_mid_trace() {
        // Born at 300, died at 700: alive 400 whatever the window.
        let rows = [
            row(9, 300, Category::Runqueue as u32, 10),
            row(9, 300, Category::Cpu as u32, 290),
            row(9, 300, KIND_BLOCKED, 100),
        ];
        let deaths = [(
            LifeKey {
                born_ns: 300,
                tid: 9,
                _pad: 0,
            },
            LifeVal {
                died_ns: 700,
                tgid: 1,
                _pad: 0,
                comm: [0; 16],
            },
        )];
        let t = threads(&rows, &[], &deaths, &BTreeMap::new(), 1000, classify);
        assert_eq!(t.len(), 1);
        assert!(t[0].exited);
        assert_eq!(t[0].alive_ns(), 400);
        assert_eq!(t[0].accounted_ns(), 400);
    }

    #[test]
    fn reused_tid_is_two_threads() {
        // tid 5 lived 0..200, then a new thread got tid 5 at 500 and is alive at 1000.
        let rows = [
            row(5, 0, Category::Cpu as u32, 200),
            row(5, 500, KIND_BLOCKED, 100),
        ];
        let deaths = [(
            LifeKey {
                born_ns: 0,
                tid: 5,
                _pad: 0,
            },
            LifeVal {
                died_ns: 200,
                tgid: 1,
                _pad: 0,
                comm: [0; 16],
            },
        )];
        let open = [(5, state(500, 600, PHASE_ONCPU))];
        let t = threads(&rows, &open, &deaths, &BTreeMap::new(), 1000, classify);
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].born_ns, t[0].alive_ns(), t[0].accounted_ns()),
            (0, 200, 200)
        );
        assert_eq!(
            (t[1].born_ns, t[1].alive_ns(), t[1].accounted_ns()),
            (500, 500, 500)
        );
        // Merged per tid for the report, the invariant still holds.
        let b = breakdown(&t, None);
        assert_eq!((b.alive_ns, b.accounted_ns), (700, 700));
    }

    #[test]
    fn folded_threads_count_their_lives_in_their_process() {
        // Two exited threads of process 1 folded (lives 300 + 100), one live thread beside them.
        let rows = [
            row(FOLDED_TID, 0, Category::Cpu as u32, 250),
            row(FOLDED_TID, 0, KIND_BLOCKED, 150),
            row(4, 0, Category::Cpu as u32, 1000),
        ];
        let folded = BTreeMap::from([(
            1,
            FoldedLives {
                threads: 2,
                alive_ns: 400,
                tids: [5, 6].into(),
            },
        )]);
        let t = threads(&rows, &[], &[], &folded, 1000, classify);
        assert_eq!(t.len(), 2);
        let f = t.iter().find(|t| t.tid == FOLDED_TID).unwrap();
        assert_eq!((f.alive_ns(), f.accounted_ns()), (400, 400));
        assert!(f.exited);
        let b = breakdown(&t, None);
        assert_eq!((b.alive_ns, b.accounted_ns), (1400, 1400));
        assert!(invariant_holds(&b, 0.01));
    }

    #[test]
    fn a_gap_breaks_the_invariant() {
        let rows = [row(1, 0, Category::Cpu as u32, 500)];
        let t = threads(&rows, &[], &[], &BTreeMap::new(), 1000, classify);
        assert!(!invariant_holds(&breakdown(&t, None), 0.01));
    }
}
