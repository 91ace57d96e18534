//! The project's initiator, connected over the composed transports.

use iscsi_initiator::{Error, IscsiUrl, Session, SessionConfig};

/// A session to `url` with the settings the URL gives (login, digests, reconnect...).
pub async fn connect(url: &IscsiUrl) -> Result<Session, Error> {
    transports::connect_session(url, SessionConfig::from_url(url)).await
}
