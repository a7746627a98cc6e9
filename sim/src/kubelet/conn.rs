//! gRPC channels over Unix sockets, with the `:authority` a client chooses
//! (kubelet's grpc-go client sends `localhost`).

use std::path::Path;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::Error;

/// A channel to `socket` that connects on first use and sends `authority`.
pub(crate) fn channel(socket: &Path, authority: &str) -> Result<Channel, Error> {
    let endpoint = Endpoint::from_shared(format!("http://{authority}"))
        .map_err(|_| Error::InvalidAuthority(authority.to_owned()))?;
    let path = socket.to_owned();
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        })),
    )
}
