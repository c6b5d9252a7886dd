//! The MQTT user properties of requests, responses and notifications (PROTOCOL.md §3, §4).

/// The requesting client's MQTT client id.
pub const SOURCE_ID: &str = "__srcId";
/// A request's hybrid-logical-clock timestamp; a response's or notification's version.
pub const TIMESTAMP: &str = "__ts";
/// A write's fencing token.
pub const FENCING_TOKEN: &str = "__ft";
/// The protocol version a message speaks.
pub const PROTOCOL_VERSION: &str = "__protVer";
/// A response's HTTP-style status.
pub const STATUS: &str = "__stat";
/// A response's status message.
pub const STATUS_MESSAGE: &str = "__stMsg";
/// With a 505: the major protocol versions the server supports.
pub const SUPPORTED_MAJOR_VERSIONS: &str = "__supProtMajVer";
/// With a 505: the protocol version the request asked for.
pub const REQUESTED_PROTOCOL_VERSION: &str = "__requestProtVer";
