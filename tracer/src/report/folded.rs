//! Brendan Gregg's folded stacks: `comm-pid/tid;frame;...;frame count`, root first.
//! Kernel frames carry the `_[k]` suffix that flame graph tools colour as kernel code.

use std::collections::BTreeMap;

use crate::aggregate::cpu::CpuProfile;
use crate::symbolize::Frame;

pub fn frame_label(f: &Frame) -> String {
    // `;` separates frames and a trailing number is read as the count: keep both out of names.
    let name = f.name.replace(';', ":");
    if f.kernel {
        format!("{name}_[k]")
    } else {
        name
    }
}

/// The root frame that names the thread and its process.
pub fn thread_label(comm: &str, pid: u32, tid: u32) -> String {
    format!("{}-{pid}/{tid}", comm.replace([';', ' '], "_"))
}

/// Folded lines, one per distinct stack, sorted.
pub fn lines(profile: &CpuProfile) -> Vec<String> {
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for s in &profile.samples {
        let mut line = thread_label(&s.comm, s.pid, s.tid);
        for f in &s.frames {
            line.push(';');
            line.push_str(&frame_label(f));
        }
        *merged.entry(line).or_default() += s.count;
    }
    merged
        .into_iter()
        .map(|(stack, n)| format!("{stack} {n}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::cpu::tests::s;

    #[test]
    fn folds() {
        let mut k = s(7, 8, &["main", "read"], 2);
        k.frames
            .push(Frame::kernel("vfs_read", Some("[kernel]".into())));
        let p = CpuProfile::from_samples(vec![s(7, 7, &["main", "spin;x"], 5), k]);
        assert_eq!(
            lines(&p),
            vec![
                "t7-7/7;main;spin:x 5".to_string(),
                "t8-7/8;main;read;vfs_read_[k] 2".to_string()
            ]
        );
    }
}
