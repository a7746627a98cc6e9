//! The Kubernetes client of the controller: from `--kubeconfig` when given,
//! else from the in-cluster service account, else none at all (the webhook
//! can run without one; it then has no DeviceClass cache).

use std::path::Path;

use kube::Client;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

use crate::Error;

/// Builds the client. `kubeconfig` wins when set, and any problem with it is
/// an error. Without it, the in-cluster configuration is used when
/// `KUBERNETES_SERVICE_HOST` says we run in a pod (a broken in-cluster setup
/// is an error); outside a cluster the answer is `Ok(None)`.
///
/// Building a client does not contact the API server, so an unreachable
/// server is not an error here: watches retry with backoff later.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Option<Client>, Error> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
                path: path.to_owned(),
                source,
            })?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|source| Error::Kubeconfig {
                    path: path.to_owned(),
                    source,
                })?
        }
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            Config::incluster().map_err(Error::InCluster)?
        }
        None => return Ok(None),
    };
    Client::try_from(config).map(Some).map_err(Error::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_kubeconfig_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.yaml");
        let Err(err) = connect(Some(&path)).await else {
            panic!("no error")
        };
        let text = err.to_string();
        assert!(text.contains("nope.yaml"), "{text}");
    }

    #[tokio::test]
    async fn a_garbled_kubeconfig_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.yaml");
        std::fs::write(&path, "clusters: [unterminated").unwrap();
        let Err(err) = connect(Some(&path)).await else {
            panic!("no error")
        };
        assert!(matches!(err, Error::Kubeconfig { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_valid_kubeconfig_gives_a_client_without_contacting_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        // Port 9 (discard) on localhost: nothing is contacted while building.
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'http://127.0.0.1:9'}\n\
             users:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n\
             current-context: x\n",
        )
        .unwrap();
        let client = connect(Some(&path)).await.unwrap();
        assert!(client.is_some());
    }
}
