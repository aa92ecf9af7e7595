//! Routing QUIC by connection ID for `quic` VIPs (IETF QUIC-LB): a UDP
//! datagram's destination connection ID names a server ID
//! ([`quic_lb::Configs`]), and the server ID a backend of the VIP's pool.
//!
//! The order is the draft's (draft-ietf-quic-load-balancers-21, "Load
//! Balancer Forwarding"): a routable connection ID decides; anything else
//! ([`Miss`], counted by reason) falls back to the connection table and then
//! to the VIP's Maglev table on the 5-tuple, as any UDP flow. A client's
//! first packets carry a connection ID the client chose, so they take the
//! fallback; the backend the fallback picks then issues connection IDs with
//! its own server ID, and every later packet routes by them, from whatever
//! address the client moves to.

use rustc_hash::FxHashMap;

use crate::config::QuicConfError;

/// Why a datagram to a `quic` VIP does not route by its connection ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Miss {
    /// The payload is not a QUIC header (an empty datagram, a long header
    /// shorter than its lengths, a version 1 connection ID over 20 octets).
    NotQuic,
    /// Config rotation 0b111: the server had no configuration.
    Reserved,
    /// No configuration at the connection ID's codepoint.
    NoConfig,
    /// Too short for its configuration.
    TooShort,
    /// A long header's length disagrees with the self-described one.
    LengthMismatch,
    /// The server ID is no backend's of this VIP's pool.
    UnknownServerId,
}

impl Miss {
    /// Every reason, in counter order.
    pub const ALL: [Miss; 6] = [
        Miss::NotQuic,
        Miss::Reserved,
        Miss::NoConfig,
        Miss::TooShort,
        Miss::LengthMismatch,
        Miss::UnknownServerId,
    ];

    /// The counter's stable name.
    pub fn name(self) -> &'static str {
        match self {
            Miss::NotQuic => "not_quic",
            Miss::Reserved => "codepoint_reserved",
            Miss::NoConfig => "codepoint_unknown",
            Miss::TooShort => "cid_too_short",
            Miss::LengthMismatch => "cid_length_mismatch",
            Miss::UnknownServerId => "server_id_unknown",
        }
    }

    /// Its index in [`Miss::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl From<quic_lb::Unroutable> for Miss {
    fn from(u: quic_lb::Unroutable) -> Self {
        match u {
            quic_lb::Unroutable::Empty => Miss::NotQuic,
            quic_lb::Unroutable::Reserved => Miss::Reserved,
            quic_lb::Unroutable::NoConfig(_) => Miss::NoConfig,
            quic_lb::Unroutable::TooShort { .. } => Miss::TooShort,
            quic_lb::Unroutable::LengthMismatch { .. } => Miss::LengthMismatch,
        }
    }
}

/// What [`QuicRoute::read`] made of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// The backend the connection ID names (up or not), or why none.
    pub backend: Result<u32, Miss>,
    /// The codepoint and server ID read (as
    /// [`quic_lb::server_id_number`]), when the connection ID decoded (also
    /// when no backend has that server ID).
    pub server_id: Option<(u8, u128)>,
    /// Octets of the payload up to the end of its connection IDs: after
    /// the source connection ID of a long header, after the destination
    /// connection ID of a short one whose codepoint has a configuration
    /// (its length); none otherwise. A packet-tracer marker may follow.
    pub header_len: Option<usize>,
}

/// One `quic` VIP's routing: the configurations and its pool's server IDs.
#[derive(Debug, Clone)]
pub struct QuicRoute {
    /// Shared by every `quic` VIP of a configuration (their keys'
    /// schedules are computed once, when the configuration is applied).
    configs: std::sync::Arc<quic_lb::Configs>,
    /// Backend ids by their server IDs as [`quic_lb::server_id_number`]:
    /// a key of two words, read from the connection ID in registers.
    by_server_id: FxHashMap<u128, u32>,
    /// The server IDs as written, for the XDP loader and reports.
    ids: Vec<(quic_lb::ServerId, u32)>,
}

/// Why a VIP's QUIC routing cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum QuicRouteError {
    /// A configuration or its key.
    #[error(transparent)]
    Config(#[from] QuicConfError),
    /// A server ID that validation should have refused.
    #[error("backend {backend}: quic_server_id {id:?} is not a server ID")]
    ServerId {
        /// The backend's name.
        backend: String,
        /// As written.
        id: String,
    },
}

impl QuicRoute {
    /// Routing by `configs` to the backends whose server IDs (octets) are
    /// given with their backend ids.
    pub fn new(
        configs: std::sync::Arc<quic_lb::Configs>,
        server_ids: impl IntoIterator<Item = (quic_lb::ServerId, u32)>,
    ) -> Self {
        let ids: Vec<(quic_lb::ServerId, u32)> = server_ids.into_iter().collect();
        QuicRoute {
            configs,
            by_server_id: ids
                .iter()
                .map(|(s, b)| (quic_lb::server_id_number(s.as_bytes()), *b))
                .collect(),
            ids,
        }
    }

