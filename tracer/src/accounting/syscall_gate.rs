//! The overhead budget for the syscall tracepoints: pure control logic, no BPF.
//!
//! While they are attached every syscall of every task on the machine takes the kernel's slow
//! path and runs two programs (~400 ns here), so a thread that makes a few hundred thousand
//! syscalls a second (`dd bs=1`, a `sched_yield` spin) pays more than half of its time for
//! them, far over the budget. Sampling them inside the programs would not help: the slow path
//! is paid as long as they are attached. So they are taken off.
//!
//! The kernel times each traced thread's syscalls in blocks of [`block_calls`]: a block that
//! took less than `SYS_STORM_WINDOW_NS` means the thread pays more than the budget, and the
//! program tells user space over the process-event ring, which it waits on, so the programs
//! come off within milliseconds of the block's end ([`SyscallGate::storm`]): a storm costs a
//! thread at most a block, the budget's worth of a second (as the launch gate's bucket). They
//! come back for a window [`FIRST_GAP_NS`] later ([`SyscallGate::tick`]); a window that sees
//! no storm for [`QUIET_NS`] keeps them on, one that sees a storm takes them off again and
//! doubles the wait, up to [`MAX_GAP_NS`]. A window costs a storming thread one block (the
//! kernel starts a new block when the programs come back), so the windows spend at most half
//! the budget.
//!
//! What the programs missed while off is not made up: syscall counts, latencies and per-file
//! I/O cover the time they were on (the report says how much), and time off CPU in that
//! stretch is classified from the kernel stack and task state alone.

use std::collections::BTreeMap;

use tracer_common::proc::SYS_STORM_WINDOW_NS;

/// What the two syscall programs run for per traced syscall: sys_enter 115-130 ns and
/// sys_exit 215-235 ns per hit in the data demo (BENCHMARKS.md), less for a getppid.
pub const PROGRAMS_NS: f64 = 350.0;

/// What one traced syscall costs with the syscall programs attached: their run time and the
/// slow path and dispatch of two tracepoint hits at `trap_ns` each (measured as they attach,
/// `overhead::syscall_trap`).
pub fn cost_ns(trap_ns: f64) -> f64 {
    PROGRAMS_NS + 2.0 * trap_ns
}

/// [`cost_ns`] at the built-in constant, where nothing was measured.
pub const SYSCALL_COST_NS: f64 = PROGRAMS_NS + 2.0 * crate::budget::SYSCALL_TRACEPOINT_NS;

/// The wait before the first window after a storm. A window costs a storming thread one block
/// (the budget's worth of a second, [`block_calls`]), so windows at least two seconds apart
/// spend at most half the budget.
pub const FIRST_GAP_NS: u64 = 2_000_000_000;
/// The longest wait between windows while storms go on.
pub const MAX_GAP_NS: u64 = 16_000_000_000;
/// A window with no storm for this long keeps the programs on: a storm fills a block in less
/// than the storm window.
pub const QUIET_NS: u64 = SYS_STORM_WINDOW_NS + 100_000_000;

/// The syscalls in a block (`SYS_STORM_CALLS_MAP`): as many as cost `budget` of the storm
/// window at `cost_ns` each ([`cost_ns`]). 0, which times nothing, when the budget never
/// samples.
pub fn block_calls(budget: f64, cost_ns: f64) -> u64 {
    if budget >= crate::budget::NO_SAMPLING {
        return 0;
    }
    ((budget * SYS_STORM_WINDOW_NS as f64 / cost_ns.max(1.0)) as u64).max(1)
}

/// What the caller does to the syscall programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    None,
    TakeOff,
    PutOn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    On,
    /// Off until `reopen_at`.
    Off {
        reopen_at: u64,
    },
    /// On again since `opened`, on trial.
    Window {
        opened: u64,
    },
}

/// A thread that stormed: its process and its fastest block of syscalls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Storm {
    pub pid: u32,
    pub took_ns: u64,
}

/// The share of a thread's time its syscall programs took in a block of `block` syscalls that
/// took `took_ns`, at `cost_ns` per syscall.
pub fn share(block: u64, cost_ns: f64, took_ns: u64) -> f64 {
    (block as f64 * cost_ns / took_ns.max(1) as f64).min(1.0)
}

