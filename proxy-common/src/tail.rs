//! Slots of the tail-call program array.
/// `sb_rewrite`.
pub const REWRITE: u32 = 0;
/// `sb_from_pod6`, in [`super::names::TAIL_CALLS6`].
pub const FROM_POD6: u32 = 0;
/// `sb_to_pod6`, in [`super::names::TAIL_CALLS6`].
pub const TO_POD6: u32 = 1;
/// `sb_from_uplink6`, in [`super::names::TAIL_CALLS6`].
pub const FROM_UPLINK6: u32 = 2;
/// `sb_xdp_uplink6`, in [`super::names::XDP_TAIL_CALLS6`].
pub const XDP_UPLINK6: u32 = 0;
