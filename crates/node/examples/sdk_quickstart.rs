//! Calling the state store from Rust with the official SDK crates (`azure_iot_operations_mqtt`,
//! `azure_iot_operations_protocol`, and `azure_iot_operations_services` with the `state_store`
//! feature): connect to the broker, SET a key with an expiry, GET it, DEL it. Start a cluster
//! first (`docker compose up`, or `cluster/local.sh up`), then:
//!
//! ```sh
//! cargo run --release -p statestore-node --example sdk_quickstart -- 127.0.0.1 1883
//! ```
//!
//! `crates/node/tests/examples.rs` runs it against a real cluster, so it keeps working.

use std::time::Duration;

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_mqtt::session::{Session, SessionOptionsBuilder};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_services::state_store::{self, SetOptions};

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let host = args.next().unwrap_or_else(|| "127.0.0.1".to_string());
    let port: u16 = args.next().map(|port| port.parse()).transpose()?.unwrap_or(1883);

    // One MQTT session per process; the client id must be unique on the broker.
    let settings = MqttConnectionSettingsBuilder::default()
        .client_id(format!("sdk-quickstart-{}", std::process::id()))
        .hostname(host)
        .tcp_port(port)
        .use_tls(false)
        .clean_start(true)
        .keep_alive(Duration::from_secs(10))
        .build()?;
    let session = Session::new(SessionOptionsBuilder::default().connection_settings(settings).build()?)?;
    let monitor = session.create_session_monitor();
    let store = state_store::Client::new(
        ApplicationContextBuilder::default().build()?,
        session.create_managed_client(),
        monitor.clone(),
        state_store::ClientOptionsBuilder::default().build()?,
    )?;
    let exit = session.create_exit_handle();
    let running = tokio::spawn(session.run());
    tokio::time::timeout(Duration::from_secs(10), monitor.connected()).await?;

    let key = b"quickstart/greeting".to_vec();
    let timeout = Duration::from_secs(10);
    let expires_in_a_minute = SetOptions { expires: Some(Duration::from_secs(60)), ..SetOptions::default() };
    let set = store.set(key.clone(), b"hello".to_vec(), timeout, None, expires_in_a_minute).await?;
    println!("SET applied: {}, version {:?}", set.response, set.version.map(|v| v.to_string()));
    let got = store.get(key.clone(), timeout).await?;
    println!("GET: {:?}", got.response.map(|value| String::from_utf8_lossy(&value).into_owned()));
    let deleted = store.del(key, None, timeout).await?;
    println!("DEL removed {} key", deleted.response);

    store.shutdown().await?;
    exit.try_exit()?;
    running.await??;
    Ok(())
}