#[derive(Debug)]
pub struct SyscallGate {
    block: u64,
    state: State,
    gap_ns: u64,
    /// When the current state began, and the time spent on and off so far.
    since: u64,
    on_ns: u64,
    off_ns: u64,
    windows: u32,
    first_off: Option<u64>,
    storms: BTreeMap<u32, Storm>,
}

/// What the gate did over the trace, for the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub on_ns: u64,
    pub off_ns: u64,
    pub windows: u32,
    /// CLOCK_MONOTONIC ns of the first time the programs came off.
    pub first_off: u64,
    /// Threads that stormed: tid -> storm.
    pub storms: BTreeMap<u32, Storm>,
}

impl SyscallGate {
    /// Programs on from `now`, timed in blocks of `block` syscalls ([`block_calls`]).
    pub fn new(block: u64, now: u64) -> SyscallGate {
        SyscallGate {
            block,
            state: State::On,
            gap_ns: FIRST_GAP_NS,
            since: now,
            on_ns: 0,
            off_ns: 0,
            windows: 0,
            first_off: None,
            storms: BTreeMap::new(),
        }
    }

    /// The syscalls in a block.
    pub fn block(&self) -> u64 {
        self.block
    }

    pub fn is_on(&self) -> bool {
        !matches!(self.state, State::Off { .. })
    }

    fn enter(&mut self, state: State, now: u64) {
        let spent = now.saturating_sub(self.since);
        if self.is_on() {
            self.on_ns += spent;
        } else {
            self.off_ns += spent;
        }
        self.since = now.max(self.since);
        self.state = state;
    }

    /// Thread `tid` of `pid` made a block of syscalls in `took_ns`; the programs stopped at
    /// `now` (the exit program stops them as it sees the block, `SYS_HALT_MAP`).
    pub fn storm(&mut self, now: u64, pid: u32, tid: u32, took_ns: u64) -> Action {
        let s = self.storms.entry(tid).or_insert(Storm { pid, took_ns });
        s.took_ns = s.took_ns.min(took_ns);
        self.halted(now)
    }

    /// The programs stopped themselves at `now`: off, as for a storm, also where its event
    /// was lost (the process-event ring was full).
    pub fn halted(&mut self, now: u64) -> Action {
        match self.state {
            // From before the window opened: read late, it says nothing of the window.
            State::Window { opened } if now < opened => Action::None,
            // Sent before the programs came off.
            State::Off { .. } => Action::None,
            State::On => {
                self.gap_ns = FIRST_GAP_NS;
                self.first_off.get_or_insert(now);
                self.enter(
                    State::Off {
                        reopen_at: now + self.gap_ns,
                    },
                    now,
                );
                Action::TakeOff
            }
            State::Window { .. } => {
                self.gap_ns = (self.gap_ns * 2).min(MAX_GAP_NS);
                self.enter(
                    State::Off {
                        reopen_at: now + self.gap_ns,
                    },
                    now,
                );
                Action::TakeOff
            }
        }
    }

    /// A tick at `now`: opens a window when the wait is over, keeps the programs on after a
    /// quiet one.
    pub fn tick(&mut self, now: u64) -> Action {
        match self.state {
            State::Off { reopen_at } if now >= reopen_at => {
                self.windows += 1;
                self.enter(State::Window { opened: now }, now);
                Action::PutOn
            }
            State::Window { opened } if now.saturating_sub(opened) >= QUIET_NS => {
                self.gap_ns = FIRST_GAP_NS;
                self.enter(State::On, now);
                Action::None
            }
            _ => Action::None,
        }
    }

