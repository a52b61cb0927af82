//! The loader's half of reading `ip_summed` in the tc programs
//! ([`proxy_common::ip_summed`] tells the whole scheme): finding the kfunc
//! `bpf_cast_to_kern_ctx` and `struct sk_buff`'s `ip_summed` in the running
//! kernel's BTF, and patching the object's marker instructions with them
//! (or, where either is missing, into instructions the programs skip, with
//! the checksum helper doing the work) before aya loads it.
use std::{io, path::Path};

use object::{Object, ObjectSection, SectionKind};
use proxy_common::ip_summed::{CALL_MARKER, LOAD_MARKER, SUMMED_UNKNOWN};

use crate::dataplane::load::btf::{Btf, BtfError};

/// Where the running kernel describes itself.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
const KFUNC: &str = "bpf_cast_to_kern_ctx";

/// `BPF_JMP | BPF_CALL`, `BPF_LDX | BPF_MEM | BPF_B`, `BPF_ALU64 | BPF_MOV | BPF_X`.
const OP_CALL: u8 = 0x85;
const OP_LOAD_BYTE: u8 = 0x71;
const OP_MOV64_REG: u8 = 0xbf;
/// A call's source register when it calls a kfunc.
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;

/// Why the kfunc cannot be used (the programs then take the helper), or
/// why the object could not be patched.
#[derive(Debug, thiserror::Error)]
pub enum KctxError {
    #[error("cannot read the kernel's BTF at {VMLINUX_BTF}")]
    ReadBtf { source: io::Error },
    #[error("the kernel's BTF does not parse")]
    Btf { source: BtfError },
    #[error("the kernel has no kfunc {KFUNC} (Linux 6.2+)")]
    NoKfunc,
    #[error("the kernel's struct sk_buff has no member ip_summed")]
    NoField,
    #[error(
        "sk_buff.ip_summed lies at bit {offset}, {size} bits wide: not two bits inside one byte"
    )]
    Field { offset: u32, size: u32 },
    #[error("the eBPF object does not parse as ELF")]
    Elf { source: object::Error },
    #[error(
        "the marker call at byte {at} of section {section} is not followed by the marker load"
    )]
    Unpaired { section: String, at: u64 },
}

/// Where `ip_summed` is, and the kfunc that reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkbSummed {
    /// The kfunc's BTF type id in the kernel's BTF.
    pub kfunc_id: u32,
    /// The byte of `struct sk_buff` holding the field.
    pub byte: i16,
    /// The field's lowest bit in that byte.
    pub shift: u32,
}

impl SkbSummed {
    /// Finds both in the running kernel's BTF.
    pub fn of_running_kernel() -> Result<SkbSummed, KctxError> {
        let data = std::fs::read(Path::new(VMLINUX_BTF))
            .map_err(|source| KctxError::ReadBtf { source })?;
        SkbSummed::from_btf(&data)
    }

    /// Finds both in the BTF blob `data`.
    pub fn from_btf(data: &[u8]) -> Result<SkbSummed, KctxError> {
        let btf = Btf::parse(data).map_err(|source| KctxError::Btf { source })?;
        let kfunc_id = btf.func_id(KFUNC).ok_or(KctxError::NoKfunc)?;
        let bits = btf
            .member_bits("sk_buff", "ip_summed")
            .ok_or(KctxError::NoField)?;
        let (byte, shift) = (bits.offset / 8, bits.offset % 8);
        let fits = bits.size == 2 && shift + bits.size <= 8;
        match (fits, i16::try_from(byte)) {
            (true, Ok(byte)) => Ok(SkbSummed {
                kfunc_id,
                byte,
                shift,
            }),
            _ => Err(KctxError::Field {
                offset: bits.offset,
                size: bits.size,
            }),
        }
    }
}

/// How the loaded programs learn a packet's checksum state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Through the kfunc: checksums updated in place.
    Kfunc(SkbSummed),
    /// Not at all: checksums updated through `bpf_l4_csum_replace`.
    Helper,
}

/// [`Access::describe`] of the helper: also what `switchboard status` shows
/// for an agent that predates the in-place update.
pub const HELPER_DESCRIPTION: &str = "through bpf_l4_csum_replace";

impl Access {
    /// The kfunc where the running kernel has it, else the helper (saying
    /// why: every kernel before 6.2 lands here, and forwards as before).
    pub fn detect() -> Access {
        match SkbSummed::of_running_kernel() {
            Ok(found) => {
                tracing::debug!(?found, "L4 checksums updated in place");
                Access::Kfunc(found)
            }
            Err(error) => {
                tracing::info!(reason = %error, "L4 checksums through bpf_l4_csum_replace");
                Access::Helper
            }
        }
    }

    /// How the programs update L4 checksums, for `switchboard status`
    /// ([`HELPER_DESCRIPTION`] through the helper).
    pub fn describe(&self) -> String {
        match self {
            Access::Kfunc(_) => "in place (ip_summed through bpf_cast_to_kern_ctx)".to_owned(),
            Access::Helper => HELPER_DESCRIPTION.to_owned(),
        }
    }

    /// The value of the global `proxy_common::ip_summed::SUMMED_SHIFT`.
    pub fn shift(&self) -> u32 {
        match self {
            Access::Kfunc(found) => found.shift,
            Access::Helper => SUMMED_UNKNOWN,
        }
    }
}

/// An object's bytes with the markers patched, 8-aligned for the ELF
/// parser.
pub struct Patched {
    words: Vec<u64>,
    len: usize,
    /// How many marker pairs were patched.
    pub sites: usize,
}

