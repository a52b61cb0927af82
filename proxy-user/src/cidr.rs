//! IPv4 CIDR blocks, for `--nodeport-addresses`.
use std::{fmt, net::Ipv4Addr, str::FromStr};

/// `a.b.c.d/len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Cidr {
    network: Ipv4Addr,
    prefix_len: u8,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("{0:?} is not an IPv4 CIDR (a.b.c.d/len)")]
    Syntax(String),
    #[error("{0:?}: the prefix length must be 0..=32")]
    PrefixLength(String),
}

impl Ipv4Cidr {
    fn mask(&self) -> u32 {
        u32::MAX.checked_shl(32 - u32::from(self.prefix_len)).unwrap_or(0)
    }

    /// Whether `addr` lies in the block.
    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & self.mask() == u32::from(self.network) & self.mask()
    }
}

impl FromStr for Ipv4Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, len) = s.split_once('/').ok_or_else(|| CidrError::Syntax(s.to_owned()))?;
        let network: Ipv4Addr = addr.parse().map_err(|_| CidrError::Syntax(s.to_owned()))?;
        let prefix_len: u8 = len.parse().map_err(|_| CidrError::Syntax(s.to_owned()))?;
        if prefix_len > 32 {
            return Err(CidrError::PrefixLength(s.to_owned()));
        }
        Ok(Self {
            network,
            prefix_len,
        })
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_by_prefix() {
        let c: Ipv4Cidr = "192.168.50.0/24".parse().expect("valid");
        assert!(c.contains(Ipv4Addr::new(192, 168, 50, 7)));
        assert!(!c.contains(Ipv4Addr::new(192, 168, 51, 7)));
        let all: Ipv4Cidr = "0.0.0.0/0".parse().expect("valid");
        assert!(all.contains(Ipv4Addr::new(10, 1, 2, 3)));
        let host: Ipv4Cidr = "10.0.0.1/32".parse().expect("valid");
        assert!(host.contains(Ipv4Addr::new(10, 0, 0, 1)));
        assert!(!host.contains(Ipv4Addr::new(10, 0, 0, 2)));
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(
            "10.0.0.0".parse::<Ipv4Cidr>(),
            Err(CidrError::Syntax("10.0.0.0".into()))
        );
        assert_eq!(
            "10.0.0.0/33".parse::<Ipv4Cidr>(),
            Err(CidrError::PrefixLength("10.0.0.0/33".into()))
        );
        assert!("fd00::/8".parse::<Ipv4Cidr>().is_err());
    }
}
