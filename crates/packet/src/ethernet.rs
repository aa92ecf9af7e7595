//! Ethernet II frames with an optional 802.1Q tag.

use crate::{be16, ethertype, fail, put16, Reason, Result};

/// Length of an untagged Ethernet header.
pub const HEADER_LEN: usize = 14;
/// Length of an 802.1Q tag.
pub const VLAN_TAG_LEN: usize = 4;

/// A 6-byte MAC address.
pub type Mac = [u8; 6];

/// A checked view of an Ethernet frame.
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buf: T,
    header_len: usize,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Checks that the header (and tag, if any) fits.
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return fail(Reason::EthernetTruncated);
        }
        let header_len = if be16(b, 12) == ethertype::VLAN {
            if b.len() < HEADER_LEN + VLAN_TAG_LEN {
                return fail(Reason::VlanTruncated);
            }
            HEADER_LEN + VLAN_TAG_LEN
        } else {
            HEADER_LEN
        };
        Ok(EthernetFrame { buf, header_len })
    }

    /// Destination MAC.
    pub fn dst(&self) -> Mac {
        let mut m = [0; 6];
        m.copy_from_slice(&self.buf.as_ref()[0..6]);
        m
    }

    /// Source MAC.
    pub fn src(&self) -> Mac {
        let mut m = [0; 6];
        m.copy_from_slice(&self.buf.as_ref()[6..12]);
        m
    }

    /// The 802.1Q tag control information, if tagged.
    pub fn vlan_tci(&self) -> Option<u16> {
        (self.header_len > HEADER_LEN).then(|| be16(self.buf.as_ref(), 14))
    }

    /// The ethertype of the payload (after any tag).
    pub fn ethertype(&self) -> u16 {
        be16(self.buf.as_ref(), self.header_len - 2)
    }

    /// Header length including any tag.
    pub fn header_len(&self) -> usize {
        self.header_len
    }

    /// The payload after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[self.header_len..]
    }
}

/// A parsed Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Destination MAC.
    pub dst: Mac,
    /// Source MAC.
    pub src: Mac,
    /// 802.1Q tag control information, if tagged.
    pub vlan: Option<u16>,
    /// Payload ethertype.
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Reads the header of a checked frame.
    pub fn parse<T: AsRef<[u8]>>(f: &EthernetFrame<T>) -> Self {
        EthernetRepr {
            dst: f.dst(),
            src: f.src(),
            vlan: f.vlan_tci(),
            ethertype: f.ethertype(),
        }
    }

    /// Bytes [`EthernetRepr::emit`] writes.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + if self.vlan.is_some() { VLAN_TAG_LEN } else { 0 }
    }

    /// Writes the header at the start of `buf`, which must hold
    /// [`EthernetRepr::header_len`] bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0..6].copy_from_slice(&self.dst);
        buf[6..12].copy_from_slice(&self.src);
        match self.vlan {
            Some(tci) => {
                put16(buf, 12, ethertype::VLAN);
                put16(buf, 14, tci);
                put16(buf, 16, self.ethertype);
            }
            None => put16(buf, 12, self.ethertype),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_and_untagged() {
        let mut b = [0u8; 18];
        let r = EthernetRepr {
            dst: [1; 6],
            src: [2; 6],
            vlan: Some(0x0064),
            ethertype: ethertype::IPV6,
        };
        r.emit(&mut b);
        let f = EthernetFrame::new_checked(&b[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&f), r);
        assert_eq!(f.header_len(), 18);
        assert_eq!(
            EthernetFrame::new_checked(&b[..16]).unwrap_err().0,
            Reason::VlanTruncated
        );
        assert_eq!(
            EthernetFrame::new_checked(&b[..13]).unwrap_err().0,
            Reason::EthernetTruncated
        );
    }
}
