//! Slots of the tail-call program arrays.
/// `sb_from_uplink6`, in [`super::names::TAIL_CALLS6`].
pub const FROM_UPLINK6: u32 = 0;
/// `sb_xdp_uplink6`, in [`super::names::XDP_TAIL_CALLS6`].
pub const XDP_UPLINK6: u32 = 0;
