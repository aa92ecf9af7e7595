//! One request to the kernel over NETLINK_ROUTE and its answer, for the
//! modules that read or change the kernel's routing state ([`crate::neigh`],
//! [`crate::policy`]): a fresh blocking socket per request in the calling
//! thread's network namespace, messages built and parsed by the
//! `netlink-packet-route` crate.
//!
//! Every request is bounded: the whole answer must arrive within
//! [`TIMEOUT`] (each receive waits at most what is left of it, through
//! `SO_RCVTIMEO`), and a dump may hold at most [`MAX_MESSAGES`] messages.

use std::io;
use std::time::{Duration, Instant};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr as NlAddr};

/// How long one request may wait for the kernel's whole answer.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(2);

/// The most messages a dump's answer may hold: far more than any routing
/// or neighbour table this code reads, and a bound on the memory an
/// answer takes.
pub(crate) const MAX_MESSAGES: usize = 1 << 20;

/// Why a request got no answer that could be read. The kernel's refusal
/// of the request itself is not one of these: it is the answer
/// ([`Answer`]'s error).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The socket could not be made, or sending or receiving failed (a
    /// receive that timed out included).
    #[error("{0}")]
    Io(#[source] io::Error),
    /// The kernel's answer did not parse, was empty, or was too long.
    #[error("the kernel's answer did not parse: {0}")]
    Decode(String),
}

/// The kernel's answer to a request: the messages it sent (one for a get,
/// all of them for a dump, none for a change acknowledged), or the error
/// it answered with (`NLMSG_ERROR` with a nonzero code, as its errno).
pub(crate) type Answer = Result<Vec<RouteNetlinkMessage>, io::Error>;

/// Sends `msg` with the header flags `flags` (`NLM_F_REQUEST` is added;
/// `NLM_F_DUMP` makes it a dump, read to its end; `NLM_F_ACK` makes a
/// change answer with an acknowledgement) and reads the answer.
pub(crate) fn request(msg: RouteNetlinkMessage, flags: u16) -> Result<Answer, Error> {
    let deadline = Instant::now() + TIMEOUT;
    let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(Error::Io)?;
    socket.bind_auto().map_err(Error::Io)?;
    socket.connect(&NlAddr::new(0, 0)).map_err(Error::Io)?;
    let mut header = NetlinkHeader::default();
    header.flags = netlink_packet_core::NLM_F_REQUEST | flags;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    socket.send(&buf, 0).map_err(Error::Io)?;
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no complete answer within {} ms", TIMEOUT.as_millis()),
            )));
        }
        rustix::net::sockopt::set_socket_timeout(
            &socket,
            rustix::net::sockopt::Timeout::Recv,
            Some(left),
        )
        .map_err(|e| Error::Io(e.into()))?;
        let (data, _) = socket.recv_from_full().map_err(Error::Io)?;
        if data.is_empty() {
            return Err(Error::Decode("an empty datagram".into()));
        }
        let mut off = 0;
        while off < data.len() {
            let m: NetlinkMessage<RouteNetlinkMessage> = NetlinkMessage::deserialize(&data[off..])
                .map_err(|e| Error::Decode(e.to_string()))?;
            let len = m.header.length as usize;
            match m.payload {
                NetlinkPayload::Done(_) => return Ok(Ok(out)),
                NetlinkPayload::Error(e) if e.code.is_some() => return Ok(Err(e.to_io())),
                // An acknowledgement: the change was made.
                NetlinkPayload::Error(_) => return Ok(Ok(out)),
                NetlinkPayload::InnerMessage(i) => {
                    if out.len() == MAX_MESSAGES {
                        return Err(Error::Decode(format!("more than {MAX_MESSAGES} messages")));
                    }
                    out.push(i);
                    if !dump {
                        return Ok(Ok(out));
                    }
                }
                _ => {}
            }
            if len == 0 {
                break;
            }
            // Messages in a datagram are 4-byte aligned.
            off += (len + 3) & !3;
        }
    }
}
