//! Kernel names for the launches on the timeline: the timeline family records the launched
//! function's handle (`kernel` argument); the names are known here, from the same events that
//! name the report's kernels. Runs in this family's finish, after the timeline family's.

use std::collections::HashMap;

use super::{kernel_name, table, RawEvents};
use crate::{
    probes::FinishCtx,
    report::timeline::{EventKind, Timeline},
};

pub fn name_kernels(raw: &RawEvents, ctx: &mut FinishCtx<'_>, t: &mut Timeline) {
    let mut cache: HashMap<(u32, u32, u64), String> = HashMap::new();
    for ev in t.events.iter_mut().filter(|e| e.kind == EventKind::Cuda) {
        let Some(arg) = ev.args.iter_mut().find(|(k, _)| k == "kernel") else {
            continue;
        };
        let Some(func) = arg
            .1
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
        else {
            continue;
        };
        let Some(fid) = table::FUNCS.iter().position(|f| f.name == ev.name) else {
            continue;
        };
        let pid = ev.pid;
        let name = cache.entry((pid, fid as u32, func)).or_insert_with(|| {
            let (maps, alive) = match ctx.tracker.procs.get(&pid) {
                Some(p) => (p.maps.as_slice(), !p.info.exited),
                None => (&[][..], false),
            };
            kernel_name(raw, ctx.symbolizer, pid, maps, alive, fid as u32, func)
        });
        arg.1 = name.clone();
        ev.args.push(("handle".into(), format!("{func:#x}")));
    }
}
