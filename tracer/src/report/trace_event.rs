//! `trace.json` in the Chrome trace-event format (opens in Perfetto UI and chrome://tracing).
//!
//! One track per thread. Complete (`X`) events on one track must nest or follow each other, but
//! what the probes see can overlap without nesting (a CUDA call ending after a syscall it
//! started in, concurrent block I/O requests), so events that do not fit are moved to extra
//! "overlap" lanes of the same thread instead of producing a track viewers draw wrongly.

use std::{
    collections::{BTreeMap, HashMap},
    io::Write,
};

use anyhow::Result;
use serde_json::{json, Map, Value};

use super::{
    model::Report,
    timeline::{EventKind, Timeline, TimelineEvent},
};

/// Block I/O requests of a process go on a track of their own, not on a thread.
const BLOCK_TRACK: u64 = 9_000_000;
/// Overlap lane k of thread t is drawn as tid `t + k * LANE_STRIDE` (above any real tid).
const LANE_STRIDE: u64 = 10_000_000;
/// NVML counters belong to no traced process.
const GPU_PID: u64 = 0;

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn cat(k: EventKind) -> &'static str {
    match k {
        EventKind::OffCpu => "off_cpu",
        EventKind::Cuda => "cuda",
        EventKind::Syscall => "syscall",
        EventKind::BlockIo => "block_io",
        EventKind::Instant => "mark",
    }
}

fn args(ev: &TimelineEvent) -> Value {
    let mut m = Map::new();
    for (k, v) in &ev.args {
        m.insert(k.clone(), arg_value(v));
    }
    Value::Object(m)
}

/// An argument as JSON: a whole number as a number (Perfetto's queries can then sum bytes and
/// compare latencies: it keeps a string argument a string), anything else as text. So is a
/// number past 2^53, which JavaScript readers (the trace viewers) would round: a kernel
/// address or a flags word with its top bits set, passed as a syscall's first argument.
fn arg_value(v: &str) -> Value {
    const EXACT: u64 = 1 << 53;
    let digits = v.strip_prefix('-').unwrap_or(v);
    let plain = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    match v.parse::<i64>() {
        Ok(n) if plain && n.unsigned_abs() <= EXACT => Value::from(n),
        _ => Value::String(v.to_string()),
    }
}

/// Assigns each event of one track a lane so that events within a lane nest or follow.
/// `events` are sorted by (start, longer first).
fn lanes(events: &[&TimelineEvent]) -> Vec<usize> {
    let mut stacks: Vec<Vec<u64>> = Vec::new();
    let mut out = Vec::with_capacity(events.len());
    for ev in events {
        let end = ev.ts_ns + ev.dur_ns;
        let mut placed = None;
        for (i, stack) in stacks.iter_mut().enumerate() {
            while stack.last().is_some_and(|&e| e <= ev.ts_ns) {
                stack.pop();
            }
            if stack.last().is_none_or(|&e| end <= e) {
                stack.push(end);
                placed = Some(i);
                break;
            }
        }
        let lane = placed.unwrap_or_else(|| {
            stacks.push(vec![end]);
            stacks.len() - 1
        });
        out.push(lane);
    }
    out
}

/// Every trace event, metadata first, handed to `emit` one at a time: a full timeline
/// (200,000 events) built as one JSON tree took ~800 MB.
pub fn events(t: &Timeline, r: &Report, emit: &mut dyn FnMut(Value) -> Result<()>) -> Result<()> {
    let mut names: BTreeMap<(u64, u64), String> = BTreeMap::new();
    for p in &r.processes {
        emit(
            json!({"ph": "M", "name": "process_name", "pid": p.pid, "tid": 0, "ts": 0,
                        "args": {"name": format!("{} ({})", p.comm, p.pid)}}),
        )?;
        for th in &p.threads {
            names.insert((p.pid as u64, th.tid as u64), th.comm.clone());
        }
    }
    let mut tracks: HashMap<(u64, u64), Vec<&TimelineEvent>> = HashMap::new();
    let mut instants = Vec::new();
    for ev in &t.events {
        if ev.kind == EventKind::Instant {
            instants.push(ev);
            continue;
        }
        let tid = if ev.kind == EventKind::BlockIo {
            BLOCK_TRACK
        } else {
            ev.tid as u64
        };
        tracks.entry((ev.pid as u64, tid)).or_default().push(ev);
    }
    let mut keys: Vec<_> = tracks.keys().copied().collect();
    keys.sort_unstable();
    for key in keys {
        let evs = tracks.get_mut(&key).expect("key from map");
        evs.sort_by(|a, b| a.ts_ns.cmp(&b.ts_ns).then(b.dur_ns.cmp(&a.dur_ns)));
        let lane_of = lanes(evs);
        let base = if key.1 == BLOCK_TRACK {
            "block I/O".to_string()
        } else {
            names
                .get(&key)
                .or_else(|| t.unlisted_names.get(&(key.0 as u32, key.1 as u32)))
                .cloned()
                .unwrap_or_else(|| format!("tid {}", key.1))
        };
        let used = lane_of.iter().copied().max().unwrap_or(0);
        for lane in 0..=used {
            let name = if lane == 0 {
                base.clone()
            } else {
                format!("{base} (overlap {lane})")
            };
            emit(json!({"ph": "M", "name": "thread_name", "pid": key.0,
                            "tid": key.1 + lane as u64 * LANE_STRIDE, "ts": 0,
                            "args": {"name": name}}))?;
        }
        for (ev, lane) in evs.iter().zip(lane_of) {
            emit(json!({
                "ph": "X", "name": ev.name, "cat": cat(ev.kind),
                "ts": us(ev.ts_ns), "dur": us(ev.dur_ns),
                "pid": key.0, "tid": key.1 + lane as u64 * LANE_STRIDE,
                "args": args(ev),
            }))?;
        }
    }
    for ev in instants {
        emit(
            json!({"ph": "i", "s": "t", "name": ev.name, "cat": cat(ev.kind),
                        "ts": us(ev.ts_ns), "pid": ev.pid, "tid": ev.tid, "args": args(ev)}),
        )?;
    }
    if !t.counters.is_empty() {
        emit(
            json!({"ph": "M", "name": "process_name", "pid": GPU_PID, "tid": 0, "ts": 0,
                        "args": {"name": "GPU (NVML)"}}),
        )?;
    }
    for c in &t.counters {
        let mut m = Map::new();
        for (k, v) in &c.values {
            m.insert(k.clone(), json!(v));
        }
        emit(
            json!({"ph": "C", "name": c.name, "ts": us(c.ts_ns), "pid": GPU_PID,
                        "tid": 0, "args": m}),
        )?;
    }
    if t.cut_events + t.cut_counters > 0 {
        emit(json!({"ph": "i", "s": "g", "name": format!(
            "timeline cut: {} events and {} counter samples over --timeline-limit {}",
            t.cut_events, t.cut_counters, t.limit), "ts": 0, "pid": GPU_PID, "tid": 0}))?;
    }
    Ok(())
}

