//! The gRPC listener: Weir's API, Envoy's RLS (with rules) and RLQS, the cluster's own
//! services (in cluster mode) and grpc.health.v1, on one port.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use weir_api::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use weir_api::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use weir_cluster::rates::RateOwner;

use crate::app::App;
use crate::cluster::ClusterMode;
use crate::config::ConfigFile;
use crate::connections;
use crate::front_door::grpc::WeirService;
use crate::front_door::rlqs::RlqsService;
use crate::front_door::rls::{LiveRules, RlsService};
use crate::proto::weir_server::WeirServer;
use crate::tls::Tls;

/// grpc.health.v1 as proxies and orchestrators probe it, agreeing with `/readyz`: the server
/// ("") and each service SERVING while this node serves — in cluster mode once it has joined —
/// and NOT_SERVING from the stop signal on.
pub(super) struct GrpcHealth {
    reporter: HealthReporter,
    served: Vec<&'static str>,
    /// Waiting for the join, to say SERVING then.
    joining: Option<JoinHandle<()>>,
}

impl GrpcHealth {
    /// The statuses as they are at the start: SERVING, or NOT_SERVING until the join.
    pub(super) async fn start(cluster: Option<&Arc<ClusterMode>>, rls: bool) -> Self {
        let reporter = HealthReporter::new();
        let mut served = vec![
            <WeirServer<WeirService> as tonic::server::NamedService>::NAME,
            <RateLimitQuotaServiceServer<RlqsService> as tonic::server::NamedService>::NAME,
        ];
        if rls {
            served.push(<RateLimitServiceServer<RlsService> as tonic::server::NamedService>::NAME);
        }
        let unjoined = cluster.filter(|c| !c.has_joined());
        let status = match unjoined {
            Some(_) => ServingStatus::NotServing,
            None => ServingStatus::Serving,
        };
        for name in std::iter::once("").chain(served.iter().copied()) {
            reporter.set_service_status(name, status).await;
        }
        // Set after the statuses above, so that a join coming at once is not overwritten.
        let joining = unjoined.map(|cluster| {
            let cluster = Arc::clone(cluster);
            let reporter = reporter.clone();
            let served = served.clone();
            tokio::spawn(async move {
                cluster.joined().await;
                for name in std::iter::once("").chain(served) {
                    reporter
                        .set_service_status(name, ServingStatus::Serving)
                        .await;
                }
            })
        });
        Self {
            reporter,
            served,
            joining,
        }
    }

    /// The service answering probes.
    fn service(&self) -> HealthServer<HealthService> {
        HealthServer::new(HealthService::from_health_reporter(self.reporter.clone()))
    }

    /// NOT_SERVING everywhere, from the stop signal on.
    pub(super) async fn stop(mut self) {
        // A join still awaited must not say SERVING after the drain has begun: stopped, and
        // waited for, in case it was writing SERVING on another thread.
        if let Some(joining) = self.joining.take() {
            joining.abort();
            let _ = joining.await;
        }
        for name in std::iter::once("").chain(self.served.iter().copied()) {
            self.reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
    }
}

/// Serves every gRPC service of this node on `listener` until the drain.
pub(super) fn start(
    app: &Arc<App>,
    config: &ConfigFile,
    listener: TcpListener,
    health: &GrpcHealth,
    cluster: Option<&Arc<ClusterMode>>,
    rls: Option<Arc<LiveRules>>,
    tls: Option<Arc<Tls>>,
) -> JoinHandle<()> {
    let app = Arc::clone(app);
    let first_bytes_timeout = config.server.header_timeout;
    let max_pending = config.server.max_connections;
    let health_service = health.service();
    let owner_service = cluster.map(|c| c.service(Arc::clone(app.decider()) as Arc<dyn RateOwner>));
    let policy_log_service = cluster.map(|c| c.policy_log_service());
    // Offered only with rules: a proxy pointed at a node without them sees UNIMPLEMENTED
    // (an error it counts and reports), not a silent "OK" for everything.
    let rls_service =
        rls.map(|rules| RateLimitServiceServer::new(RlsService::new(Arc::clone(&app), rules)));
    // Always offered: a bucket id naming a `policy` and a `key` needs no rule.
    let rlqs_service = crate::front_door::rlqs::service(&app, config.rlqs.clone());
    tokio::spawn(async move {
        let router = connections::grpc_server()
            .add_service(health_service)
            .add_service(WeirServer::new(WeirService::new(Arc::clone(&app))))
            .add_optional_service(owner_service)
            .add_optional_service(policy_log_service)
            .add_optional_service(rls_service)
            .add_service(rlqs_service);
        let shutting_down = move || {
            let app = Arc::clone(&app);
            async move { app.health().shutting_down().await }
        };
        let bounds = (first_bytes_timeout, max_pending);
        connections::serve_grpc(
            router,
            listener,
            tls,
            bounds,
            shutting_down,
            "the gRPC listener",
        )
        .await;
    })
}