    /// The trace ended at `now`: what the gate did, if it ever took the programs off.
    pub fn finish(&mut self, now: u64) -> Option<Summary> {
        self.enter(self.state, now);
        let first_off = self.first_off?;
        Some(Summary {
            on_ns: self.on_ns,
            off_ns: self.off_ns,
            windows: self.windows,
            first_off,
            storms: std::mem::take(&mut self.storms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_block_costs_the_budget_of_the_storm_window() {
        let n = block_calls(0.02, SYSCALL_COST_NS);
        let cost = n as f64 * SYSCALL_COST_NS;
        // 2% of a second, to within one call.
        assert!((cost - 20.0 * MS as f64).abs() <= SYSCALL_COST_NS, "{n}");
        assert_eq!(block_calls(1.0, SYSCALL_COST_NS), 0);
        assert_eq!(block_calls(1e-12, SYSCALL_COST_NS), 1);
        // At a measured trap of 25 ns per hit a syscall costs 400 ns: 50,000 to the block.
        assert_eq!(cost_ns(25.0), 400.0);
        assert_eq!(block_calls(0.02, cost_ns(25.0)), 50_000);
    }

    #[test]
    fn a_storm_takes_the_programs_off_and_windows_bring_them_back() {
        let mut g = SyscallGate::new(block_calls(0.02, SYSCALL_COST_NS), 0);
        assert_eq!(g.tick(100 * MS), Action::None);
        // The block took 40 ms: 25x the budget's pace.
        assert_eq!(g.storm(200 * MS, 10, 11, 40 * MS), Action::TakeOff);
        assert!(!g.is_on());
        // A late event from before the detach changes nothing.
        assert_eq!(g.storm(201 * MS, 10, 11, 45 * MS), Action::None);
        assert_eq!(g.tick(2100 * MS), Action::None);
        assert_eq!(g.tick(2200 * MS), Action::PutOn);
        // Storming still: off again, twice as long.
        assert_eq!(g.storm(2210 * MS, 10, 11, 40 * MS), Action::TakeOff);
        assert_eq!(g.tick(6200 * MS), Action::None);
        assert_eq!(g.tick(6210 * MS), Action::PutOn);
        // Quiet: on trial until QUIET_NS has passed, then on for good.
        assert_eq!(g.tick(7000 * MS), Action::None);
        assert_eq!(g.tick(7310 * MS), Action::None);
        assert!(g.is_on());
        // A new storm starts over with the first gap.
        assert_eq!(g.storm(9000 * MS, 10, 12, 80 * MS), Action::TakeOff);
        assert_eq!(g.tick(10999 * MS), Action::None);
        assert_eq!(g.tick(11000 * MS), Action::PutOn);
        let s = g.finish(11100 * MS).unwrap();
        assert_eq!(s.windows, 3);
        assert_eq!(s.first_off, 200 * MS);
        // Off: 200..2200, 2210..6210, 9000..11000.
        assert_eq!(s.off_ns, 8000 * MS);
        assert_eq!(s.on_ns, 3100 * MS);
        let worst = s.storms[&11];
        assert_eq!(
            worst,
            Storm {
                pid: 10,
                took_ns: 40 * MS
            }
        );
        // The 40 ms block: 20 ms of syscall cost in it.
        let half = share(
            block_calls(0.02, SYSCALL_COST_NS),
            SYSCALL_COST_NS,
            worst.took_ns,
        );
        assert!((half - 0.5).abs() < 0.01, "{half}");
        assert_eq!(s.storms[&12].took_ns, 80 * MS);
        assert_eq!(share(1000, 1000.0, 10), 1.0);
    }

    #[test]
    fn a_halt_read_late_takes_them_off_from_when_it_was() {
        let mut g = SyscallGate::new(1000, 0);
        // Found by a tick 80 ms after the programs stopped (its event lost): off from then.
        assert_eq!(g.halted(20 * MS), Action::TakeOff);
        assert_eq!(g.tick(2020 * MS), Action::PutOn);
        // An event stamped before the window opened says nothing of it.
        assert_eq!(g.storm(2021 * MS, 1, 1, MS), Action::TakeOff);
        assert_eq!(g.tick(6021 * MS), Action::PutOn);
        assert_eq!(g.halted(6000 * MS), Action::None);
        assert!(g.is_on());
        let s = g.finish(6100 * MS).unwrap();
        assert_eq!(s.off_ns, 6000 * MS);
        assert!(s.storms.contains_key(&1));
    }

    #[test]
    fn the_wait_doubles_up_to_its_cap() {
        let mut g = SyscallGate::new(1000, 0);
        let mut now = 0;
        let mut gaps = Vec::new();
        for _ in 0..6 {
            assert_eq!(g.storm(now, 1, 1, MS), Action::TakeOff);
            let off = now;
            loop {
                now += 100 * MS;
                if g.tick(now) == Action::PutOn {
                    break;
                }
            }
            gaps.push((now - off) / MS);
            now += 100 * MS;
        }
        assert_eq!(gaps, [2000, 4000, 8000, 16000, 16000, 16000]);
    }

    #[test]
    fn no_storm_no_summary() {
        let mut g = SyscallGate::new(1000, 0);
        assert_eq!(g.tick(10 * MS), Action::None);
        assert!(g.finish(20 * MS).is_none());
    }
}
