//! Ethernet II frames with an optional 802.1Q tag.

use crate::{ethertype, fail, read16, read_array, write16, Field, Reason, Result};

/// Where each field of an Ethernet II header (and its 802.1Q tag) lies.
pub mod field {
    use crate::Field;

    /// Destination MAC.
    pub const DESTINATION: Field = 0..6;
    /// Source MAC.
    pub const SOURCE: Field = 6..12;
    /// Ethertype of the payload, or [`crate::ethertype::VLAN`] (the tag
    /// protocol identifier) when an 802.1Q tag follows.
    pub const ETHERTYPE: Field = 12..14;
    /// Tag control information (priority, DEI, VLAN id) of a tagged frame.
    pub const VLAN_TCI: Field = 14..16;
    /// Ethertype of the payload of a tagged frame.
    pub const VLAN_ETHERTYPE: Field = 16..18;
}

/// Length of an untagged Ethernet header.
pub const HEADER_LEN: usize = field::ETHERTYPE.end;
/// Length of an 802.1Q tag.
pub const VLAN_TAG_LEN: usize = field::VLAN_ETHERTYPE.end - HEADER_LEN;

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
        let header_len = if read16(b, field::ETHERTYPE) == ethertype::VLAN {
            if b.len() < HEADER_LEN + VLAN_TAG_LEN {
                return fail(Reason::VlanTruncated);
            }
            HEADER_LEN + VLAN_TAG_LEN
        } else {
            HEADER_LEN
        };
        Ok(EthernetFrame { buf, header_len })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// Destination MAC.
    pub fn dst(&self) -> Mac {
        read_array(self.buf.as_ref(), field::DESTINATION)
    }

    /// Source MAC.
    pub fn src(&self) -> Mac {
        read_array(self.buf.as_ref(), field::SOURCE)
    }

    /// Whether the frame carries an 802.1Q tag.
    pub fn is_tagged(&self) -> bool {
        self.header_len > HEADER_LEN
    }

    /// The 802.1Q tag control information, if tagged.
    pub fn vlan_tci(&self) -> Option<u16> {
        self.is_tagged()
            .then(|| read16(self.buf.as_ref(), field::VLAN_TCI))
    }

    /// Where the payload's ethertype lies: after the tag, if any.
    fn ethertype_field(&self) -> Field {
        if self.is_tagged() {
            field::VLAN_ETHERTYPE
        } else {
            field::ETHERTYPE
        }
    }

    /// The ethertype of the payload (after any tag).
    pub fn ethertype(&self) -> u16 {
        read16(self.buf.as_ref(), self.ethertype_field())
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

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// A view for writing a header into `buf`, which must hold
    /// [`HEADER_LEN`] bytes, plus [`VLAN_TAG_LEN`] if `tagged`; for a tagged
    /// frame the tag protocol identifier is written here, since it decides
    /// where the other fields lie.
    fn new_for_emit(mut buf: T, tagged: bool) -> Self {
        let header_len = if tagged {
            write16(buf.as_mut(), field::ETHERTYPE, ethertype::VLAN);
            HEADER_LEN + VLAN_TAG_LEN
        } else {
            HEADER_LEN
        };
        EthernetFrame { buf, header_len }
    }

    /// Sets the destination MAC.
    pub fn set_dst(&mut self, mac: Mac) {
        self.buf.as_mut()[field::DESTINATION].copy_from_slice(&mac);
    }

    /// Sets the source MAC.
    pub fn set_src(&mut self, mac: Mac) {
        self.buf.as_mut()[field::SOURCE].copy_from_slice(&mac);
    }

    /// Sets the tag control information of a tagged frame. Returns false,
    /// and writes nothing, if the frame is untagged (adding a tag moves the
    /// payload, which a view in place cannot do).
    pub fn set_vlan_tci(&mut self, tci: u16) -> bool {
        if !self.is_tagged() {
            return false;
        }
        write16(self.buf.as_mut(), field::VLAN_TCI, tci);
        true
    }

    /// Sets the ethertype of the payload (after any tag).
    pub fn set_ethertype(&mut self, value: u16) {
        let f = self.ethertype_field();
        write16(self.buf.as_mut(), f, value);
    }

    /// The payload after the header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len;
        &mut self.buf.as_mut()[hl..]
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
        let mut f = EthernetFrame::new_for_emit(buf, self.vlan.is_some());
        f.set_dst(self.dst);
        f.set_src(self.src);
        if let Some(tci) = self.vlan {
            f.set_vlan_tci(tci);
        }
        f.set_ethertype(self.ethertype);
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
