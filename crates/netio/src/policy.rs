//! Policy routing: the kernel's rules that send packets carrying a socket
//! mark to a routing table of their own, and that table's default route
//! through one interface, as `ip rule add fwmark M lookup T priority P`
//! and `ip route replace default dev D table T` set them up, made here in
//! process over NETLINK_ROUTE ([`crate::rtnl`]: each request bounded in
//! time, each change acknowledged by the kernel or refused with its errno).
//!
//! Everything acts on the calling thread's network namespace and needs
//! CAP_NET_ADMIN there.

use std::io;

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::route::{
    RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::rtnl;

/// How many rules [`delete_all_rules`] removes at most: a bound on the
/// loop, far above the duplicates a few killed predecessors leave.
pub const MAX_STALE_RULES: usize = 64;

/// Why a rule or route could not be set up or removed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Talking to the kernel over NETLINK_ROUTE failed (the socket, or no
    /// answer in time).
    #[error("netlink ({what}): {source}")]
    Netlink {
        /// What was being asked.
        what: String,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// The kernel's answer did not parse.
    #[error("netlink ({what}): the kernel's answer did not parse: {detail}")]
    Decode {
        /// What was being asked.
        what: String,
        /// The parser's complaint.
        detail: String,
    },
    /// The kernel refused the change (an `NLMSG_ERROR` answer: e.g.
    /// "Operation not permitted" without CAP_NET_ADMIN, "No such device"
    /// for an interface that is gone).
    #[error("{what}: the kernel refused: {source}")]
    Refused {
        /// What was being asked.
        what: String,
        /// The kernel's errno.
        #[source]
        source: io::Error,
    },
    /// More than [`MAX_STALE_RULES`] matching rules were there: that many
    /// and one more were deleted, and more may be left.
    #[error("{what}: more than {MAX_STALE_RULES} such rules")]
    TooManyRules {
        /// The rule.
        what: String,
    },
}

impl Error {
    /// The system's answer, where there was one: match its
    /// [`io::Error::kind`] or [`io::Error::raw_os_error`].
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            Error::Netlink { source, .. } | Error::Refused { source, .. } => Some(source),
            Error::Decode { .. } | Error::TooManyRules { .. } => None,
        }
    }
}

/// An address family of the kernel's routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4 (`ip -4`).
    Ipv4,
    /// IPv6 (`ip -6`).
    Ipv6,
}

impl Family {
    fn kernel(self) -> AddressFamily {
        match self {
            Family::Ipv4 => AddressFamily::Inet,
            Family::Ipv6 => AddressFamily::Inet6,
        }
    }

    /// `ip`'s option for the family.
    pub fn ip_option(self) -> &'static str {
        match self {
            Family::Ipv4 => "-4",
            Family::Ipv6 => "-6",
        }
    }
}

/// A rule that sends packets carrying a firewall mark (`SO_MARK`) to a
/// routing table: `ip rule ... fwmark MARK lookup TABLE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MarkRule {
    /// The address family the rule is for.
    pub family: Family,
    /// The mark (matched whole: no mask).
    pub mark: u32,
    /// The routing table looked up.
    pub table: u32,
}

impl std::fmt::Display for MarkRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ip {} rule fwmark {:#x} lookup {}",
            self.family.ip_option(),
            self.mark,
            self.table
        )
    }
}

