//! CIDR blocks of either family, for `--nodeport-addresses` and
//! `loadBalancerSourceRanges`.
use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

/// `a.b.c.d/len` or `x:y::z/len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IpCidr {
    network: IpAddr,
    prefix_len: u8,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("{0:?} is not a CIDR (a.b.c.d/len or x:y::z/len)")]
    Syntax(String),
    #[error("{0:?}: the prefix length must be 0..=32 (IPv4) or 0..=128 (IPv6)")]
    PrefixLength(String),
}

/// The top `prefix_len` bits of a `bits`-bit address.
fn masked(addr: u128, bits: u32, prefix_len: u8) -> u128 {
    let keep = u32::from(prefix_len).min(bits);
    let mask = u128::MAX.checked_shl(bits - keep).unwrap_or(0) & (u128::MAX >> (128 - bits));
    addr & mask
}

impl IpCidr {
    /// The block of `prefix_len` bits at `addr` (host bits cleared);
    /// `None` when the length is past the family's bits.
    pub fn new(addr: IpAddr, prefix_len: u8) -> Option<IpCidr> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix_len <= max).then(|| {
            IpCidr {
                network: addr,
                prefix_len,
            }
            .canonical()
        })
    }

    /// The block's first address (host bits cleared).
    pub fn network(&self) -> IpAddr {
        match self.network {
            IpAddr::V4(a) => {
                IpAddr::V4(Ipv4Addr::from(
                    masked(u128::from(u32::from(a)), 32, self.prefix_len) as u32,
                ))
            }
            IpAddr::V6(a) => {
                IpAddr::V6(Ipv6Addr::from(masked(u128::from(a), 128, self.prefix_len)))
            }
        }
    }

    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    pub fn is_ipv4(&self) -> bool {
        self.network.is_ipv4()
    }

    /// The same block written with its host bits cleared (`10.1.2.3/8` is
    /// `10.0.0.0/8`), as Kubernetes reads a CIDR.
    pub fn canonical(self) -> IpCidr {
        IpCidr {
            network: self.network(),
            prefix_len: self.prefix_len,
        }
    }

    /// Whether `addr` lies in the block (never for the other family).
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.network, addr) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                masked(u128::from(u32::from(a)), 32, self.prefix_len)
                    == masked(u128::from(u32::from(net)), 32, self.prefix_len)
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                masked(u128::from(a), 128, self.prefix_len)
                    == masked(u128::from(net), 128, self.prefix_len)
            }
            _ => false,
        }
    }
}

impl FromStr for IpCidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (addr, len) = s
            .split_once('/')
            .ok_or_else(|| CidrError::Syntax(s.to_owned()))?;
        let network: IpAddr = addr.parse().map_err(|_| CidrError::Syntax(s.to_owned()))?;
        let prefix_len: u8 = len.parse().map_err(|_| CidrError::Syntax(s.to_owned()))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(CidrError::PrefixLength(s.to_owned()));
        }
        Ok(Self {
            network,
            prefix_len,
        })
    }
}

impl serde::Serialize for IpCidr {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl fmt::Display for IpCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    #[test]
    fn contains_by_prefix() {
        let c: IpCidr = "192.168.50.0/24".parse().expect("valid");
        assert!(c.contains(v4(192, 168, 50, 7)));
        assert!(!c.contains(v4(192, 168, 51, 7)));
        let all: IpCidr = "0.0.0.0/0".parse().expect("valid");
        assert!(all.contains(v4(10, 1, 2, 3)));
        assert!(
            !all.contains(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            "never the other family"
        );
        let host: IpCidr = "10.0.0.1/32".parse().expect("valid");
        assert!(host.contains(v4(10, 0, 0, 1)));
        assert!(!host.contains(v4(10, 0, 0, 2)));
    }

    #[test]
    fn ipv6_blocks() {
        let c: IpCidr = "fd00:1::/64".parse().expect("valid");
        assert!(c.contains("fd00:1::10".parse().unwrap()));
        assert!(c.contains("fd00:1:0:0:ffff::1".parse().unwrap()));
        assert!(!c.contains("fd00:1:0:1::10".parse().unwrap()));
        assert!(!c.contains(v4(10, 0, 0, 1)));
        let all: IpCidr = "::/0".parse().expect("valid");
        assert!(all.contains("2001:db8::1".parse().unwrap()));
        let host: IpCidr = "fd00::1/128".parse().expect("valid");
        assert!(host.contains("fd00::1".parse().unwrap()));
        assert!(!host.contains("fd00::2".parse().unwrap()));
    }

    #[test]
    fn canonical_clears_host_bits() {
        let c: IpCidr = "10.1.2.3/8".parse().expect("valid");
        assert_eq!(c.canonical().to_string(), "10.0.0.0/8");
        assert_eq!(c.network(), v4(10, 0, 0, 0));
        let c6: IpCidr = "fd00:1::5/64".parse().expect("valid");
        assert_eq!(c6.canonical().to_string(), "fd00:1::/64");
        assert_eq!(
            IpCidr::new(v4(1, 2, 3, 4), 0).map(|c| c.to_string()),
            Some("0.0.0.0/0".into())
        );
        assert_eq!(IpCidr::new(v4(1, 2, 3, 4), 33), None);
        assert_eq!(
            " 10.0.0.0/8 ".parse::<IpCidr>().map(|c| c.to_string()),
            Ok("10.0.0.0/8".into())
        );
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(
            "10.0.0.0".parse::<IpCidr>(),
            Err(CidrError::Syntax("10.0.0.0".into()))
        );
        assert_eq!(
            "10.0.0.0/33".parse::<IpCidr>(),
            Err(CidrError::PrefixLength("10.0.0.0/33".into()))
        );
        assert_eq!(
            "fd00::/129".parse::<IpCidr>(),
            Err(CidrError::PrefixLength("fd00::/129".into()))
        );
        assert!("fd00::/64".parse::<IpCidr>().is_ok());
    }
}
