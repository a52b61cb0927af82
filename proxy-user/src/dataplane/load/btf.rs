//! A reader of the few facts the loader needs from the running kernel's BTF
//! (`/sys/kernel/btf/vmlinux`): a function's type id, and where a member of
//! a struct lies, through its anonymous structs and unions. aya parses BTF
//! too, but does not expose member offsets.
//!
//! The format (Documentation/bpf/btf.rst): a header, then a type section of
//! records numbered from 1 (a 12-byte `btf_type` followed by kind-specific
//! data), then the string section they name into.
use std::borrow::Cow;

/// A BTF blob that did not parse.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("BTF header is not valid (magic, version or section bounds)")]
    Header,
    #[error("BTF type {id} runs past the type section")]
    Truncated { id: u32 },
    #[error("BTF type {id} has unknown kind {kind}")]
    UnknownKind { id: u32, kind: u32 },
}

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_FUNC: u32 = 12;

/// A member's place in its outermost struct, in bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberBits {
    pub offset: u32,
    /// The bitfield's width, or 0 for a whole member.
    pub size: u32,
}

/// A parsed BTF blob: the raw bytes and where each type record starts.
pub struct Btf<'a> {
    data: &'a [u8],
    strings: (usize, usize),
    /// Byte offset of type `id` at index `id - 1`.
    types: Vec<usize>,
}

/// One type record's fixed part.
#[derive(Clone, Copy)]
struct Record {
    name_off: u32,
    kind: u32,
    kind_flag: bool,
    vlen: usize,
    /// Where the kind-specific data starts.
    extra: usize,
}

impl<'a> Btf<'a> {
    /// Parses the header and indexes the type records (native byte order).
    pub fn parse(data: &'a [u8]) -> Result<Btf<'a>, BtfError> {
        let u32_at = |off: usize| read_u32(data, off).ok_or(BtfError::Header);
        let magic = data.get(..2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
        if magic != Some(MAGIC) || data.get(2) != Some(&1) {
            return Err(BtfError::Header);
        }
        let hdr_len = u32_at(4)? as usize;
        let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let types_at = hdr_len.checked_add(type_off).ok_or(BtfError::Header)?;
        let types_end = types_at.checked_add(type_len).ok_or(BtfError::Header)?;
        let strings_at = hdr_len.checked_add(str_off).ok_or(BtfError::Header)?;
        let strings_end = strings_at.checked_add(str_len).ok_or(BtfError::Header)?;
        if types_end > data.len() || strings_end > data.len() {
            return Err(BtfError::Header);
        }
        let mut btf = Btf {
            data,
            strings: (strings_at, strings_end),
            types: Vec::new(),
        };
        let mut at = types_at;
        while at < types_end {
            let id = btf.types.len() as u32 + 1;
            if at + 12 > types_end {
                return Err(BtfError::Truncated { id });
            }
            let record = btf.record_at(at).ok_or(BtfError::Truncated { id })?;
            let size = extra_size(record.kind, record.vlen).ok_or(BtfError::UnknownKind {
                id,
                kind: record.kind,
            })?;
            btf.types.push(at);
            at = record.extra + size;
            if at > types_end {
                return Err(BtfError::Truncated { id });
            }
        }
        Ok(btf)
    }

    /// The type id of the function (`BTF_KIND_FUNC`) named `name`.
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.find(KIND_FUNC, name)
    }

    /// Where member `member` of the struct named `strukt` lies, searched
    /// through its anonymous struct and union members.
    pub fn member_bits(&self, strukt: &str, member: &str) -> Option<MemberBits> {
        let id = self.find(KIND_STRUCT, strukt)?;
        self.member_in(id, member, 0, 0)
    }

    fn member_in(&self, id: u32, member: &str, base: u32, depth: u32) -> Option<MemberBits> {
        let record = self.record(id)?;
        if !matches!(record.kind, KIND_STRUCT | KIND_UNION) || depth > 8 {
            return None;
        }
        let mut anonymous = Vec::new();
        for i in 0..record.vlen {
            let at = record.extra + i * 12;
            let (name_off, type_id) = (read_u32(self.data, at)?, read_u32(self.data, at + 4)?);
            let raw = read_u32(self.data, at + 8)?;
            let (offset, size) = match record.kind_flag {
                true => (raw & 0x00ff_ffff, raw >> 24),
                false => (raw, 0),
            };
            if name_off == 0 {
                anonymous.push((type_id, base + offset));
            } else if self.string(name_off)? == member {
                return Some(MemberBits {
                    offset: base + offset,
                    size,
                });
            }
        }
        anonymous
            .into_iter()
            .find_map(|(type_id, at)| self.member_in(type_id, member, at, depth + 1))
    }

    fn find(&self, kind: u32, name: &str) -> Option<u32> {
        (1..=self.types.len() as u32).find(|&id| {
            self.record(id).is_some_and(|r| {
                r.kind == kind && self.string(r.name_off).is_some_and(|n| n == name)
            })
        })
    }

    fn record(&self, id: u32) -> Option<Record> {
        let at = *self.types.get(id.checked_sub(1)? as usize)?;
        self.record_at(at)
    }

    fn record_at(&self, at: usize) -> Option<Record> {
        let name_off = read_u32(self.data, at)?;
        let info = read_u32(self.data, at + 4)?;
        Some(Record {
            name_off,
            kind: (info >> 24) & 0x1f,
            kind_flag: info >> 31 != 0,
            vlen: (info & 0xffff) as usize,
            extra: at + 12,
        })
    }

    fn string(&self, off: u32) -> Option<Cow<'a, str>> {
        let (start, end) = self.strings;
        let from = start.checked_add(off as usize)?;
        let bytes = self.data.get(from..end)?;
        let len = bytes.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&bytes[..len]))
    }
}

