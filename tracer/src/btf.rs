//! The few facts about the running kernel's types that the raw tracepoint programs need: where
//! `task_struct.pid` lies and how many arguments a tracepoint passes. Read from the kernel's
//! own BTF (`/sys/kernel/btf/vmlinux`).
//!
//! aya parses BTF too, but keeps its type lookups private to the crate, and the one maintained
//! BTF crate (btf-rs) is LGPL; what is needed here is a walk over one table, so it is done here.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

/// One type of the table, with what the lookups below need.
struct Type {
    kind: u32,
    name: u32,
    /// The referenced type (typedef, pointer).
    target: u32,
    /// Struct members as (name, bit offset); function prototype parameters as (name, type).
    members: Vec<(u32, u32)>,
    /// Struct members' types, in `members`' order.
    member_types: Vec<u32>,
}

pub struct Btf {
    data: Vec<u8>,
    str_off: usize,
    str_len: usize,
    /// Indexed by type id; id 0 is `void`.
    types: Vec<Type>,
    by_name: HashMap<(u32, String), u32>,
}

impl Btf {
    /// The running kernel's types.
    pub fn kernel() -> Result<Btf> {
        let path = "/sys/kernel/btf/vmlinux";
        let data = std::fs::read(path).with_context(|| format!("read {path}"))?;
        Btf::parse(data).with_context(|| format!("parse {path}"))
    }

