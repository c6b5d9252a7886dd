//! Clients of the official Azure IoT Operations SDK crates (`azure_iot_operations_mqtt`,
//! `_protocol`, `_services`), connected to a test broker over plain TCP.
//!
//! One [`SdkSession`] is one MQTT session with its own client id. Its `Session::run` loop runs in
//! a spawned task from [`SdkSession::connect`] until [`SdkSession::close`]. Build at most one
//! state store client per session ([`SdkSession::state_store`]): every state store client of a
//! session would subscribe to the same response topic.

use std::sync::Arc;
use std::time::Duration;

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_mqtt::session::{
    Session, SessionError, SessionExitHandle, SessionManagedClient, SessionMonitor, SessionOptionsBuilder,
};
use azure_iot_operations_protocol::application::{ApplicationContext, ApplicationContextBuilder};
use azure_iot_operations_services::leased_lock::{lease, lock};
use azure_iot_operations_services::state_store;

/// How long a session may take to connect, and to end once asked to.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// `name` with a random suffix. Client ids must be unique on a broker: a second connection with
/// the same id takes the session over.
pub fn unique_client_id(name: &str) -> String {
    format!("{name}-{:08x}", fastrand::u32(..))
}

/// Uppercase hex of `bytes`, as the state store spells client ids and keys in notification topics.
pub fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// The topic filter on which the state store notifies `client_id` about its observed keys.
pub fn notification_filter(client_id: &str) -> String {
    format!(
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/{}/command/notify/+",
        hex_upper(client_id.as_bytes())
    )
}

/// A connected SDK session and what the SDK clients are built from.
pub struct SdkSession {
    pub client_id: String,
    /// The session's MQTT client; clones share the connection.
    pub client: SessionManagedClient,
    pub monitor: SessionMonitor,
    /// The session's application context (one per session, as the SDK requires).
    pub context: ApplicationContext,
    pub exit: SessionExitHandle,
    /// The task running `Session::run`.
    pub run: tokio::task::JoinHandle<Result<(), SessionError>>,
}

impl SdkSession {
    /// Connects `client_id` to the broker on `127.0.0.1:port` (plain TCP, anonymous, clean
    /// start) and waits until the session is connected.
    pub async fn connect(port: u16, client_id: &str) -> SdkSession {
        let settings = MqttConnectionSettingsBuilder::default()
            .client_id(client_id)
            .hostname("127.0.0.1")
            .tcp_port(port)
            .use_tls(false)
            .clean_start(true)
            .keep_alive(Duration::from_secs(10))
            .build()
            .expect("valid MQTT connection settings");
        let options =
            SessionOptionsBuilder::default().connection_settings(settings).build().expect("valid session options");
        let session = Session::new(options).expect("a session for the connection settings");
        let client = session.create_managed_client();
        let monitor = session.create_session_monitor();
        let exit = session.create_exit_handle();
        let context = ApplicationContextBuilder::default().build().expect("a default application context");
        let run = tokio::spawn(session.run());
        tokio::time::timeout(SESSION_TIMEOUT, monitor.connected()).await.unwrap_or_else(|_| {
            panic!("expected SDK session {client_id} to connect to 127.0.0.1:{port} within {SESSION_TIMEOUT:?}")
        });
        SdkSession { client_id: client_id.to_string(), client, monitor, context, exit, run }
    }

    /// A state store client on this session, with notifications acknowledged automatically.
    pub fn state_store(&self) -> Arc<state_store::Client> {
        let options = state_store::ClientOptionsBuilder::default().build().expect("default state store options");
        let client = state_store::Client::new(self.context.clone(), self.client.clone(), self.monitor.clone(), options)
            .expect("a state store client");
        Arc::new(client)
    }

    /// Ends the session gracefully (DISCONNECT with session expiry 0) and waits for its run loop
    /// to return `Ok`.
    pub async fn close(self) {
        let id = self.client_id;
        self.exit.try_exit().unwrap_or_else(|e| panic!("expected SDK session {id} to be connected at exit: {e}"));
        match tokio::time::timeout(SESSION_TIMEOUT, self.run).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => panic!("expected SDK session {id} to end cleanly, it ended with: {e}"),
            Ok(Err(e)) => panic!("expected SDK session {id} to end cleanly, its task failed: {e}"),
            Err(_) => panic!("expected SDK session {id} to end within {SESSION_TIMEOUT:?} of its exit"),
        }
    }
}

/// A lease client for `lease` held under `holder` (the SDK expects the holder to be the client id).
pub fn lease_client(state_store: &Arc<state_store::Client>, lease: &str, holder: &str) -> lease::Client {
    lease::Client::new(state_store.clone(), lease.as_bytes().to_vec(), holder.as_bytes().to_vec())
        .expect("a lease client")
}

/// A lock client for `lock` held under `holder` (the SDK expects the holder to be the client id).
pub fn lock_client(state_store: &Arc<state_store::Client>, lock: &str, holder: &str) -> lock::Client {
    lock::Client::new(state_store.clone(), lock.as_bytes().to_vec(), holder.as_bytes().to_vec()).expect("a lock client")
}