pub fn write(t: &Timeline, r: &Report, out: &mut dyn Write) -> Result<()> {
    // Streamed: each event is serialized and dropped before the next is built.
    out.write_all(b"{\"traceEvents\":[")?;
    let mut first = true;
    events(t, r, &mut |v| {
        if !first {
            out.write_all(b",")?;
        }
        first = false;
        serde_json::to_writer(&mut *out, &v)?;
        Ok(())
    })?;
    let rest = json!({
        "displayTimeUnit": "ms",
        "otherData": {
            "tool": r.tool,
            "window_start_unix_ns": r.window.start_unix_ns,
            "events": t.events.len(),
            "counter_samples": t.counters.len(),
            "limit": t.limit,
            "cut_events": t.cut_events,
            "cut_counter_samples": t.cut_counters,
            "cuda_calls_below_threshold": t.cuda_calls_below_threshold,
        },
    });
    // The rest of the object after the array: `{"displayTimeUnit":...}` without its `{`.
    let rest = serde_json::to_string(&rest)?;
    out.write_all(b"],")?;
    out.write_all(&rest.as_bytes()[1..])?;
    writeln!(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn whole_numbers_are_numbers_and_the_rest_text() {
        assert_eq!(arg_value("4096"), Value::from(4096));
        assert_eq!(arg_value("-11"), Value::from(-11));
        assert_eq!(arg_value("0"), Value::from(0));
        assert_eq!(arg_value("9007199254740992"), Value::from(1u64 << 53));
        for text in [
            "9007199254740993",
            "18446744073709551615",
            "0x7f00",
            "64x2x1",
            "8:0",
            "007",
            "+5",
            "1.5",
            "",
            "-",
            "cudaSuccess",
        ] {
            assert_eq!(arg_value(text), Value::String(text.into()), "{text}");
        }
    }

    use super::*;
    use crate::report::{
        fixtures,
        timeline::{CounterSample, EventKind::*},
    };

    fn ev(ts: u64, dur: u64, pid: u32, tid: u32, kind: EventKind, name: &str) -> TimelineEvent {
        TimelineEvent {
            ts_ns: ts,
            dur_ns: dur,
            pid,
            tid,
            kind,
            name: name.into(),
            args: vec![("bytes".into(), "4096".into())],
        }
    }

    fn timeline() -> Timeline {
        let mut t = Timeline::with_limit(100);
        // A CUDA call containing an off-CPU wait; a syscall overlapping its end without
        // nesting; concurrent block I/O; an instant; NVML counters.
        t.push(ev(1_000, 10_000, 100, 100, Cuda, "cudaMemcpy"));
        t.push(ev(2_000, 5_000, 100, 100, OffCpu, "cuda_sync"));
        t.push(ev(9_000, 4_000, 100, 100, Syscall, "read"));
        t.push(ev(20_000, 1_000, 100, 101, Syscall, "write"));
        t.push(ev(0, 50_000, 100, 101, BlockIo, "read 4096"));
        t.push(ev(10_000, 50_000, 100, 101, BlockIo, "read 8192"));
        t.push(ev(5_000, 0, 100, 100, Instant, "exec"));
        for i in 0..3 {
            t.push_counter(CounterSample {
                ts_ns: i * 100_000,
                name: "gpu0".into(),
                values: vec![("util %".into(), 50.0 + i as f64)],
            });
        }
        t
    }

    /// Parses trace.json back and checks the trace-event rules Perfetto relies on.
    fn validate(text: &str) -> Vec<Value> {
        let doc: Value = serde_json::from_str(text).expect("trace.json is JSON");
        let evs = doc["traceEvents"]
            .as_array()
            .expect("traceEvents array")
            .clone();
        let mut tracks: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
        for e in &evs {
            for k in ["ph", "ts", "pid", "tid"] {
                assert!(e.get(k).is_some(), "event without {k}: {e}");
            }
            assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
            if e["ph"] == "X" {
                let dur = e["dur"].as_f64().expect("X has dur");
                assert!(dur >= 0.0, "negative dur: {e}");
                let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
                tracks
                    .entry(key)
                    .or_default()
                    .push((e["ts"].as_f64().unwrap(), dur));
            }
        }
        for (key, mut xs) in tracks {
            xs.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
            let mut open: Vec<f64> = Vec::new();
            for (ts, dur) in xs {
                while open.last().is_some_and(|&end| end <= ts + 1e-6) {
                    open.pop();
                }
                if let Some(&end) = open.last() {
                    assert!(ts + dur <= end + 1e-6, "overlap without nesting on {key:?}");
                }
                open.push(ts + dur);
            }
        }
        evs
    }

    #[test]
    fn trace_json_is_valid_and_complete() {
        let mut r = fixtures::data_loading_job();
        r.processes[0]
            .threads
            .push(fixtures::thread(101, "pt_pin", &[]));
        let mut buf = Vec::new();
        write(&timeline(), &r, &mut buf).unwrap();
        // A sample to check against docs/trace-event.schema.json, written only when asked.
        if let Some(path) = std::env::var_os("GPUTRACE_TRACE_SAMPLE") {
            std::fs::write(path, &buf).unwrap();
        }
        let evs = validate(std::str::from_utf8(&buf).unwrap());
        let xs: Vec<&Value> = evs.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(xs.len(), 6);
        let read = xs.iter().find(|e| e["name"] == "read").unwrap();
        assert_ne!(read["tid"], 100, "the overlapping syscall moved to a lane");
        let memcpy = xs.iter().find(|e| e["name"] == "cudaMemcpy").unwrap();
        assert_eq!(memcpy["tid"], 100);
        assert_eq!(memcpy["ts"], 1.0);
        assert_eq!(memcpy["dur"], 10.0);
        assert_eq!(memcpy["args"]["bytes"], 4096);
        assert_eq!(memcpy["cat"], "cuda");
        let blocks: Vec<_> = xs.iter().filter(|e| e["cat"] == "block_io").collect();
        assert_ne!(
            blocks[0]["tid"], blocks[1]["tid"],
            "concurrent requests on two lanes"
        );
        assert_eq!(evs.iter().filter(|e| e["ph"] == "C").count(), 3);
        assert!(evs.iter().any(|e| e["ph"] == "i" && e["name"] == "exec"));
        let names: Vec<&str> = evs
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"python") && names.contains(&"pt_pin"),
            "{names:?}"
        );
        assert!(names.contains(&"block I/O (overlap 1)"), "{names:?}");
    }

    #[test]
    fn cut_events_are_said() {
        let mut t = Timeline::with_limit(1);
        t.push(ev(0, 10, 1, 1, Syscall, "a"));
        t.push(ev(5, 10, 1, 1, Syscall, "b"));
        let mut buf = Vec::new();
        write(&t, &fixtures::report(), &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let evs = validate(&text);
        assert!(evs.iter().any(|e| e["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("timeline cut: 1 events"))));
        let doc: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["otherData"]["cut_events"], 1);
    }

    #[test]
    fn unlisted_threads_keep_their_names() {
        let mut t = Timeline::with_limit(10);
        t.push(ev(0, 10, 1, 77, Syscall, "read"));
        t.push(ev(0, 10, 1, 78, Syscall, "read"));
        t.unlisted_names.insert((1, 77), "worker-77".into());
        let mut buf = Vec::new();
        write(&t, &fixtures::report(), &mut buf).unwrap();
        let evs = validate(std::str::from_utf8(&buf).unwrap());
        let name = |tid: u64| {
            evs.iter()
                .find(|e| e["name"] == "thread_name" && e["tid"] == tid)
                .map(|e| e["args"]["name"].clone())
        };
        assert_eq!(name(77), Some(Value::from("worker-77")));
        assert_eq!(name(78), Some(Value::from("tid 78")));
    }

    #[test]
    fn lanes_nest_or_split() {
        let a = ev(0, 100, 1, 1, Cuda, "a");
        let b = ev(10, 20, 1, 1, Cuda, "b");
        let c = ev(90, 20, 1, 1, Cuda, "c");
        let d = ev(200, 5, 1, 1, Cuda, "d");
        assert_eq!(lanes(&[&a, &b, &c, &d]), vec![0, 0, 1, 0]);
    }
}
