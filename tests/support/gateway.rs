//! The gateway, in-process on port 0.

use std::net::SocketAddr;
use std::sync::Arc;

use idemgate::Gateway;
use idemgate::Server;
use idemgate::config::Config;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::client::Client;
use super::gateway_proc::Toml;

pub struct TestGateway {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub gateway: Arc<Gateway>,
    pub config: Config,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestGateway {
    pub async fn start(toml: &str) -> Self {
        let config = Config::from_toml(toml, "<test>").unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let server = Server::bind(&config).await.unwrap();
        let addr = server.local_addr();
        let admin = server.admin_addr();
        let gateway = server.gateway();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        Self { addr, admin, gateway, config, stop: Some(stop), task: Some(task) }
    }

    pub fn client(&self) -> Client {
        Client::new(self.addr)
    }

    pub fn admin_client(&self) -> Client {
        Client::new(self.admin.expect("admin listener configured"))
    }

    /// Triggers graceful shutdown and waits for it to finish.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

/// The store section for a backend.
#[derive(Clone)]
pub enum StoreKind {
    Redis(String),
    Memory,
}

impl StoreKind {
    pub fn toml(&self, prefix: &str) -> String {
        match self {
            Self::Redis(url) => {
                format!("backend = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\ntimeout = \"500ms\"")
            }
            Self::Memory => format!("backend = \"memory\"\nkey_prefix = \"{prefix}\""),
        }
    }
}

/// A config with an idempotent `POST /orders` route (extra policy lines in `policy`), a
/// fail-open twin at `POST /open-orders`, and a pass-through route for everything else.
pub fn config(store: &StoreKind, upstream: SocketAddr, policy: &str) -> String {
    let store = store.toml(&super::unique("t"));
    let open_orders = format!(
        "\n[[routes]]\nname = \"open-orders\"\nmethods = [\"POST\"]\npath = \"/open-orders\"\nupstream = \"app\"\n\n\
         [routes.idempotency]\non_store_error = \"fail-open\"\n{policy}\n"
    );
    Toml {
        server: "admin_token = \"test-admin-token-0123456789\"\nshutdown_grace = \"2s\"",
        store: &store,
        upstream_lines: "timeout = \"3s\"\nconnect_timeout = \"1s\"",
        policy,
        routes: open_orders,
        ..Toml::new(upstream)
    }
    .render()
}