/// The size of a kind's data after the fixed record.
fn extra_size(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
        2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
        // INT, VAR, DECL_TAG
        1 | 14 | 17 => 4,
        // ARRAY
        3 => 12,
        // STRUCT, UNION, DATASEC, ENUM64: 12 bytes per member
        4 | 5 | 15 | 19 => 12 * vlen,
        // ENUM, FUNC_PROTO: 8 per value or parameter
        6 | 13 => 8 * vlen,
        _ => return None,
    })
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    let bytes = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of `types` (each a record with its data) over `strings`.
    fn blob(types: &[Vec<u32>], strings: &[u8]) -> Vec<u8> {
        let words: Vec<u32> = types.iter().flatten().copied().collect();
        let type_len = (words.len() * 4) as u32;
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_ne_bytes());
        out.extend_from_slice(&[1, 0]);
        for word in [24, 0, type_len, type_len, strings.len() as u32] {
            out.extend_from_slice(&word.to_ne_bytes());
        }
        for word in words {
            out.extend_from_slice(&word.to_ne_bytes());
        }
        out.extend_from_slice(strings);
        out
    }

    fn info(kind: u32, kind_flag: bool, vlen: u32) -> u32 {
        kind << 24 | u32::from(kind_flag) << 31 | vlen
    }

    /// `struct outer { int a; union { struct { u8 x:3, flag:2; }; u8 y; }; }`
    /// with a function `f`, as the kernel's `sk_buff` nests `ip_summed`.
    fn sample() -> Vec<u8> {
        // Strings: 0 "", 1 "int", 5 "outer", 11 "a", 13 "x", 15 "flag",
        // 20 "y", 22 "f", 24 "u8".
        let strings = b"\0int\0outer\0a\0x\0flag\0y\0f\0u8\0";
        blob(
            &[
                // 1: int
                vec![1, info(1, false, 0), 4, 32],
                // 2: u8
                vec![24, info(1, false, 0), 1, 8],
                // 3: the anonymous struct of bitfields (offsets: size << 24 | bit)
                vec![
                    0,
                    info(KIND_STRUCT, true, 2),
                    1,
                    13,
                    2,
                    3 << 24,
                    15,
                    2,
                    2 << 24 | 3,
                ],
                // 4: the anonymous union
                vec![0, info(KIND_UNION, false, 2), 1, 0, 3, 0, 20, 2, 0],
                // 5: struct outer
                vec![5, info(KIND_STRUCT, false, 2), 8, 11, 1, 0, 0, 4, 32],
                // 6: a FUNC_PROTO with no parameters, 7: func f
                vec![0, info(13, false, 0), 1],
                vec![22, info(KIND_FUNC, false, 0), 6],
            ],
            strings,
        )
    }

    #[test]
    fn finds_a_bitfield_inside_anonymous_members() {
        let data = sample();
        let btf = Btf::parse(&data).expect("parses");
        assert_eq!(
            btf.member_bits("outer", "flag"),
            Some(MemberBits {
                offset: 35,
                size: 2
            })
        );
        assert_eq!(
            btf.member_bits("outer", "y"),
            Some(MemberBits {
                offset: 32,
                size: 0
            })
        );
        assert_eq!(btf.member_bits("outer", "missing"), None);
        assert_eq!(btf.member_bits("nothing", "a"), None);
    }

    #[test]
    fn finds_a_function_by_name_only_as_a_function() {
        let data = sample();
        let btf = Btf::parse(&data).expect("parses");
        assert_eq!(btf.func_id("f"), Some(7));
        assert_eq!(btf.func_id("outer"), None);
    }

    #[test]
    fn refuses_bad_headers_and_truncated_types() {
        assert!(matches!(Btf::parse(&[0; 24]), Err(BtfError::Header)));
        let mut data = sample();
        // Claim the function prototype (the last record but one) has a
        // parameter: the records after it no longer fit.
        let type_len = u32::from_ne_bytes([data[12], data[13], data[14], data[15]]);
        let proto = 24 + type_len as usize - 24;
        data[proto + 4] = 1;
        assert!(matches!(
            Btf::parse(&data),
            Err(BtfError::Truncated { id: 7 })
        ));
    }
}