    pub fn parse(data: Vec<u8>) -> Result<Btf> {
        let u16_at = |o: usize| -> Result<u16> {
            Ok(u16::from_le_bytes(
                data.get(o..o + 2).context("truncated")?.try_into()?,
            ))
        };
        let u32_at = |o: usize| -> Result<u32> {
            Ok(u32::from_le_bytes(
                data.get(o..o + 4).context("truncated")?.try_into()?,
            ))
        };
        if u16_at(0)? != MAGIC {
            bail!("not little-endian BTF (bad magic)");
        }
        let hdr_len = u32_at(4)? as usize;
        let type_off = hdr_len + u32_at(8)? as usize;
        let type_len = u32_at(12)? as usize;
        let str_off = hdr_len + u32_at(16)? as usize;
        let str_len = u32_at(20)? as usize;
        if str_off + str_len > data.len() || type_off + type_len > data.len() {
            bail!("sections past the end of the data");
        }
        let mut types = vec![Type {
            kind: 0,
            name: 0,
            target: 0,
            members: Vec::new(),
            member_types: Vec::new(),
        }];
        let mut o = type_off;
        while o < type_off + type_len {
            let name = u32_at(o)?;
            let info = u32_at(o + 4)?;
            let size_or_type = u32_at(o + 8)?;
            o += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let bitfields = info >> 31 != 0;
            let mut members = Vec::new();
            let mut member_types = Vec::new();
            match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => o += 4,
                KIND_ARRAY => o += 12,
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = o + i * 12;
                        let off = u32_at(m + 8)?;
                        let bits = if bitfields { off & 0x00ff_ffff } else { off };
                        members.push((u32_at(m)?, bits));
                        member_types.push(u32_at(m + 4)?);
                    }
                    o += vlen * 12;
                }
                KIND_ENUM => {
                    // Enumerators as (name, value).
                    for i in 0..vlen {
                        let m = o + i * 8;
                        members.push((u32_at(m)?, u32_at(m + 4)?));
                    }
                    o += vlen * 8;
                }
                KIND_FUNC_PROTO => {
                    for i in 0..vlen {
                        let m = o + i * 8;
                        members.push((u32_at(m)?, u32_at(m + 4)?));
                    }
                    o += vlen * 8;
                }
                KIND_DATASEC | KIND_ENUM64 => o += vlen * 12,
                // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG: no more.
                _ => {}
            }
            types.push(Type {
                kind,
                name,
                target: size_or_type,
                members,
                member_types,
            });
        }
        let mut btf = Btf {
            data,
            str_off,
            str_len,
            types,
            by_name: HashMap::new(),
        };
        for id in 1..btf.types.len() {
            let t = &btf.types[id];
            if t.name != 0 && matches!(t.kind, KIND_STRUCT | KIND_TYPEDEF) {
                let name = btf.name(t.name).to_string();
                btf.by_name.entry((t.kind, name)).or_insert(id as u32);
            }
        }
        Ok(btf)
    }

    fn name(&self, off: u32) -> &str {
        let start = self.str_off + off as usize;
        let end = self.str_off + self.str_len;
        let Some(bytes) = self.data.get(start..end) else {
            return "";
        };
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        std::str::from_utf8(&bytes[..len]).unwrap_or("")
    }

    /// Byte offset of `strukt.field` (a direct member, or one of an unnamed struct or union
    /// member, as most of `mm_struct`'s are; not a bitfield).
    pub fn member_offset(&self, strukt: &str, field: &str) -> Result<u32> {
        let id = self
            .by_name
            .get(&(KIND_STRUCT, strukt.to_string()))
            .with_context(|| format!("no struct {strukt} in the kernel's BTF"))?;
        let bits = self
            .member_bits(*id, field, 0)
            .with_context(|| format!("no field {field} in struct {strukt}"))?;
        if bits % 8 != 0 {
            bail!("{strukt}.{field} is a bitfield");
        }
        Ok(bits / 8)
    }

    /// Bit offset of member `field` of struct or union `id`, looked for in its unnamed
    /// members too (nested up to a few deep).
    fn member_bits(&self, id: u32, field: &str, depth: u32) -> Option<u32> {
        let t = self.types.get(id as usize)?;
        if let Some((_, bits)) = t.members.iter().find(|(n, _)| self.name(*n) == field) {
            return Some(*bits);
        }
        if depth >= 4 {
            return None;
        }
        t.members
            .iter()
            .zip(&t.member_types)
            .filter(|((n, _), _)| *n == 0)
            .find_map(|((_, bits), &ty)| {
                let inner = self.unqualified(ty)?;
                let inner_kind = self.types.get(inner as usize)?.kind;
                if !matches!(inner_kind, KIND_STRUCT | KIND_UNION) {
                    return None;
                }
                Some(bits + self.member_bits(inner, field, depth + 1)?)
            })
    }

    /// Type `id` without its typedefs and qualifiers (volatile, const, restrict, type tags).
    fn unqualified(&self, mut id: u32) -> Option<u32> {
        const KIND_VOLATILE: u32 = 9;
        const KIND_CONST: u32 = 10;
        const KIND_RESTRICT: u32 = 11;
        const KIND_TYPE_TAG: u32 = 18;
        for _ in 0..8 {
            let t = self.types.get(id as usize)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.target
                }
                _ => return Some(id),
            }
        }
        None
    }

    /// The value of the enumerator `name` (of any enum; the kernel's enumerator names are
    /// unique, C wants them so).
    pub fn enum_value(&self, name: &str) -> Result<u32> {
        self.types
            .iter()
            .filter(|t| t.kind == KIND_ENUM)
            .flat_map(|t| t.members.iter())
            .find(|(n, _)| self.name(*n) == name)
            .map(|(_, v)| *v)
            .with_context(|| format!("no enumerator {name} in the kernel's BTF"))
    }

    /// How many arguments the raw tracepoint `name` passes (its `TP_PROTO`), from the
    /// `btf_trace_<name>` typedef: a pointer to a prototype whose first parameter is the
    /// tracepoint's private data, not an argument.
    pub fn raw_tracepoint_args(&self, name: &str) -> Result<usize> {
        let typedef = format!("btf_trace_{name}");
        let id = self
            .by_name
            .get(&(KIND_TYPEDEF, typedef.clone()))
            .with_context(|| format!("no {typedef} in the kernel's BTF"))?;
        let ptr = &self.types[self.types[*id as usize].target as usize];
        if ptr.kind != KIND_PTR {
            bail!("{typedef} is not a function pointer");
        }
        let proto = self
            .types
            .get(ptr.target as usize)
            .filter(|t| t.kind == KIND_FUNC_PROTO)
            .with_context(|| format!("{typedef} is not a function pointer"))?;
        Ok(proto.members.len().saturating_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table with `struct task { int a; int pid; }` and `typedef void (*btf_trace_x)(void *,
    /// int, int)`, laid out as the kernel writes it.
    fn tiny() -> Vec<u8> {
        let strings = b"\0task\0a\0pid\0int\0btf_trace_x\0op\0OP_READ\0OP_WRITE\0mm\0x\0auxv\0";
        let s = |name: &str| -> u32 {
            let pat = format!("\0{name}\0");
            strings
                .windows(pat.len())
                .position(|w| w == pat.as_bytes())
                .unwrap() as u32
                + 1
        };
        let mut t: Vec<u32> = Vec::new();
        // 1: int
        t.extend([s("int"), KIND_INT << 24, 4, 32]);
        // 2: struct task { a @0, pid @32 bits }
        t.extend([s("task"), (KIND_STRUCT << 24) | 2, 8]);
        t.extend([s("a"), 1, 0, s("pid"), 1, 32]);
        // 3: proto (void *, int, int); 4: pointer to it; 5: typedef
        t.extend([0, (KIND_FUNC_PROTO << 24) | 3, 0, 0, 0, 0, 1, 0, 1]);
        t.extend([0, KIND_PTR << 24, 3]);
        t.extend([s("btf_trace_x"), KIND_TYPEDEF << 24, 4]);
        // 6: enum op { OP_READ = 0, OP_WRITE = 7 }
        t.extend([s("op"), (KIND_ENUM << 24) | 2, 4]);
        t.extend([s("OP_READ"), 0, s("OP_WRITE"), 7]);
        // 7: struct mm { x @0, (unnamed, 8) @64 bits }; 8: struct { int auxv @32 bits }
        t.extend([s("mm"), (KIND_STRUCT << 24) | 2, 16]);
        t.extend([s("x"), 1, 0, 0, 8, 64]);
        t.extend([0, (KIND_STRUCT << 24) | 1, 8]);
        t.extend([s("auxv"), 1, 32]);
        let types: Vec<u8> = t.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut d = Vec::new();
        d.extend(MAGIC.to_le_bytes());
        d.extend([1u8, 0]);
        d.extend(24u32.to_le_bytes());
        d.extend(0u32.to_le_bytes());
        d.extend((types.len() as u32).to_le_bytes());
        d.extend((types.len() as u32).to_le_bytes());
        d.extend((strings.len() as u32).to_le_bytes());
        d.extend(types);
        d.extend(strings);
        d
    }

    #[test]
    fn finds_member_offsets_and_tracepoint_arity() {
        let b = Btf::parse(tiny()).unwrap();
        assert_eq!(b.member_offset("task", "pid").unwrap(), 4);
        assert_eq!(b.member_offset("task", "a").unwrap(), 0);
        assert!(b.member_offset("task", "tgid").is_err());
        assert!(b.member_offset("nope", "pid").is_err());
        assert_eq!(b.raw_tracepoint_args("x").unwrap(), 2);
        assert!(b.raw_tracepoint_args("y").is_err());
        assert_eq!(b.enum_value("OP_WRITE").unwrap(), 7);
        assert_eq!(b.enum_value("OP_READ").unwrap(), 0);
        assert!(b.enum_value("OP_FLUSH").is_err());
        // A member of an unnamed struct member is its container's, at the sum of both offsets.
        assert_eq!(b.member_offset("mm", "x").unwrap(), 0);
        assert_eq!(b.member_offset("mm", "auxv").unwrap(), 12);
        assert!(b.member_offset("mm", "pid").is_err());
    }

    #[test]
    fn rejects_what_is_not_btf() {
        assert!(Btf::parse(vec![0; 64]).is_err());
        let mut short = tiny();
        short.truncate(30);
        assert!(Btf::parse(short).is_err());
    }

    /// The running kernel's table, where there is one (every kernel gputrace supports has it).
    #[test]
    fn reads_the_running_kernel() {
        let b = match Btf::kernel() {
            Ok(b) => b,
            Err(e) => {
                assert!(std::env::var_os("CI").is_none(), "kernel BTF: {e:#}");
                eprintln!("SKIP: {e:#}");
                return;
            }
        };
        let pid = b.member_offset("task_struct", "pid").unwrap();
        let tgid = b.member_offset("task_struct", "tgid").unwrap();
        assert_eq!(tgid, pid + 4, "pid and tgid are neighbours in task_struct");
        // sched_switch(preempt, prev, next, prev_state) since 5.18; sched_wakeup(p).
        assert_eq!(b.raw_tracepoint_args("sched_switch").unwrap(), 4);
        assert_eq!(b.raw_tracepoint_args("sched_wakeup").unwrap(), 1);
        assert_eq!(b.raw_tracepoint_args("sys_enter").unwrap(), 2);
        // What the raw block programs read (accounting::raw_block_offsets).
        assert_eq!(b.raw_tracepoint_args("block_rq_complete").unwrap(), 3);
        assert_eq!(b.enum_value("REQ_OP_READ").unwrap(), 0);
        assert_eq!(b.enum_value("REQ_OP_WRITE").unwrap(), 1);
        assert!(b.member_offset("request", "start_time_ns").is_ok());
        // What sched_switch_btf reads instead of a sched_wakeup program
        // (accounting::sched_info_offsets), where the kernel has them: the scheduler's
        // delay accounting comes whole (CONFIG_SCHED_INFO), and the runqueue clock is found.
        if b.member_offset("task_struct", "sched_info").is_ok() {
            assert!(b.member_offset("sched_info", "last_queued").is_ok());
            assert!(b.member_offset("sched_info", "run_delay").is_ok());
        }
        assert!(b.member_offset("rq", "clock").is_ok());
        // Where an exec's new image lies (tracer_common::proc::ExecEvent): mm_struct's fields
        // sit in an unnamed struct.
        let auxv = b.member_offset("mm_struct", "saved_auxv").unwrap();
        let exe = b.member_offset("mm_struct", "exe_file").unwrap();
        assert!(auxv > 0 && exe > 0 && auxv != exe);
        assert!(b.member_offset("file", "f_inode").is_ok());
        assert!(b.member_offset("inode", "i_ino").is_ok());
    }
}
