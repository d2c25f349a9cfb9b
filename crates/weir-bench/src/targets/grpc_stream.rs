//! A server's gRPC API over one bidirectional `AcquireStream` per client, one request in flight.

use tonic::transport::Channel;
use weir_api::grpc::weir_client::WeirClient;
use weir_api::grpc::{AcquireRequest, AcquireResponse};
use weir_api::http::AcquireBody;

use super::grpc::{self, Grpc};
use super::{Answer, Target};

/// A client's acquisition stream, opened on its first request.
pub struct GrpcStream {
    client: WeirClient<Channel>,
    open: Option<Box<OpenStream>>,
}

struct OpenStream {
    requests: tokio::sync::mpsc::Sender<AcquireRequest>,
    answers: tonic::Streaming<AcquireResponse>,
    next_id: u64,
}

/// A clone (the one a held lease's release task takes) has no stream: it releases unary.
impl Clone for GrpcStream {
    fn clone(&self) -> Self {
        GrpcStream {
            client: self.client.clone(),
            open: None,
        }
    }
}

impl GrpcStream {
    /// A client of the server at `base` (`http://host:port`); the stream opens on first use.
    pub async fn connect(base: &str) -> anyhow::Result<Self> {
        let Grpc(client) = Grpc::connect(base).await?;
        Ok(GrpcStream { client, open: None })
    }

    async fn open(&mut self) -> Result<&mut OpenStream, String> {
        if self.open.is_none() {
            let (requests, queued) = tokio::sync::mpsc::channel(16);
            let answers = self
                .client
                .acquire_stream(tokio_stream::wrappers::ReceiverStream::new(queued))
                .await
                .map_err(|status| format!("gRPC stream {:?}: {}", status.code(), status.message()))?
                .into_inner();
            self.open = Some(Box::new(OpenStream {
                requests,
                answers,
                next_id: 0,
            }));
        }
        Ok(self.open.as_mut().expect("opened above"))
    }
}

impl Target for GrpcStream {
    async fn acquire(&mut self, body: AcquireBody) -> Answer {
        let stream = self.open().await?;
        let id = stream.next_id;
        stream.next_id += 1;
        let answer = match stream.requests.send(grpc::request(body, id)).await {
            Ok(()) => stream.answers.message().await,
            Err(_) => Ok(None),
        };
        let failed = |why: String, open: &mut Option<Box<OpenStream>>| {
            *open = None;
            Err(why)
        };
        match answer {
            // One request in flight per client: the next answer is its answer.
            Ok(Some(answer)) if answer.id == id => grpc::answer(answer),
            Ok(Some(answer)) => failed(
                format!("gRPC stream answered {} to request {id}", answer.id),
                &mut self.open,
            ),
            Ok(None) => failed(
                "gRPC stream closed by the server".to_owned(),
                &mut self.open,
            ),
            Err(status) => failed(
                format!("gRPC stream {:?}: {}", status.code(), status.message()),
                &mut self.open,
            ),
        }
    }

    async fn release(&mut self, lease: String) {
        grpc::release(&mut self.client, lease).await;
    }
}