    /// The backend a UDP payload's destination connection ID names.
    #[inline]
    pub fn backend(&self, udp_payload: &[u8]) -> Result<u32, Miss> {
        self.read(udp_payload).backend
    }

    /// What a UDP payload's destination connection ID says: the backend or
    /// why none, and what a packet-tracer report shows of it.
    #[inline]
    pub fn read(&self, udp_payload: &[u8]) -> Read {
        let mut read = Read {
            backend: Err(Miss::NotQuic),
            server_id: None,
            header_len: None,
        };
        let Ok(header) = packet::quic::parse(udp_payload) else {
            return read;
        };
        let routed = match header {
            packet::quic::Header::Long { dcid, scid, .. } => {
                // First octet, version, two lengths, both IDs.
                read.header_len = Some(7 + dcid.len() + scid.len());
                self.configs.route_long_number(dcid)
            }
            packet::quic::Header::Short { after_flags } => {
                read.header_len = after_flags
                    .first()
                    .and_then(|c| self.configs.get(c >> 5))
                    .map(|c| 1 + c.cid_len());
                self.configs.route_short_number(after_flags)
            }
        };
        read.backend = match routed {
            Ok(id) => {
                read.server_id = Some(id);
                self.by_server_id
                    .get(&id.1)
                    .copied()
                    .ok_or(Miss::UnknownServerId)
            }
            Err(u) => Err(u.into()),
        };
        read
    }

    /// The QUIC-LB configurations it reads connection IDs by (the XDP
    /// program is given the plaintext ones).
    pub fn configs(&self) -> &quic_lb::Configs {
        &self.configs
    }

    /// Its server IDs and the backend id of each.
    pub fn server_ids(&self) -> impl Iterator<Item = (&quic_lb::ServerId, u32)> + '_ {
        self.ids.iter().map(|(s, b)| (s, *b))
    }

    /// How many server IDs it routes to.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether it routes to no server ID.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// A server ID written in hex (a backend's `quic_server_id`) as octets.
pub fn server_id(backend: &str, text: &str) -> Result<quic_lb::ServerId, QuicRouteError> {
    quic_lb::parse_hex(text)
        .ok()
        .and_then(|o| quic_lb::ServerId::new(&o))
        .ok_or_else(|| QuicRouteError::ServerId {
            backend: backend.to_string(),
            id: text.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> (QuicRoute, quic_lb::Config) {
        let conf = quic_lb::Config::new(1, 2, 6, Some([7; 16]), true).expect("valid");
        let mut set = quic_lb::Configs::new();
        set.insert(conf.clone()).expect("insert");
        let ids = [("0001", 10), ("0002", 11)].map(|(t, b)| (server_id("b", t).expect("hex"), b));
        (QuicRoute::new(std::sync::Arc::new(set), ids), conf)
    }

    #[test]
    fn short_and_long_headers_route_to_the_server_ids_backend() {
        let (r, conf) = route();
        let cid = conf.encode(&[0, 2], &[9; 6], 0).expect("encode");
        let mut short = vec![0x41];
        short.extend_from_slice(cid.as_bytes());
        short.extend_from_slice(b"protected payload");
        assert_eq!(r.backend(&short), Ok(11));
        let mut long = vec![0xc0, 0, 0, 0, 1, cid.as_bytes().len() as u8];
        long.extend_from_slice(cid.as_bytes());
        long.extend_from_slice(&[0, 0]);
        assert_eq!(r.backend(&long), Ok(11));
    }

    #[test]
    fn what_does_not_route_says_why() {
        let (r, conf) = route();
        let unknown = conf.encode(&[0, 9], &[9; 6], 0).expect("encode");
        let mut short = vec![0x41];
        short.extend_from_slice(unknown.as_bytes());
        assert_eq!(r.backend(&short), Err(Miss::UnknownServerId));
        assert_eq!(r.backend(&[]), Err(Miss::NotQuic));
        assert_eq!(r.backend(&[0xc0, 0, 0]), Err(Miss::NotQuic));
        // A client's Initial: a random 8-octet DCID at codepoint 0.
        let initial = [0xc3, 0, 0, 0, 1, 8, 0x03, 1, 2, 3, 4, 5, 6, 7, 0];
        assert_eq!(r.backend(&initial), Err(Miss::NoConfig));
        assert_eq!(
            r.backend(&[0x40, 0xe7, 1, 2, 3, 4, 5, 6, 7, 8]),
            Err(Miss::Reserved)
        );
        assert_eq!(r.backend(&[0x40, 0x27, 1, 2]), Err(Miss::TooShort));
        let mut long = vec![0xc0, 0, 0, 0, 1, 10];
        long.extend_from_slice(&[0x27; 10]);
        long.push(0);
        assert_eq!(r.backend(&long), Err(Miss::LengthMismatch));
        assert!(server_id("b", "0g").is_err() && server_id("b", "001").is_err());
    }
}
