//! How the tc programs read the one field of the kernel's `struct sk_buff`
//! they need and `struct __sk_buff` does not show: `ip_summed`, the state of
//! the packet's checksum. With it a rewrite updates the L4 checksum itself
//! instead of calling `bpf_l4_csum_replace` once per changed field.
//!
//! The programs reach the field through the kfunc `bpf_cast_to_kern_ctx`
//! (Linux 6.2+; the verifier turns the call into one register move), then
//! load one byte of the `struct sk_buff` it returns. Neither the kfunc's BTF
//! id nor the field's offset is known when the object is built (aya 0.14
//! cannot emit a kfunc call, and the offset is the running kernel's), so the
//! object carries two markers in adjacent instructions, a helper call
//! `call CALL_MARKER` and a byte load `rX = *(u8 *)(r0 + LOAD_MARKER)`,
//! which the agent's loader patches before the object is loaded: into the
//! kfunc call and the field's byte, or (no BTF, an older kernel, a field it
//! cannot place) into `r0 = r1` and a harmless load, with the global
//! [`SUMMED_SHIFT`] telling the programs to take the helper instead.

/// The immediate of the marker call: no helper has this number.
pub const CALL_MARKER: i32 = 0x5b5b_0001;
/// The offset of the marker byte load.
pub const LOAD_MARKER: i16 = 0x5b01;
/// The read-only global that holds where `ip_summed` lies in the loaded
/// byte (its lowest bit), or [`SUMMED_UNKNOWN`].
pub const SUMMED_SHIFT: &str = "SB_SKB_SUMMED_SHIFT";
/// [`SUMMED_SHIFT`] when the loader could not patch the markers into the
/// kfunc: the programs update checksums through the helper.
pub const SUMMED_UNKNOWN: u32 = 0xff;

/// `ip_summed`'s values (include/linux/skbuff.h).
pub mod summed {
    /// No checksum help: the checksum field is complete (or absent).
    pub const NONE: u8 = 0;
    /// The device verified the checksum.
    pub const UNNECESSARY: u8 = 1;
    /// `skb->csum` holds the sum of the packet from `csum_start`.
    pub const COMPLETE: u8 = 2;
    /// The checksum field holds the pseudo-header sum; the device (or the
    /// kernel, in software) finishes it from `csum_start`.
    pub const PARTIAL: u8 = 3;
}