impl Patched {
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

/// A copy of `object` with every marker pair in its code sections patched
/// for `access`.
pub fn patch(object: &[u8], access: &Access) -> Result<Patched, KctxError> {
    let mut words = vec![0u64; object.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..object.len()].copy_from_slice(object);
    let mut patched = Patched {
        words,
        len: object.len(),
        sites: 0,
    };
    let file = object::File::parse(object).map_err(|source| KctxError::Elf { source })?;
    let code: Vec<(String, u64, u64)> = file
        .sections()
        .filter(|s| s.kind() == SectionKind::Text)
        .filter_map(|s| {
            let (at, size) = s.file_range()?;
            Some((s.name().unwrap_or("?").to_owned(), at, size))
        })
        .collect();
    let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut patched.words)[..object.len()];
    for (section, at, size) in code {
        let Some(insns) = bytes.get_mut(at as usize..(at + size) as usize) else {
            continue;
        };
        patched.sites += patch_section(insns, access).map_err(|at| KctxError::Unpaired {
            section: section.clone(),
            at,
        })?;
    }
    Ok(patched)
}

/// Patches the marker pairs of one code section; `Err(at)`: a marker call
/// at byte `at` without its load.
fn patch_section(insns: &mut [u8], access: &Access) -> Result<usize, u64> {
    let mut sites = 0;
    let count = insns.len() / 8;
    for i in 0..count {
        let call = &insns[i * 8..i * 8 + 8];
        let is_marker = call[0] == OP_CALL
            && call[1] == 0
            && i32::from_le_bytes([call[4], call[5], call[6], call[7]]) == CALL_MARKER;
        if !is_marker {
            continue;
        }
        let load = insns.get((i + 1) * 8..(i + 2) * 8).ok_or((i * 8) as u64)?;
        let paired = load[0] == OP_LOAD_BYTE
            && load[1] & 0xf0 == 0
            && i16::from_le_bytes([load[2], load[3]]) == LOAD_MARKER;
        if !paired {
            return Err((i * 8) as u64);
        }
        let (call, load): ([u8; 8], i16) = match access {
            Access::Kfunc(found) => {
                let id = found.kfunc_id.to_le_bytes();
                (
                    [
                        OP_CALL,
                        BPF_PSEUDO_KFUNC_CALL << 4,
                        0,
                        0,
                        id[0],
                        id[1],
                        id[2],
                        id[3],
                    ],
                    found.byte,
                )
            }
            // r0 = r1 (the context), then a byte of its `len`: valid, and
            // never reached (the shift global says the helper).
            Access::Helper => ([OP_MOV64_REG, 1 << 4, 0, 0, 0, 0, 0, 0], 0),
        };
        insns[i * 8..i * 8 + 8].copy_from_slice(&call);
        insns[(i + 1) * 8 + 2..(i + 1) * 8 + 4].copy_from_slice(&load.to_le_bytes());
        sites += 1;
    }
    Ok(sites)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insn(code: u8, regs: u8, off: i16, imm: i32) -> [u8; 8] {
        let (o, i) = (off.to_le_bytes(), imm.to_le_bytes());
        [code, regs, o[0], o[1], i[0], i[1], i[2], i[3]]
    }

    fn section() -> Vec<u8> {
        [
            insn(0xb7, 0x01, 0, 7),
            insn(OP_CALL, 0, 0, CALL_MARKER),
            insn(OP_LOAD_BYTE, 0x02, LOAD_MARKER, 0),
            insn(0x95, 0, 0, 0),
        ]
        .concat()
    }

    #[test]
    fn a_marker_pair_becomes_the_kfunc_call_and_the_field_load() {
        let mut code = section();
        let found = SkbSummed {
            kfunc_id: 0x1234,
            byte: 130,
            shift: 5,
        };
        assert_eq!(patch_section(&mut code, &Access::Kfunc(found)), Ok(1));
        assert_eq!(&code[8..16], &insn(OP_CALL, 0x20, 0, 0x1234));
        assert_eq!(&code[16..24], &insn(OP_LOAD_BYTE, 0x02, 130, 0));
        assert_eq!(&code[..8], &insn(0xb7, 0x01, 0, 7), "other code stays");
    }

    #[test]
    fn without_the_kfunc_the_pair_becomes_a_move_and_a_context_load() {
        let mut code = section();
        assert_eq!(patch_section(&mut code, &Access::Helper), Ok(1));
        assert_eq!(&code[8..16], &insn(OP_MOV64_REG, 0x10, 0, 0));
        assert_eq!(&code[16..24], &insn(OP_LOAD_BYTE, 0x02, 0, 0));
        assert_eq!(Access::Helper.shift(), SUMMED_UNKNOWN);
    }

    #[test]
    fn a_marker_call_without_its_load_is_refused() {
        let mut code = section();
        code[16] = 0xb7;
        assert_eq!(patch_section(&mut code, &Access::Helper), Err(8));
    }

    /// The kernel these tests run on describes both (Linux 6.2+ with BTF).
    #[test]
    fn the_running_kernel_has_the_kfunc_and_the_field() {
        let found = SkbSummed::of_running_kernel().expect("kernel BTF");
        assert!(found.kfunc_id > 0);
        assert!(
            found.byte > 100,
            "ip_summed is past sk_buff's list heads: {found:?}"
        );
        assert!(found.shift <= 6);
    }
}
