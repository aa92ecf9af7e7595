//! How long a peer may take: the attach protocols' deadlines, in one leaf
//! that the servers, the ports and the event loop all read.

use std::time::Duration;

/// How long a peer has, from connecting, to complete its protocol's
/// handshake (memif: `connect` acknowledged; the control socket: a request
/// for a port or the status; vhost-user: `SET_OWNER`, the message a
/// frontend claims the device with) before it is closed. Real clients take
/// milliseconds; the margin is for a loaded machine.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a connection that has not completed its handshake keeps its
/// place against a newcomer when the places are taken (memif's 64; a
/// vhost-user port's one). A real client's handshake takes milliseconds,
/// so a newcomer cannot take the place of one that is completing it; idle
/// connections give way to real clients well before the handshake
/// deadline.
pub const EVICTABLE_AFTER: Duration = Duration::from_secs(1);