impl MarkRule {
    /// The rule as a message: `priority` where it is set (add), none where
    /// any rule of this mark and table matches (delete).
    fn message(&self, priority: Option<u32>) -> RuleMessage {
        let mut m = RuleMessage::default();
        m.header.family = self.family.kernel();
        m.header.action = RuleAction::ToTable;
        // A table above 255 does not fit the header's byte: it goes in
        // FRA_TABLE (which the kernel prefers in any case), the header's
        // left unspecified, as iproute2 does.
        m.header.table = u8::try_from(self.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
        m.attributes.push(RuleAttribute::FwMark(self.mark));
        m.attributes.push(RuleAttribute::Table(self.table));
        if let Some(p) = priority {
            m.attributes.push(RuleAttribute::Priority(p));
        }
        m
    }
}

/// Sends a change with an acknowledgement asked for; the kernel's refusal
/// as [`Error::Refused`].
fn change(what: impl Fn() -> String, msg: RouteNetlinkMessage, flags: u16) -> Result<(), Error> {
    rtnl::request(msg, NLM_F_ACK | flags)
        .map_err(|e| match e {
            rtnl::Error::Io(source) => Error::Netlink {
                what: what(),
                source,
            },
            rtnl::Error::Decode(detail) => Error::Decode {
                what: what(),
                detail,
            },
        })?
        .map_err(|source| Error::Refused {
            what: what(),
            source,
        })?;
    Ok(())
}

/// Adds `rule` at `priority` (`ip rule add ... priority P`). The kernel
/// refuses an exact duplicate (`EEXIST`): delete stale ones first
/// ([`delete_all_rules`]).
pub fn add_rule(rule: &MarkRule, priority: u32) -> Result<(), Error> {
    change(
        || format!("adding `{rule} priority {priority}`"),
        RouteNetlinkMessage::NewRule(rule.message(Some(priority))),
        NLM_F_CREATE | NLM_F_EXCL,
    )
}

/// Deletes one rule of this mark and table, at any priority (`ip rule del
/// fwmark M lookup T`): whether there was one.
pub fn delete_rule(rule: &MarkRule) -> Result<bool, Error> {
    match change(
        || format!("deleting `{rule}`"),
        RouteNetlinkMessage::DelRule(rule.message(None)),
        0,
    ) {
        Ok(()) => Ok(true),
        Err(Error::Refused { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Deletes every rule of this mark and table ([`delete_rule`] until none is
/// left, at most [`MAX_STALE_RULES`] of them): how many there were.
pub fn delete_all_rules(rule: &MarkRule) -> Result<usize, Error> {
    for deleted in 0..MAX_STALE_RULES {
        if !delete_rule(rule)? {
            return Ok(deleted);
        }
    }
    if delete_rule(rule)? {
        return Err(Error::TooManyRules {
            what: format!("deleting `{rule}`"),
        });
    }
    Ok(MAX_STALE_RULES)
}

/// Makes the default route of routing table `table` go out through
/// interface `ifindex`, on-link (`ip route replace default dev D table T`):
/// created, or replacing the one there.
pub fn replace_default_route(family: Family, table: u32, ifindex: u32) -> Result<(), Error> {
    let mut m = RouteMessage::default();
    m.header.address_family = family.kernel();
    m.header.destination_prefix_length = 0;
    m.header.table = u8::try_from(table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
    // As iproute2 writes a route through a device without a gateway:
    // made by the administrator ("boot"), of link scope in IPv4 (IPv6
    // routes are all of universe scope).
    m.header.protocol = RouteProtocol::Boot;
    m.header.scope = match family {
        Family::Ipv4 => RouteScope::Link,
        Family::Ipv6 => RouteScope::Universe,
    };
    m.header.kind = RouteType::Unicast;
    m.attributes.push(RouteAttribute::Table(table));
    m.attributes.push(RouteAttribute::Oif(ifindex));
    change(
        || {
            format!(
                "`ip {} route replace default dev #{ifindex} table {table}`",
                family.ip_option()
            )
        },
        RouteNetlinkMessage::NewRoute(m),
        NLM_F_CREATE | NLM_F_REPLACE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_name_themselves_as_ip_writes_them_and_carry_big_tables_in_an_attribute() {
        let r = MarkRule {
            family: Family::Ipv6,
            mark: 0x4650,
            table: 0x4650,
        };
        assert_eq!(r.to_string(), "ip -6 rule fwmark 0x4650 lookup 18000");
        let m = r.message(Some(1000));
        assert_eq!(m.header.table, RouteHeader::RT_TABLE_UNSPEC);
        assert_eq!(m.header.action, RuleAction::ToTable);
        for a in [
            RuleAttribute::FwMark(0x4650),
            RuleAttribute::Table(0x4650),
            RuleAttribute::Priority(1000),
        ] {
            assert!(m.attributes.contains(&a), "{a:?} in {m:?}");
        }
        let small = MarkRule { table: 100, ..r }.message(None);
        assert_eq!(small.header.table, 100);
        assert!(!small
            .attributes
            .iter()
            .any(|a| matches!(a, RuleAttribute::Priority(_))));
    }

    #[test]
    fn refusals_keep_the_kernels_errno() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<Error>();
        let e = Error::Refused {
            what: "adding a rule".into(),
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        assert_eq!(
            e.io_error().and_then(io::Error::raw_os_error),
            Some(libc::EPERM)
        );
        assert!(std::error::Error::source(&e).is_some());
    }
}
